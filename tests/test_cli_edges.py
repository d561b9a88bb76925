"""The edges of the `xtrain` command a new user meets first: what `prepare` reports for every kind
of source, `sample`/`export` given a run folder, `--init-from` with a hub name (resolved through a
stand-in for huggingface_hub: no network here), the record's floats, the default --out, and counts
printed with the right plural."""

import importlib.util
import json

import numpy as np
import pytest

from tokhelp import documents, fake_gpt2, token_stream, write_llmc_shard, write_nanogpt
from xtrain.trainer import cli

needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None,
                                    reason="`datasets` is not installed (the test extras have it)")


def _main(capsys, *argv) -> tuple[int, str, str]:
    """`xtrain ARGV` in this process: (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _report(out: str) -> str:
    """The counts line `prepare` prints after `prepared DIR`."""
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("prepared "), out
    return lines[1]


def _meta(path) -> dict:
    return json.loads((path / "meta.json").read_text())


def _docs_and_tokens(meta: dict) -> str:
    c = meta["counts"]
    return (f"train: {c['train_docs']:,} documents, {c['train_tokens']:,} tokens; "
            f"val: {c['val_docs']:,} documents, {c['val_tokens']:,} tokens")


# ---------------------------------------------------------------- 1. prepare reports its counts

def test_prepare_reports_documents_and_tokens_of_text_sources(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'xtrain[parquet]')")
    import pyarrow.parquet as pq

    texts = documents(120)
    (tmp_path / "c.txt").write_text("\n\n".join(texts))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    for name in ("c.txt", "c.jsonl", "c.parquet"):
        out = tmp_path / f"out-{name}"
        code, stdout, err = _main(capsys, "prepare", tmp_path / name, "--out", out, "--vocab-size", "300",
                                  "--val-fraction", "0.1", "--no-progress")
        assert code == 0, err
        meta = _meta(out)
        assert meta["counts"]["train_docs"] + meta["counts"]["val_docs"] == 120
        assert _report(stdout) == _docs_and_tokens(meta)
        # A directory prepared already is reused, and says what it holds all the same.
        code, again, err = _main(capsys, "prepare", tmp_path / name, "--out", out, "--vocab-size", "300",
                                 "--val-fraction", "0.1", "--no-progress")
        assert code == 0 and again == stdout, err


def test_prepare_reports_a_single_document_in_the_singular(tmp_path):
    from xtrain.data.write import split_counts

    meta = {"counts": {"train_docs": 1, "train_tokens": 1, "val_docs": 2, "val_tokens": 3_000}}
    assert split_counts(meta) == "train: 1 document, 1 token; val: 2 documents, 3,000 tokens"
    assert split_counts({}) is None


@needs_datasets
def test_prepare_reports_hub_and_saved_datasets(tmp_path, capsys, monkeypatch):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    texts = documents(90)
    repo = tmp_path / "org--stories"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": texts[:80]}), repo / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": texts[80:]}), repo / "data" / "validation-00000-of-00001.parquet")
    code, stdout, err = _main(capsys, "prepare", f"hf:{repo}", "--out", tmp_path / "hub", "--val-split",
                              "validation", "--vocab-size", "300", "--no-progress")
    assert code == 0, err
    assert _meta(tmp_path / "hub")["counts"]["val_docs"] == 10
    assert _report(stdout) == _docs_and_tokens(_meta(tmp_path / "hub"))

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:80]}),
                          "validation": datasets.Dataset.from_dict({"text": texts[80:]})}
                         ).save_to_disk(str(tmp_path / "saved"))
    code, stdout, err = _main(capsys, "prepare", tmp_path / "saved", "--out", tmp_path / "s", "--vocab-size",
                              "300", "--no-progress")
    assert code == 0, err
    assert _report(stdout) == _docs_and_tokens(_meta(tmp_path / "s"))


def test_prepare_reports_a_copy_of_the_stories(tmp_path, capsys, monkeypatch):
    from xtrain.data import stream as S

    monkeypatch.setenv("XTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(S, "VAL_TOKENS", 20_000)
    monkeypatch.setattr(S, "BPE_STORIES", 400)
    code, stdout, err = _main(capsys, "prepare", "stories", "--tokens", "5000", "--out", tmp_path / "st",
                              "--no-progress")
    assert code == 0, err
    meta = _meta(tmp_path / "st")
    assert meta["counts"]["train_tokens"] >= 5000
    assert _report(stdout) == _docs_and_tokens(meta)


def test_prepare_reports_token_files_in_place_and_copied(tmp_path, capsys, monkeypatch):
    fake_gpt2(monkeypatch, tmp_path / "tiktoken-cache")

    def ids(n, seed, eot_first):
        return token_stream(lambda t: list(t.encode()), documents(n, seed), 256, eot_first)

    train, val = ids(40, 0, False), ids(6, 1, False)
    nanogpt = write_nanogpt(tmp_path / "owt", train, val)
    code, stdout, err = _main(capsys, "prepare", nanogpt, "--no-progress")  # read in place
    assert code == 0, err
    assert _report(stdout) == (f"train: {len(train):,} tokens (40 end-of-text ids); "
                               f"val: {len(val):,} tokens (6 end-of-text ids)")

    llmc = tmp_path / "llmc"
    shards = [ids(30, 2, True), ids(20, 3, True)]
    write_llmc_shard(llmc / "tiny_train_000001.bin", shards[0])
    write_llmc_shard(llmc / "tiny_train_000002.bin", shards[1])
    write_llmc_shard(llmc / "tiny_val_000000.bin", ids(5, 4, True))
    code, stdout, err = _main(capsys, "prepare", llmc, "--out", tmp_path / "copy", "--no-progress")
    assert code == 0, err
    n_train = len(shards[0]) + len(shards[1])
    assert _report(stdout) == (f"train: {n_train:,} tokens (50 end-of-text ids); "
                               f"val: {len(ids(5, 4, True)):,} tokens (5 end-of-text ids)")
    assert _meta(tmp_path / "copy")["counts"]["train_eot"] == 50


# ---------------------------------------------------------------- 2. a run folder for --ckpt

@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """RUN/ckpt as `xtrain train --out RUN` leaves it (a small model with its tokenizer)."""
    from modelhelp import make_model, small_config
    from xtrain.data import generate_stories, train_bpe
    from xtrain.io import state

    run = tmp_path_factory.mktemp("edges") / "run"
    tok = train_bpe(generate_stories(100), 300)
    model = make_model(small_config(vocab_size=tok.vocab_size, max_seq=32), "cpu", weights_seed=1)
    state.save(run / "ckpt", model, None, 5, tokenizer=tok)
    (run / "log.jsonl").write_text("")
    return run


def test_sample_and_export_take_a_run_folder(run_folder, tmp_path, capsys):
    sample = ("--prompt", "Once upon a time", "--greedy", "--max-new-tokens", "6", "--device", "cpu")
    code, from_ckpt, err = _main(capsys, "sample", "--ckpt", run_folder / "ckpt", *sample)
    assert code == 0, err
    code, from_run, err = _main(capsys, "sample", "--ckpt", run_folder, *sample)
    assert code == 0, err
    assert from_run == from_ckpt and from_run.startswith("Once upon a time")
    code, stdout, err = _main(capsys, "export", "--ckpt", run_folder, "--out", tmp_path / "hf", "--dtype", "f32")
    assert code == 0, err
    assert stdout.startswith(f"exported {run_folder / 'ckpt'} to ")
    code, _, err = _main(capsys, "export", "--ckpt", run_folder / "ckpt", "--out", tmp_path / "hf2", "--dtype",
                         "f32")
    assert code == 0, err
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (tmp_path / "hf2" / "model.safetensors").read_bytes()


def test_a_run_folder_whose_save_was_cut_between_its_renames(run_folder, tmp_path):
    """RUN/ckpt.old is all there is after a crash between a save's two renames: still found."""
    import shutil

    from xtrain.io.export import checkpoint_in

    run = tmp_path / "run"
    shutil.copytree(run_folder / "ckpt", run / "ckpt.old")
    assert checkpoint_in(run) == run / "ckpt"
    assert checkpoint_in(run_folder / "ckpt") == run_folder / "ckpt"


