"""The built-in stories as an endless stream (xtrain.data.stream): windows laid out by lanes and
blocks, the same tokens with or without worker processes, bit-exact resume (also across world
sizes), held-out stories never trained on, no story used twice, and the prepared finite copies."""

import json
import os

import numpy as np
import pytest

from xtrain.data import (DataError, StreamLoader, default_dataset, is_stream_dir, open_dataset,
                         open_shard, open_stream, write_stream_copy)
from xtrain.data import stream as S
from xtrain.data.stories import tell

BATCH, SEQ, BLOCK = 3, 32, 4  # small blocks, so a few steps cross block boundaries


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(S, "VAL_TOKENS", 20_000)
        mp.setattr(S, "BPE_STORIES", 400)
        return open_stream(tmp_path_factory.mktemp("stream"), seed=3, workers=0, progress=False)


def _loader(stream, **kw):
    args = dict(batch=BATCH, seq=SEQ, seed=0, block_steps=BLOCK, workers=0)
    return StreamLoader(stream, **{**args, **kw})


def _batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for pa, pb in zip(a, b)
                                    for x, y in zip(pa, pb))


def test_stream_directory(stream):
    assert is_stream_dir(stream.path) and stream.meta["seed"] == 3
    assert stream.meta["counts"]["val_tokens"] >= 20_000
    header, tokens = open_shard(stream.shard_path("val"))
    assert header.fingerprint == stream.tokenizer.fingerprint and tokens[0] == stream.eot_id
    first = stream.tokenizer.decode(tokens[1:np.flatnonzero(tokens == stream.eot_id)[1]])
    assert first == tell("3:val:0").text()  # the held-out set is the val-keyed stories
    with pytest.raises(DataError, match="no train shard"):
        stream.shard_path("train")
    again = open_stream(stream.path, workers=0, progress=False)  # reused as it is
    assert again.meta == stream.meta and again.tokenizer.fingerprint == stream.tokenizer.fingerprint


def test_rows_are_consecutive_windows_of_lane_blocks(stream):
    batches = _batches(_loader(stream), 2 * BLOCK)
    for x, y in batches:
        assert x.shape == y.shape == (BATCH, SEQ) and x.dtype == np.int64
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
        assert int(x.max()) < stream.vocab_size
    for j in range(1, 2 * BLOCK):
        (_, y_prev), (x, _) = batches[j - 1], batches[j]
        # Within a block each row continues its lane; a new block starts a new story.
        if j % BLOCK:
            np.testing.assert_array_equal(x[:, 0], y_prev[:, -1])
        else:
            assert (x[:, 0] == stream.eot_id).all()
    lane0 = np.concatenate([batches[0][0][0]] + [y[0][-SEQ:] for _, y in batches[:BLOCK]])
    text = stream.tokenizer.decode(lane0)
    assert text.startswith("<|endoftext|>" + tell("3:t0:0:0:0").text()[:50])


def test_workers_do_not_change_the_stream(stream):
    ref = _batches(_loader(stream), 3 * BLOCK)
    with _loader(stream, workers=2) as loader:
        assert _same(_batches(loader, 3 * BLOCK), ref)
    assert not _same(_batches(_loader(stream, seed=1), 3 * BLOCK), ref)


