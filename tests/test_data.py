"""Tests for xtrain.data: story generator, readers, tokenizers, shards, prepare, loader."""

import json
import re
import sys

import numpy as np
import pytest

from xtrain.data import (DataError, TokenLoader, dtype_for_vocab,
                         generate_stories, gpt2_tokenizer, iter_documents, load_tokenizer,
                         open_dataset, open_shard, prepare, read_header, read_meta, train_bpe,
                         write_corpus, write_shard)
from xtrain.data import readers, shards
from tokhelp import ByteEncoding

FP = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "stories.txt"
    return write_corpus(path, 120_000, seed=3)


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    prepare(corpus, out, vocab_size=600, val_fraction=0.1, seed=1, progress=False)
    return out


# ---------------------------------------------------------------- story generator


def test_stories_deterministic():
    a = generate_stories(40, seed=5)
    assert a == generate_stories(40, seed=5)
    assert a[:10] == generate_stories(10, seed=5)  # any prefix is the same corpus
    assert a != generate_stories(40, seed=6)


def test_stories_varied_and_grammatical():
    batch = generate_stories(400, seed=0)
    text = "\n".join(batch)
    assert len(set(batch)) == len(batch)
    assert len({s.split(".")[0] for s in batch}) > 150  # many different openings
    assert len(set(re.findall(r"[A-Za-z']+", text))) > 600
    names = {m for m in re.findall(r"named ([A-Z]\w+)", text)}
    assert len(names) > 40
    for needle in ("stuck", "share", "afraid", "broke", "rain", "race", "birthday", "bite"):
        assert needle in text, needle  # the different plots all occur
    assert not re.search(r"\ba [aeiouAEIOU]", text)  # a/an agreement
    assert not re.search(r"\ban [^aeiouAEIOU\s]", text)
    assert not re.search(r"[{}]|  | [,.!?]", text)  # no unfilled slots, stray spaces
    assert not re.search(r"[.!?] [a-z]", text)  # sentences start with a capital
    for s in batch:
        assert s[0].isupper() and s[-1] in '.!"'
        assert s.count('"') % 2 == 0  # dialogue quotes are balanced
    assert sum('"' in s for s in batch) > 0.9 * len(batch)


def test_stories_recall_what_they_set_up():
    from xtrain.data.stories import tell

    tales = [tell(f"9:{i}") for i in range(600)]
    texts = [t.text() for t in tales]
    assert all(t.isascii() for t in texts)
    # The wearable the opening names comes back in the last sentence.
    wear = [(m.group(1), t) for t in texts
            if (m := re.search(r"(?:wore|without|wear was) (?:his|her) ([a-z]+ [a-z]+)\.", t))]
    assert len(wear) > 100 and sum(t.endswith(f"{w} close by.") or f" {w} " in t.split(".")[-2]
                                   for w, t in wear) > 0.6 * len(wear)
    # Two-episode stories end by recalling both episodes.
    assert sum(t.count("\n\n") > 6 and ("about" in t.split("\n\n")[-1]) for t in texts) > 60
    # A day trip packs a list and unpacks it in the same order.
    trips = [t for t in texts if "back in" in t and "packed" in t]
    assert trips
    for t in trips:
        packed = re.search(r"(?:bag with|went|put) ((?:an? [a-z ]+?)(?:, an? [a-z ]+?)* and "
                           r"an? [a-z ]+?)(?: in (?:his|her) bag)?\.", t)
        back = re.search(r"packed (the [a-z ,]+) back in|put (the [a-z ,]+) back in", t)
        assert packed and back, t
        names = [w.split(" ", 1)[1] for w in re.split(r", | and ", packed.group(1))]
        assert [w.split(" ", 1)[1] for w in re.split(r", | and ", back.group(1) or back.group(2))] \
            == names, t
    # Counting stories add up: had - lost + given = total.
    numbers = {w: i for i, w in enumerate(("zero one two three four five six seven eight nine "
                                           "ten eleven twelve").split())}
    sums = 0
    for t in texts:
        m = re.search(r"only ([a-z]+) [a-z]+.*?gave [A-Z]\w+ ([a-z]+) more [a-z]+.*?"
                      r"(?:Now [A-Z]\w+ had|Now there were) ([a-z]+) ", t, re.S)
        if m:
            left, given, total = (numbers[g] for g in m.groups())
            assert left + given == total, t
            sums += 1
    assert sums > 10