def test_a_path_that_is_neither_says_what_was_looked_for(tmp_path, capsys):
    from tokhelp import one_error_line

    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "missing", empty):
        for command in (("sample", "--device", "cpu"), ("export", "--out", tmp_path / "hf")):
            code, _, err = _main(capsys, command[0], "--ckpt", path, *command[1:])
            one_error_line(code, err, f"no checkpoint at {path}", str(path / "state.json"),
                           str(path / "ckpt" / "state.json"))
    (tmp_path / "half" / "ckpt").mkdir(parents=True)  # a run folder whose checkpoint is incomplete
    code, _, err = _main(capsys, "sample", "--ckpt", tmp_path / "half")
    one_error_line(code, err, f"{tmp_path / 'half' / 'ckpt'} is not a complete checkpoint")


def test_the_run_checkpoint_folder_is_the_trainers():
    from xtrain.io.export import RUN_CHECKPOINT
    from xtrain.trainer.train import CKPT_DIR

    assert RUN_CHECKPOINT == CKPT_DIR


# ---------------------------------------------------------------- 3. --init-from a hub name

@pytest.fixture()
def hub_model(run_folder, tmp_path, monkeypatch):
    """A stand-in for huggingface_hub.snapshot_download serving "org/tiny" (the run folder's model
    in the Hugging Face layout, beside files a download must not fetch) from a local "remote" into
    a local cache. No network: the reachability probe is replaced too. Returns the calls' log."""
    import fnmatch
    import shutil

    from xtrain.data import hub
    from xtrain.io.export import export

    huggingface_hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (the "
                                          "test extras bring it with transformers)")
    from huggingface_hub import errors as hub_errors  # a submodule: not loaded by the package itself
    remote = export(run_folder, tmp_path / "remote", dtype="f32")
    (remote / "pytorch_model.bin").write_bytes(b"a pickle")
    (remote / "README.md").write_text("model card")
    calls = []

    class NotFound(hub_errors.RepositoryNotFoundError):
        def __init__(self):
            OSError.__init__(self, "404 Client Error: Repository Not Found")

    def snapshot_download(repo_id, *, allow_patterns=None, local_files_only=False, **kw):
        calls.append(dict(repo_id=repo_id, allow_patterns=allow_patterns, local_files_only=local_files_only))
        snap = tmp_path / "cache" / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "0123abc"
        if repo_id != "org/tiny":
            raise NotFound()
        if local_files_only and not snap.is_dir():
            raise hub_errors.LocalEntryNotFoundError("not in the cache")
        snap.mkdir(parents=True, exist_ok=True)
        for f in remote.iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                shutil.copy(f, snap / f.name)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(hub, "hub_reachable", lambda: not hub.hub_offline())
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return calls


