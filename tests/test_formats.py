"""Token files of other projects as data, never re-tokenised: nanoGPT's train.bin/val.bin, llm.c's
shards, and Hugging Face `datasets` saved with save_to_disk; all written here in their exact
formats. Read in place (directly, or after `xtrain prepare DIR` recorded a tokenizer), copied into
shards, trained on, and every bad file one clear error."""

import json
import sys

import numpy as np
import pytest

from tokhelp import (cli_run, documents, fake_gpt2, hf_tokenizer, one_error_line, token_stream,
                     word_level_tokenizer, write_llmc_shard, write_nanogpt)
from xtrain.io import state
from xtrain.data import DataError, open_dataset, open_tokenizer, prepare, read_header
from xtrain.data.formats import ConcatTokens

TRAIN_ARGS = ("--preset", "tiny", "--steps", "2", "--batch", "2", "--seq", "16", "--eval-every", "0",
              "--sample-tokens", "3", "--no-progress", "--device", "cpu")


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory):
    return hf_tokenizer(tmp_path_factory.mktemp("hf"))


@pytest.fixture()
def gpt2(monkeypatch, tmp_path):
    """`gpt2` is a byte-level stand-in (257 ids, eot 256): tiktoken's files are not here."""
    fake_gpt2(monkeypatch, tmp_path / "tiktoken-cache")
    return open_tokenizer("gpt2")


def _byte_ids(n_docs, eot_first, seed=0):
    return token_stream(lambda t: list(t.encode()), documents(n_docs, seed), 256, eot_first)


def _listing(directory):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir())


# ---------------------------------------------------------------- nanoGPT

def test_nanogpt_directory_is_trained_on_directly(gpt2, tmp_path, capsys):
    train, val = _byte_ids(60, eot_first=False), _byte_ids(8, eot_first=False, seed=1)
    data = write_nanogpt(tmp_path / "openwebtext", train, val)
    (data / "prepare.py").write_text("# nanoGPT's script, left alone\n")
    before = _listing(data)
    ds = open_dataset(data)
    assert ds.format == "nanogpt" and ds.tokenizer.kind == "gpt2"
    assert np.array_equal(np.asarray(ds.split("train").tokens), train)  # the file, not re-tokenised
    assert ds.meta["counts"]["val_tokens"] == len(val) and ds.meta["counts"]["val_eot"] == 8
    code, err = cli_run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TRAIN_ARGS)
    assert code == 0, err
    assert _listing(data) == before, "reading in place writes nothing beside the token files"
    ckpt = state.load(tmp_path / "run" / "ckpt")
    assert ckpt.tokenizer_meta["kind"] == "gpt2" and ckpt.loader_state["n_tokens"] == len(train)
    code, err = cli_run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TRAIN_ARGS, "--resume",
                     "--steps", "3")
    assert code == 0, err
    assert state.load(tmp_path / "run" / "ckpt").step == 3