def test_story_entropy_is_counted():
    from xtrain.data.stories import tell

    a, b = tell("0:1"), tell("0:1")
    assert a.text() == b.text() and a.nats == b.nats > 20  # every choice costs nats
    one_plot = tell("0:2")
    assert 0 < one_plot.nats < 1000


def test_write_corpus_is_tinystories_format(tmp_path):
    path = write_corpus(tmp_path / "c.txt", 30_000, seed=2)
    raw = path.read_text()
    assert len(raw.encode()) >= 30_000 and "\n<|endoftext|>\n" in raw
    docs = list(iter_documents(path))
    assert docs == generate_stories(len(docs), seed=2)


# ---------------------------------------------------------------- readers


def test_txt_reader_blank_lines(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("First doc\nline two\n\n\n  \nSecond doc\n\nThird\n")
    assert list(iter_documents(p)) == ["First doc\nline two", "Second doc", "Third"]


def test_txt_reader_endoftext_across_chunks(tmp_path, monkeypatch):
    docs = [f"Story number {i}.\n\nIt has two paragraphs." for i in range(50)]
    p = tmp_path / "ts.txt"
    p.write_text("\n<|endoftext|>\n".join(docs) + "\n<|endoftext|>\n")
    monkeypatch.setattr(readers, "CHUNK_CHARS", 7)  # markers get cut by chunk boundaries
    assert list(iter_documents(p)) == docs


def test_jsonl_reader(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "one", "id": 1}\n\n{"text": " two \\n"}\n{"text": ""}\n')
    assert list(iter_documents(p)) == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match="bad.jsonl:2"):
        list(iter_documents(bad))


def test_parquet_reader(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["alpha", None, "beta", "  "], "n": [1, 2, 3, 4]}), p,
                   row_group_size=2)
    assert list(iter_documents(p)) == ["alpha", "beta"]
    q = tmp_path / "b.parquet"
    pq.write_table(pa.table({"body": ["x"]}), q)
    with pytest.raises(DataError, match="'text' column"):
        list(iter_documents(q))


def test_directory_source_sorted_and_filtered(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("from b")
    (tmp_path / "sub" / "c.jsonl").write_text('{"text": "from c"}\n')
    (tmp_path / "a.txt").write_text("from a<|endoftext|>a again")
    (tmp_path / "notes.md").write_text("ignored")
    assert list(iter_documents(tmp_path)) == ["from a", "a again", "from b", "from c"]
    with pytest.raises(DataError, match="unsupported"):
        list(iter_documents(tmp_path / "notes.md"))
    with pytest.raises(DataError, match="does not exist"):
        list(iter_documents(tmp_path / "missing.txt"))


# ---------------------------------------------------------------- shards


def test_shard_header_round_trip_uint16(tmp_path):
    tokens = np.arange(1000) % 777
    path = write_shard(tmp_path / "s.bin", tokens, vocab_size=777, eot_id=5, fingerprint=FP)
    assert path.stat().st_size == shards.HEADER_SIZE + 2 * 1000
    assert path.read_bytes()[:8] == b"XTRNTOK1"
    header, mm = open_shard(path)
    assert (header.n_tokens, header.vocab_size, header.eot_id, header.fingerprint) == \
        (1000, 777, 5, FP)
    assert header.dtype == np.uint16 and isinstance(mm, np.memmap)
    np.testing.assert_array_equal(mm, tokens)


def test_shard_dtype_choice(tmp_path):
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32
    tokens = np.array([0, 65536, 70000, 3])
    path = write_shard(tmp_path / "s.bin", tokens, vocab_size=70001, eot_id=0, fingerprint=FP)
    header, mm = open_shard(path)
    assert header.dtype == np.uint32
    assert path.stat().st_size == shards.HEADER_SIZE + 4 * 4
    np.testing.assert_array_equal(mm, tokens)


def test_shard_validation(tmp_path):
    path = write_shard(tmp_path / "s.bin", np.arange(100), vocab_size=100, eot_id=0,
                       fingerprint=FP)
    raw = path.read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(raw[:-3])
    with pytest.raises(DataError, match="truncated"):
        open_shard(cut)
    cut.write_bytes(raw[:20])
    with pytest.raises(DataError, match="truncated"):
        read_header(cut)
    padded = tmp_path / "padded.bin"
    padded.write_bytes(raw + b"\0\0")
    with pytest.raises(DataError, match="longer"):
        open_shard(padded)
    other = tmp_path / "other.bin"
    other.write_bytes(b"NOTASHRD" + raw[8:])
    with pytest.raises(DataError, match="not an xtrain token shard"):
        open_shard(other)
    with pytest.raises(DataError, match="token ids"):
        write_shard(tmp_path / "x.bin", [1, 100], vocab_size=100, eot_id=0, fingerprint=FP)
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "x.bin.tmp").exists()