def test_init_from_a_hub_name_downloads_what_the_import_reads(run_folder, hub_model, tmp_path, monkeypatch):
    from xtrain.io import state
    from xtrain.models import TinyTransformer
    from xtrain.models.hf_import import HUB_FILES, resolve_pretrained

    snap = resolve_pretrained("org/tiny")
    assert hub_model == [dict(repo_id="org/tiny", allow_patterns=list(HUB_FILES), local_files_only=False)]
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                      "tokenizer.json", "tokenizer_config.json"]
    model = TinyTransformer.from_pretrained("org/tiny")
    weights = state.load(run_folder / "ckpt").model_tensors()
    assert all(np.array_equal(p.numpy(), weights[n]) for n, p in model.named_parameters())
    assert resolve_pretrained(run_folder) == run_folder  # a local directory is used as it is
    # Offline, the cached snapshot is read without asking the hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_model.clear()
    assert resolve_pretrained("org/tiny") == snap and hub_model[0]["local_files_only"] is True


def test_train_init_from_a_hub_name(hub_model, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents(200)))
    code, stdout, err = _main(capsys, "train", "--init-from", "org/tiny", "--data", corpus, "--out", tmp_path / "run",
                              "--steps", "1", "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens",
                              "2", "--no-progress", "--device", "cpu")
    assert code == 0, err
    assert "from pretrained Qwen3ForCausalLM weights" in stdout
    record = (tmp_path / "run" / "config.toml").read_text()
    assert f'init-from = "{tmp_path / "cache" / "models--org--tiny" / "snapshots" / "0123abc"}"' in record