def test_nanogpt_prepared_in_place_with_another_tokenizer(hf_file, tmp_path, capsys):
    tok = open_tokenizer(hf_file)
    train = token_stream(tok.encode, documents(60), tok.eot_id, eot_first=False)
    val = token_stream(tok.encode, documents(8, seed=1), tok.eot_id, eot_first=False)
    data = write_nanogpt(tmp_path / "shakespeare", train, val)
    bins = {n: (data / n).read_bytes() for n in ("train.bin", "val.bin")}
    code, err = cli_run(capsys, "prepare", data, "--tokenizer", hf_file, "--no-progress")
    assert code == 0, err
    assert sorted(p.name for p in data.iterdir()) == ["meta.json", "tokenizer.json", "tokenizer_config.json",
                                                     "train.bin", "val.bin"]
    assert all((data / n).read_bytes() == b for n, b in bins.items()), "token files are never rewritten"
    meta = json.loads((data / "meta.json").read_text())
    assert meta["format"] == "nanogpt" and meta["files"] == {"train": ["train.bin"], "val": ["val.bin"]}
    assert meta["listing"]["train.bin"]["bytes"] == 2 * len(train) and len(meta["listing"]["train.bin"]["sha256"]) == 64
    ds = open_dataset(data)
    assert ds.tokenizer.fingerprint == tok.fingerprint
    assert np.array_equal(np.asarray(ds.split("val").tokens), val)
    code, err = cli_run(capsys, "prepare", data, "--tokenizer", hf_file, "--no-progress")  # reused
    assert code == 0, err
    code, err = cli_run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TRAIN_ARGS)
    assert code == 0, err
    assert state.load(tmp_path / "run" / "ckpt").tokenizer().fingerprint == tok.fingerprint
    # A token file that changed since: refused until prepared again.
    with open(data / "val.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataError, match="has changed since it was prepared"):
        open_dataset(data)


def test_gpt2_unavailable_says_what_the_files_need(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    data = write_nanogpt(tmp_path / "nano", np.arange(100), np.arange(50))
    for command in (("train", "--data", data, "--out", tmp_path / "run", *TRAIN_ARGS),
                    ("prepare", data, "--no-progress")):
        code, err = cli_run(capsys, *command)
        one_error_line(code, err, "hold GPT-2 ids, and GPT-2's tokenizer is unavailable: tiktoken is not "
                       "installed", "--tokenizer PATH")
    assert sorted(p.name for p in data.iterdir()) == ["train.bin", "val.bin"]


def test_token_directory_copied_into_shards(hf_file, tmp_path):
    tok = open_tokenizer(hf_file)
    train = token_stream(tok.encode, documents(30), tok.eot_id, eot_first=True)
    data = write_nanogpt(tmp_path / "nano", train, train[:300])
    out = prepare(data, tmp_path / "shards", tokenizer=hf_file, progress=False)
    ds = open_dataset(out)
    assert ds.format == "xtrain" and read_header(out / "train.bin").fingerprint == tok.fingerprint
    assert np.array_equal(np.asarray(ds.split("train").tokens), train)
    assert not (data / "meta.json").exists()


def test_in_place_prepare_never_replaces_the_users_files(hf_file, tmp_path, capsys):
    data = write_nanogpt(tmp_path / "nano", np.arange(100), np.arange(50))
    (data / "tokenizer_config.json").write_text('{"chat_template": "mine"}')
    code, err = cli_run(capsys, "prepare", data, "--tokenizer", hf_file, "--no-progress")
    one_error_line(code, err, "tokenizer_config.json exists and was not written by xtrain", "--out")
    assert (data / "tokenizer_config.json").read_text() == '{"chat_template": "mine"}'
    assert not (data / "meta.json").exists()


# ---------------------------------------------------------------- llm.c

def test_llmc_shards_are_one_stream_per_split(gpt2, tmp_path, capsys):
    ids = _byte_ids(40, eot_first=True)
    cut = len(ids) // 3
    data = tmp_path / "fineweb10B"
    write_llmc_shard(data / "fineweb_val_000000.bin", ids[:cut])
    write_llmc_shard(data / "fineweb_train_000001.bin", ids[cut:2 * cut])
    write_llmc_shard(data / "fineweb_train_000002.bin", ids[2 * cut:])
    ds = open_dataset(data)
    assert ds.format == "llmc" and ds.meta["files"]["train"] == ["fineweb_train_000001.bin",
                                                                 "fineweb_train_000002.bin"]
    split = ds.split("train")
    assert isinstance(split.tokens, ConcatTokens) and split.header.n_tokens == len(ids) - cut
    assert np.array_equal(split.tokens[cut - 5:cut + 5], ids[2 * cut - 5:2 * cut + 5])  # across files
    assert np.array_equal(split.tokens[0:len(ids) - cut], ids[cut:])
    loader = ds.loader("train", 4, 32, seed=0)
    x, y = loader.next_batch()
    assert x.shape == (4, 32) and np.array_equal(x[:, 1:], y[:, :-1])
    resumed = ds.loader("train", 4, 32, seed=9)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert all(np.array_equal(a, b) for a, b in zip(loader.next_batch(), resumed.next_batch()))
    code, err = cli_run(capsys, "train", "--data", data, "--out", tmp_path / "run", *TRAIN_ARGS)
    assert code == 0, err
    assert not (data / "meta.json").exists()


def test_llmc_uint32_shards_need_a_tokenizer(hf_file, tmp_path, capsys):
    tok = open_tokenizer(hf_file)
    ids = token_stream(tok.encode, documents(30), tok.eot_id, eot_first=True)
    data = tmp_path / "llama3"
    write_llmc_shard(data / "tiny_train.bin", ids, magic=20240801, version=7, dtype=np.uint32)
    write_llmc_shard(data / "tiny_val.bin", ids[:200], magic=20240801, version=7, dtype=np.uint32)
    with pytest.raises(DataError, match="do not say which tokenizer.*xtrain prepare .* --tokenizer PATH"):
        open_dataset(data)
    code, err = cli_run(capsys, "prepare", data, "--no-progress")
    one_error_line(code, err, "do not say which tokenizer made them")
    code, err = cli_run(capsys, "prepare", data, "--tokenizer", "bpe", "--no-progress")
    one_error_line(code, err, "name the tokenizer that made them", "a BPE cannot be trained on ids")
    code, err = cli_run(capsys, "prepare", data, "--tokenizer", hf_file, "--no-progress")
    assert code == 0, err
    ds = open_dataset(data)
    assert ds.split("train").header.dtype == np.uint32 and np.array_equal(np.asarray(ds.split("train").tokens), ids)


# ---------------------------------------------------------------- bad token files

def test_bad_token_files_are_one_clear_error(gpt2, hf_file, tmp_path, capsys):
    good = _byte_ids(10, eot_first=True)
    cases = {}
    d = tmp_path / "magic"
    write_llmc_shard(d / "x_train_000001.bin", good)
    write_llmc_shard(d / "x_val_000000.bin", good, magic=20240521)
    cases[d] = "is not an llm.c token shard (magic 20240521"
    d = tmp_path / "version"
    write_llmc_shard(d / "x_train.bin", good, version=2)
    write_llmc_shard(d / "x_val.bin", good)
    cases[d] = "llm.c shard version 2"
    d = tmp_path / "count"
    write_llmc_shard(d / "x_train.bin", good, count=len(good) + 7)
    write_llmc_shard(d / "x_val.bin", good)
    cases[d] = "is truncated"
    d = tmp_path / "short"
    write_llmc_shard(d / "x_train.bin", good)
    (d / "x_val.bin").write_bytes(b"\x01" * 100)
    cases[d] = "smaller than its 1024-byte header"
    d = tmp_path / "noval"
    write_llmc_shard(d / "x_train.bin", good)
    cases[d] = "no val split"
    d = write_nanogpt(tmp_path / "odd", good, good)
    with open(d / "train.bin", "ab") as f:
        f.write(b"\x07")
    cases[d] = "an odd number: not uint16 tokens"
    d = write_nanogpt(tmp_path / "range", good, np.array([1, 2, 999]))
    cases[d] = "holds id 999 (token 2), outside the vocabulary of tokenizer gpt2-257"
    d = write_nanogpt(tmp_path / "empty", good, np.zeros(0))
    cases[d] = "the val split of"
    for directory, needle in cases.items():
        with pytest.raises(DataError, match=None) as info:
            open_dataset(directory)
        assert needle in str(info.value), (directory.name, str(info.value))
        code, err = cli_run(capsys, "train", "--data", directory, "--out", tmp_path / "runs" / directory.name, *TRAIN_ARGS)
        one_error_line(code, err, needle)
    # A vocabulary larger than uint16 files can hold.
    big = word_level_tokenizer(tmp_path / "big" / "tokenizer.json", 70_000, eot="<|endoftext|>")
    d = write_nanogpt(tmp_path / "wide", good, good)
    code, err = cli_run(capsys, "prepare", d, "--tokenizer", big, "--no-progress")
    one_error_line(code, err, "stores uint16 ids, which hold at most 65536, but tokenizer hf-70002 has 70002")
    assert not (d / "meta.json").exists()


# ---------------------------------------------------------------- datasets.save_to_disk

def test_saved_dataset_text_and_ids(hf_file, tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (the test extras have it)")
    tok = open_tokenizer(hf_file)
    texts = documents(80)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:70]}),
                          "validation": datasets.Dataset.from_dict({"text": texts[70:]})}
                         ).save_to_disk(str(tmp_path / "text_dd"))
    code, err = cli_run(capsys, "prepare", tmp_path / "text_dd", "--out", tmp_path / "a", "--tokenizer", hf_file,
                     "--no-progress")
    assert code == 0, err
    ds = open_dataset(tmp_path / "a")
    assert ds.meta["request"]["splits"] == ["train", "validation"] and ds.meta["counts"]["val_docs"] == 10
    val = np.asarray(ds.split("val").tokens)
    assert list(val) == [i for t in texts[70:] for i in [tok.eot_id] + tok.encode(t)]

    rows = [tok.encode(t) for t in texts]
    rows[3] = [tok.eot_id] + rows[3]  # already starts with the end of text: left alone
    datasets.Dataset.from_dict({"input_ids": rows, "n": list(range(80))}).save_to_disk(str(tmp_path / "ids"))
    out = prepare(tmp_path / "ids", tmp_path / "b", tokenizer=hf_file, val_fraction=0.2, progress=False)
    ds = open_dataset(out)
    both = np.concatenate([np.asarray(ds.split(s).tokens) for s in ("train", "val")])
    assert len(both) == sum(len(r) for r in rows) + len(rows) - 1  # not re-tokenised
    assert ds.meta["request"]["column"] == "input_ids"
    code, err = cli_run(capsys, "train", "--data", tmp_path / "ids", "--out", tmp_path / "run", *TRAIN_ARGS)
    one_error_line(code, err, "holds token ids (input_ids): name the tokenizer")
    code, err = cli_run(capsys, "prepare", tmp_path / "ids", "--out", tmp_path / "c", "--tokenizer", hf_file,
                     "--split", "train", "--no-progress")
    one_error_line(code, err, "saved without splits")
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5000, 6]] * 5}).save_to_disk(str(tmp_path / "far"))
    code, err = cli_run(capsys, "prepare", tmp_path / "far", "--out", tmp_path / "d", "--tokenizer", hf_file,
                     "--no-progress")
    one_error_line(code, err, "row 1 of 'input_ids' holds id 5000, outside the vocabulary")
    # A text-column dataset trains directly (prepared into OUT/data with the BPE).
    code, err = cli_run(capsys, "train", "--data", tmp_path / "text_dd", "--out", tmp_path / "run2", *TRAIN_ARGS)
    assert code == 0, err
    assert open_dataset(tmp_path / "run2" / "data").tokenizer.kind == "bpe"