# ---------------------------------------------------------------- tokenizer and prepare


def test_prepare_round_trip(corpus, dataset):
    tok = load_tokenizer(dataset)
    assert tok.kind == "bpe" and tok.vocab_size <= 600 and tok.eot_id == 0
    docs = list(iter_documents(corpus))
    odd = "  Tabs\tand\n\nnewlines, émojis 😀, 中文, <b>tags</b> and $$$ 123  "
    for text in docs[:20] + [odd, ""]:
        assert tok.decode(tok.encode(text)) == text
    assert [tok.encode(d) for d in docs[:5]] == tok.encode_batch(docs[:5])
    meta = read_meta(dataset)
    counts = meta["counts"]
    assert counts["train_docs"] + counts["val_docs"] == len(docs)
    assert 0 < counts["val_docs"] < counts["train_docs"]
    assert meta["tokenizer"]["fingerprint"] == tok.fingerprint
    # Each document is eot followed by its tokens; decoding a shard gives back its documents.
    recovered = []
    for split in ("train", "val"):
        header, mm = open_shard(dataset / f"{split}.bin")
        assert header.n_tokens == counts[f"{split}_tokens"] and mm[0] == tok.eot_id
        assert int((mm == tok.eot_id).sum()) == counts[f"{split}_docs"]
        recovered += tok.decode(mm).split("<|endoftext|>")[1:]
    assert sorted(recovered) == sorted(docs)


def test_prepare_split_is_deterministic_by_document(corpus, dataset, tmp_path):
    again = prepare(corpus, tmp_path / "again", vocab_size=600, val_fraction=0.1, seed=1,
                    progress=False)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (again / name).read_bytes() == (dataset / name).read_bytes()
    other = prepare(corpus, tmp_path / "other", vocab_size=600, val_fraction=0.1, seed=2,
                    progress=False)
    assert (other / "val.bin").read_bytes() != (dataset / "val.bin").read_bytes()