def test_init_from_a_name_that_cannot_be_had(hub_model, tmp_path, monkeypatch, capsys):
    import sys

    from tokhelp import one_error_line

    args = ("--data", tmp_path, "--out", tmp_path / "run", "--device", "cpu")
    code, _, err = _main(capsys, "train", "--init-from", "org/none", *args)
    one_error_line(code, err, "no model org/none on the Hugging Face hub")
    code, _, err = _main(capsys, "train", "--init-from", "Qwen3-0.6B", *args)
    one_error_line(code, err, "no model Qwen3-0.6B", "hub names are ORG/NAME, e.g. Qwen/Qwen3-0.6B")
    for path in (tmp_path / "missing", "./missing", "a/b/c"):  # paths, not hub names: never asked for
        code, _, err = _main(capsys, "train", "--init-from", path, *args)
        one_error_line(code, err, f"{path}: no such directory")
    assert [c["repo_id"] for c in hub_model] == ["org/none", "Qwen3-0.6B"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err = _main(capsys, "train", "--init-from", "org/tiny", *args)  # not cached yet
    one_error_line(code, err, "cannot download org/tiny: HF_HUB_OFFLINE is set", str(tmp_path / "hf"),
                   "unset HF_HUB_OFFLINE to download it", "pass its path")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
    code, _, err = _main(capsys, "train", "--init-from", "org/tiny", *args)
    one_error_line(code, err, "needs huggingface_hub", "pip install 'xtrain[hub]'", "pass its path")


def test_offline_init_from_with_the_real_hub_client_is_one_line(tmp_path):
    """The real snapshot_download, offline with an empty cache: one line, no traceback."""
    pytest.importorskip("huggingface_hub")
    from modelhelp import run_cli

    r = run_cli("train", "--init-from", "org/not-cached", "--out", tmp_path / "run", "--device", "cpu",
                cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot download org/not-cached: HF_HUB_OFFLINE is set" in r.stderr


# ---------------------------------------------------------------- 4. the record's floats

def test_the_record_writes_floats_exactly_and_readably(tmp_path):
    from xtrain.trainer import runconfig

    min_lr = 3e-3 / 10  # what a run's min-lr is for --lr 3e-3: 0.00030000000000000003
    record = {"lr": 3e-3, "min_lr": min_lr, "grad_clip": 1.0, "weight_decay": 0.1, "dropout": 6e-4 / 10}
    runconfig.write_record(tmp_path / "config.toml", record)
    lines = (tmp_path / "config.toml").read_text().splitlines()
    assert "lr = 0.003" in lines and "grad-clip = 1.0" in lines and "weight-decay = 0.1" in lines
    assert "min-lr = 0.00030000000000000003  # 0.0003, to the bit as the run used it" in lines
    assert "dropout = 5.9999999999999995e-05  # 6e-05, to the bit as the run used it" in lines
    back = runconfig.read_toml(tmp_path / "config.toml")
    assert back == record and back["min_lr"] == min_lr  # a resume gets the very same bits


# ---------------------------------------------------------------- 5. the default --out

def _values(*argv):
    return cli._train_values(cli.build_parser().parse_args(["train", *map(str, argv)]))


def test_the_default_out_names_the_model_and_the_data(tmp_path, monkeypatch):
    import xtrain.trainer.train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text("")
    (tmp_path / "data" / "tinystories").mkdir(parents=True)
    (tmp_path / "qwen-small").mkdir()
    assert _values("--device", "cpu")["out"] == "runs/tiny-stories"
    assert _values("--device", "cpu", "--data", "corpus.jsonl")["out"] == "runs/tiny-corpus"
    assert _values("--device", "cpu", "--data", tmp_path / "corpus.jsonl")["out"] == "runs/tiny-corpus"
    assert _values("--device", "cpu", "--data", "data/tinystories/", "--preset", "dim384")["out"] == \
        "runs/dim384-tinystories"
    assert _values("--device", "cpu", "--init-from", "qwen-small", "--data", "corpus.jsonl")["out"] == \
        "runs/qwen-small-corpus"
    assert _values("--device", "cpu", "--init-from", "Qwen/Qwen3-0.6B")["out"] == "runs/Qwen3-0.6B-stories"
    assert _values("--device", "cpu", "--data", "corpus.jsonl", "--out", "mine")["out"] == "mine"  # as given
    monkeypatch.setattr(xtrain.trainer.train, "resolve_device", lambda d: "cuda:0")
    assert _values()["out"] == "runs/dim768-stories"


def test_resume_alone_finds_the_default_run(run_folder, tmp_path, monkeypatch):
    import shutil

    import xtrain.trainer.train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("")
    for out, device in (("runs/tiny-stories", "cpu"), ("runs/tiny-corpus", "cpu"), ("runs/dim768-stories", "cuda:0")):
        shutil.copytree(run_folder / "ckpt", tmp_path / out / "ckpt")
    assert _values("--device", "cpu", "--resume")["resume"] == "runs/tiny-stories/ckpt"
    assert _values("--device", "cpu", "--data", "corpus.txt", "--resume")["resume"] == "runs/tiny-corpus/ckpt"
    # On a GPU `xtrain train` trains dim768: `xtrain train --resume` looks where that run is.
    monkeypatch.setattr(xtrain.trainer.train, "resolve_device", lambda d: "cuda:0")
    assert _values("--resume")["resume"] == "runs/dim768-stories/ckpt"


# ---------------------------------------------------------------- 6. counts in the singular

def test_counts_of_one_are_singular():
    from xtrain.trainer import batching
    from xtrain.trainer.train import plan_eval

    assert "evaluating 1 batch instead" in plan_eval(3_000, 16, 128, 20, 1).note  # 23 windows: one batch
    assert "evaluating 2 batches instead" in plan_eval(5_000, 16, 128, 20, 1).note
    assert "one batch of 1 window of 128 tokens" in plan_eval(200, 16, 128, 20, 1).note
    one = batching.plan(1, None, None, 64, 1, False)
    assert one.describe() == "micro-batch 1 x 1 accumulation step = 1 sequence of 64 = 64 tokens per step"
    assert "= 2 sequences of 64" in batching.plan(2, None, None, 64, 1, False).describe()
    tried = batching.plan("auto", None, 64, 64, 1, False, fits=lambda b, rc: True)
    assert tried.why.endswith("(the largest candidate; 1 try)")
    with pytest.raises(batching.ConfigError, match="does not divide the 1 sequence per GPU"):
        batching.plan("auto", 2, 64, 64, 1, False, fits=lambda b, rc: True)


def test_init_from_a_hub_that_cannot_be_reached(hub_model, tmp_path, monkeypatch, capsys):
    from tokhelp import one_error_line
    from xtrain.data import hub

    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err = _main(capsys, "train", "--init-from", "org/tiny", "--out", tmp_path / "run", "--device", "cpu")
    one_error_line(code, err, "cannot download org/tiny: the Hugging Face hub is unreachable",
                   f"copy {tmp_path / 'hf'} here", "pass its path")
    assert hub_model[-1]["local_files_only"] is True