def test_resume_is_bit_exact_and_ranks_split_the_global_batch(stream):
    n = 3 * BLOCK
    straight = _batches(_loader(stream), n)
    first = _loader(stream)
    half = _batches(first, n // 2 + 1)  # stops inside a block
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _loader(stream, seed=99)  # the state's seed wins: the stream the run was reading
    resumed.load_state_dict(state)
    assert _same(half + _batches(resumed, n - len(half)), straight)
    # Two ranks with batch B/2... here: one rank with batch 2B equals two ranks with batch B,
    # also when the ranks resume from the one-rank state.
    wide = _batches(_loader(stream, batch=2 * BATCH), n)
    ranks = [_loader(stream, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict({**_loader(stream, batch=2 * BATCH).state_dict(), "step": 2})
    for (x, y), (x0, y0), (x1, y1) in zip(wide[2:], *[_batches(r, n - 2) for r in ranks]):
        np.testing.assert_array_equal(x, np.concatenate([x0, x1]))
        np.testing.assert_array_equal(y, np.concatenate([y0, y1]))


def test_state_from_another_stream_or_geometry_is_refused(stream):
    state = _loader(stream).state_dict()
    for key, value in (("seq", SEQ * 2), ("global_batch", BATCH + 1), ("fingerprint", "0" * 32),
                       ("story_version", -1)):
        with pytest.raises(DataError, match=key):
            _loader(stream).load_state_dict({**state, key: value})
    with pytest.raises(DataError, match="not a version-1 stream state"):
        _loader(stream).load_state_dict({"version": 1, "step": 3, "n_tokens": 10})


def test_held_out_stories_are_skipped_and_no_story_repeats(stream, monkeypatch):
    path = str(stream.path)
    tok, held_out, dtype = S._stream_state(path)
    first, second = (tell(f"k:{m}").text() for m in range(2))
    expect = [stream.eot_id] + tok.encode(second)
    monkeypatch.setitem(S._WORKER_STATE, path, (tok, held_out | {S.text_digest(first)}, dtype))
    np.testing.assert_array_equal(S.lane_block(path, "k", len(expect)), expect)
    # Every story (or the start of one, at a block's end) read in three blocks of every lane is
    # a different one, and none is a held-out story.
    val_texts = {tell(f"3:val:{i}").text() for i in range(stream.meta["counts"]["val_docs"])}
    batches = _batches(_loader(stream, seq=128, block_steps=8), 24)
    rows = np.concatenate([x for x, _ in batches], axis=1)
    stories = []
    for row in rows:
        cuts = np.flatnonzero(row == stream.eot_id)
        stories += [tok.decode(row[a + 1:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    assert len(stories) > 20 and len(set(stories)) == len(stories)
    assert not val_texts & set(stories)


def test_workers_report_failures(stream):
    workers = S.StoryWorkers(1)
    try:
        good = workers.submit(S.flat_stories, str(stream.path), 3, 0, 2)
        bad = workers.submit(S.lane_block, str(stream.path / "missing"), "k", 10)
        ids, n = good.result()
        assert n == 2 and ids[0] == stream.eot_id
        with pytest.raises(DataError, match="story worker failed: DataError: no tokenizer"):
            bad.result()
    finally:
        workers.close()
    with pytest.raises(DataError, match="workers must be"):
        S.resolve_workers(-1)


def test_results_are_received_before_they_are_asked_for(stream):
    """A thread takes the workers' results off the pipe as they come: a block's lanes wait in the
    inbox (no receive and unpickle between two training steps), forgotten ones are dropped."""
    import time

    workers = S.StoryWorkers(2)
    try:
        wanted = [workers.submit(S.lane_block, str(stream.path), f"k:{i}", 500) for i in range(4)]
        dropped = workers.submit(S.lane_block, str(stream.path), "k:x", 500)
        dropped.cancel()
        deadline = time.monotonic() + 60
        while len(workers._inbox.done) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        with workers._inbox.ready:
            assert sorted(workers._inbox.done) == [w._id for w in wanted]
        for i, w in enumerate(wanted):
            assert np.array_equal(w.result(), S.lane_block(str(stream.path), f"k:{i}", 500))
        assert not workers._inbox.done
    finally:
        workers.close()


def test_stream_copy_is_a_prepared_dataset(stream, tmp_path):
    out = write_stream_copy(stream, tmp_path / "copy", 5000, workers=0, progress=False)
    ds = open_dataset(out)
    train = np.asarray(open_shard(ds.shard_path("train"))[1])
    assert ds.tokenizer.fingerprint == stream.tokenizer.fingerprint
    assert ds.meta["counts"]["train_tokens"] == len(train) >= 5000
    assert (ds.shard_path("val").read_bytes() == stream.shard_path("val").read_bytes())
    cuts = np.flatnonzero(train == ds.eot_id)
    assert cuts[0] == 0 and len(cuts) == ds.meta["counts"]["train_docs"]
    assert cuts[-1] < 5000  # whole stories: the last one starts before the count, crosses it
    assert ds.tokenizer.decode(train[1:cuts[1]]) == tell("3:0").text()
    stamp = (out / "train.bin").stat().st_mtime_ns
    assert write_stream_copy(stream, out, 5000, workers=0, progress=False) == out
    assert (out / "train.bin").stat().st_mtime_ns == stamp  # reused


def test_default_dataset_is_a_copy_of_the_stream(tmp_path, monkeypatch):
    for name, value in (("VAL_TOKENS", 5000), ("BPE_STORIES", 200), ("DEFAULT_COPY_TOKENS", 8000)):
        monkeypatch.setattr(S, name, value)
    monkeypatch.setenv("XTRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "stories-v1-seed0-5000000.txt").write_text("old corpus")
    path = default_dataset(progress=False)
    assert path == tmp_path / "cache" and not list(path.glob("stories-v*.txt"))
    ds = open_dataset(path)
    assert ds.meta["counts"]["train_tokens"] >= 8000
    assert is_stream_dir(path / "stream")
    stream = open_stream(path / "stream", progress=False)
    assert ds.tokenizer.fingerprint == stream.tokenizer.fingerprint
    stamp = (path / "train.bin").stat().st_mtime_ns
    assert default_dataset(progress=False) == path
    assert (path / "train.bin").stat().st_mtime_ns == stamp


def test_training_on_the_stream_resumes_bit_exactly(stream, tmp_path):
    from xtrain.trainer.train import TrainConfig, train

    def run(out, steps, **kw):
        cfg = TrainConfig(preset="tiny", data=str(stream.path), out=str(out), device="cpu",
                          batch=2, seq=32, steps=steps, decay_steps=6, lr=3e-3, warmup=1,
                          eval_every=3, eval_batches=2, save_every=0, sample_tokens=4,
                          progress=False, **kw)
        return train(cfg)

    def losses(out):
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records]

    run(tmp_path / "straight", 6)
    run(tmp_path / "split", 3)
    summary = run(tmp_path / "split", 6, resume=str(tmp_path / "split" / "ckpt"))
    assert summary["steps"] == 6 and losses(tmp_path / "split") == losses(tmp_path / "straight")
    state = json.loads((tmp_path / "split" / "ckpt" / "state.json").read_text())
    assert state["data"]["kind"] == "stream" and state["data"]["step"] == 6


def test_cli_trains_the_machine_default(monkeypatch, tmp_path):
    import xtrain.trainer.train
    from xtrain.trainer import cli

    monkeypatch.chdir(tmp_path)  # the default --out is relative: no run of the caller's in the way
    seen = []
    monkeypatch.setattr(xtrain.trainer.train, "train", seen.append)
    for device, preset, bf16, batch in (("cpu", "tiny", False, 16), ("cuda:0", "dim768", True, 32)):
        monkeypatch.setattr(xtrain.trainer.train, "resolve_device", lambda d, device=device: device)
        assert cli.main(["train"]) == 0
        cfg = seen.pop()
        assert (cfg.preset, cfg.bf16, cfg.batch, cfg.data, cfg.out) == \
            (preset, bf16, batch, None, f"runs/{preset}-stories")
        assert (cfg.seq, cfg.steps, cfg.eval_every) == tuple(
            xtrain.trainer.runconfig.MACHINE_DEFAULTS["cuda" if bf16 else "cpu"][k]
            for k in ("seq", "steps", "eval_every"))
    assert cli.main(["train", "--fp32", "--batch", "4", "--preset", "dim384"]) == 0  # on "cuda"
    cfg = seen.pop()
    assert (cfg.preset, cfg.bf16, cfg.batch, cfg.seq) == ("dim384", False, 4, 256)


def test_inline_stories_give_the_tokenizer_one_thread(monkeypatch):
    # Without workers the stories are tokenized in the training process: the tokenizer's thread
    # pool gets one thread (docs/cpu.md), unless the user chose a count.
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    S.StoryWorkers(2)
    assert "RAYON_NUM_THREADS" not in os.environ
    S.StoryWorkers(0)
    assert os.environ["RAYON_NUM_THREADS"] == "1"
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    S.StoryWorkers(0)
    assert os.environ["RAYON_NUM_THREADS"] == "3"