def test_prepare_is_idempotent(corpus, tmp_path):
    out = prepare(corpus, tmp_path, vocab_size=400, val_fraction=0.1, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prepare(corpus, tmp_path, vocab_size=400, val_fraction=0.1, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    with pytest.raises(DataError, match="other settings"):
        prepare(corpus, tmp_path, vocab_size=500, val_fraction=0.1, progress=False)
    prepare(corpus, tmp_path, vocab_size=500, val_fraction=0.1, overwrite=True, progress=False)
    assert read_meta(tmp_path)["request"]["vocab_size"] == 500
    # Damaged files under a matching meta.json are rebuilt, not trusted.
    (tmp_path / "val.bin").write_bytes(b"garbage")
    prepare(corpus, tmp_path, vocab_size=500, val_fraction=0.1, progress=False)
    open_dataset(tmp_path)


def test_prepare_bad_requests(corpus, tmp_path):
    with pytest.raises(DataError, match="val_fraction"):
        prepare(corpus, tmp_path, val_fraction=0.0, progress=False)
    with pytest.raises(DataError, match="tokenizer sentencepiece: no such file.*expected bpe, gpt2"):
        prepare(corpus, tmp_path, tokenizer="sentencepiece", progress=False)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("just one document")
    with pytest.raises(DataError, match="split is empty"):
        prepare(tiny, tmp_path / "out", vocab_size=300, val_fraction=0.5, progress=False)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_gpt2_unavailable_is_a_clear_error(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    with pytest.raises(DataError, match="tiktoken is not installed.*tokenizer='bpe'"):
        gpt2_tokenizer()
    with pytest.raises(DataError, match="gpt2"):
        prepare(corpus, tmp_path, tokenizer="gpt2", progress=False)


def test_gpt2_path_with_a_stand_in_tiktoken(corpus, tmp_path, monkeypatch):
    import hashlib
    import types

    from xtrain.data import tokenizer as tokenizer_module

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: ByteEncoding()
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    with pytest.raises(DataError, match="not in tiktoken's cache"):
        gpt2_tokenizer()
    cache.mkdir()
    for url in tokenizer_module.GPT2_URLS:
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_text("cached")
    out = prepare(corpus, tmp_path / "gpt2", tokenizer="gpt2", val_fraction=0.1, progress=False)
    ds = open_dataset(out)
    assert ds.tokenizer.kind == "gpt2" and (out / "tiktoken.json").is_file()
    assert ds.eot_id == 256 and read_header(out / "val.bin").dtype == np.uint16
    text = "Once upon a time, 😀"
    assert ds.tokenizer.decode(ds.tokenizer.encode(text)) == text


def test_mismatched_tokenizer_is_detected(corpus, dataset, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    ds = open_dataset(copy, model_vocab_size=600)
    assert ds.vocab_size == load_tokenizer(dataset).vocab_size
    with pytest.raises(DataError, match="smaller than the tokenizer"):
        open_dataset(copy, model_vocab_size=ds.vocab_size - 1)
    other = train_bpe(["a completely different corpus " * 20] * 50, vocab_size=300)
    with pytest.raises(DataError, match="another tokenizer"):
        TokenLoader(copy / "train.bin", 2, 8, seed=0, tokenizer=other)
    other.save(copy)  # replaces tokenizer.json
    with pytest.raises(DataError, match="not the one the shards were made with"):
        open_dataset(copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(DataError, match="no tokenizer"):
        open_dataset(copy)
    with pytest.raises(DataError, match="not a prepared dataset"):
        open_dataset(tmp_path / "nothing")


# ---------------------------------------------------------------- loader


@pytest.fixture()
def shard(tmp_path):
    tokens = np.arange(5000) * 7919 % 65536  # distinct ids, so a token gives its position
    return write_shard(tmp_path / "t.bin", tokens, vocab_size=65536, eot_id=0, fingerprint=FP)


def test_loader_batches_are_windows(shard):
    loader = TokenLoader(shard, batch=4, seq=16, seed=0)
    mm = np.asarray(open_shard(shard)[1])
    for _ in range(5):
        x, y = loader.next_batch()
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int64
        for row_x, row_y in zip(x, y):
            start = int(np.flatnonzero(mm == row_x[0])[0])
            np.testing.assert_array_equal(mm[start:start + 16], row_x)
            np.testing.assert_array_equal(mm[start + 1:start + 17], row_y)


def test_loader_deterministic(shard):
    a = TokenLoader(shard, 3, 10, seed=7)
    b = TokenLoader(shard, 3, 10, seed=7)
    c = TokenLoader(shard, 3, 10, seed=8)
    for _ in range(4):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a.next_batch()[0], c.next_batch()[0])


def test_loader_two_ranks_equal_one_rank_with_double_batch(shard):
    single = TokenLoader(shard, batch=6, seq=12, seed=3)
    ranks = [TokenLoader(shard, batch=3, seq=12, seed=3, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(5):
        x, y = single.next_batch()
        parts = [loader.next_batch() for loader in ranks]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
        assert not np.array_equal(parts[0][0], parts[1][0])  # ranks get different windows
    with pytest.raises(DataError, match="rank"):
        TokenLoader(shard, 3, 12, seed=3, rank=2, world_size=2)


def test_loader_resume_bit_exact(shard):
    ref = TokenLoader(shard, 4, 20, seed=11)
    run = TokenLoader(shard, 4, 20, seed=11)
    for _ in range(3):
        ref.next_batch()
        run.next_batch()
    state = json.loads(json.dumps(run.state_dict()))  # must survive a JSON checkpoint
    resumed = TokenLoader(shard, 4, 20, seed=999)  # the seed comes from the state
    resumed.load_state_dict(state)
    assert resumed.step == 3
    for _ in range(4):
        xr, yr = ref.next_batch()
        xs, ys = resumed.next_batch()
        np.testing.assert_array_equal(xr, xs)
        np.testing.assert_array_equal(yr, ys)
    # Same global batch on another world size continues the same stream.
    half = TokenLoader(shard, 2, 20, seed=0, rank=1, world_size=2)
    half.load_state_dict(state)
    ref2 = TokenLoader(shard, 4, 20, seed=0)
    ref2.load_state_dict(state)
    np.testing.assert_array_equal(half.next_batch()[0], ref2.next_batch()[0][2:])
    with pytest.raises(DataError, match="seq"):
        TokenLoader(shard, 4, 21, seed=0).load_state_dict(state)


def test_loader_eval_sequential_and_sharded(shard):
    _, mm = open_shard(shard)
    loader = TokenLoader(shard, 4, 10, seed=0)
    batches = list(loader.iter_eval(batch=5, seq=10))
    assert len(batches) == loader.eval_batches(5, 10) == (5000 - 1) // 10 // 5
    x0, y0 = batches[0]
    np.testing.assert_array_equal(x0, np.asarray(mm[:50]).reshape(5, 10))
    np.testing.assert_array_equal(y0, np.asarray(mm[1:51]).reshape(5, 10))
    assert len(list(loader.iter_eval(5, 10, max_batches=3))) == 3
    state = loader.state_dict()
    assert loader.state_dict() == state  # eval does not advance the training stream
    two = [list(TokenLoader(shard, 4, 10, seed=0, rank=r, world_size=2).iter_eval(5, 10))
           for r in (0, 1)]
    single = list(TokenLoader(shard, 4, 10, seed=0).iter_eval(10, 10))
    assert len(two[0]) == len(two[1]) == len(single)
    for (xa, _), (xb, _), (xs, _) in zip(two[0], two[1], single):
        np.testing.assert_array_equal(np.concatenate([xa, xb]), xs)


def test_loader_too_short(tmp_path):
    path = write_shard(tmp_path / "s.bin", np.arange(10), vocab_size=10, eot_id=0,
                       fingerprint=FP)
    with pytest.raises(DataError, match="fewer than one window"):
        TokenLoader(path, 1, 10, seed=0)
    loader = TokenLoader(path, 1, 9, seed=0)
    with pytest.raises(DataError, match="too few for one eval batch"):
        list(loader.iter_eval(2, 9))


def test_dataset_loaders(dataset):
    ds = open_dataset(dataset)
    x, y = ds.loader("train", 2, 32, seed=0).next_batch()
    assert x.shape == (2, 32) and int(x.max()) < ds.vocab_size
    assert next(ds.loader("val", 2, 32, seed=0).iter_eval(2, 32))[0].shape == (2, 32)
    with pytest.raises(DataError, match="split"):
        ds.loader("test", 2, 32, seed=0)


def test_package_is_self_contained():
    # xtrain.data uses nothing of the engine: no imports from the rest of xtrain but its
    # environment settings (xtrain.settings, plain Python).
    from pathlib import Path

    import xtrain.data

    for path in Path(xtrain.data.__file__).parent.glob("*.py"):
        source = path.read_text()
        source = source.replace("from xtrain import settings\n", "")
        assert not re.search(r"^\s*(from \.\.|from xtrain(?!\.data)|import xtrain(?!\.data))",
                             source, re.M), path.name
