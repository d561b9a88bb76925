"""Hugging Face hub datasets (xtrain.data.hub) without a network: the real loading code
(`datasets.load_dataset`) on a local directory laid out like a hub repository, its own validation
split or a hash split, idempotence, bad columns and splits, and the one-line messages when
`datasets` is missing or the hub cannot be reached."""

import importlib.util
import sys

import numpy as np
import pytest

from modelhelp import run_cli
from xtrain.data import DataError, generate_stories, open_dataset, open_shard
from xtrain.data.hub import ALIASES, default_out_dir, hub_source, prepare_hub

needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None,
    reason="`datasets` is not installed (pip install 'xtrain[hub]'): the loading code cannot run")


@pytest.fixture(scope="module")
def hub_repo(tmp_path_factory):
    """A dataset repository as the hub lays it out: data/SPLIT-0000K-of-0000N.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hub") / "org--tiny-stories"
    (root / "data").mkdir(parents=True)
    stories = generate_stories(130, seed=11)
    parts = {"train-00000-of-00002": stories[:60], "train-00001-of-00002": stories[60:120],
             "validation-00000-of-00001": stories[120:]}
    for name, texts in parts.items():
        table = pa.table({"id": list(range(len(texts))), "story": texts})
        pq.write_table(table, root / "data" / f"{name}.parquet")
    return root, stories


def _tokens_by_doc(ds, split):
    tokens = np.asarray(open_shard(ds.shard_path(split))[1])
    cuts = list(np.flatnonzero(tokens == ds.eot_id)) + [len(tokens)]
    return [ds.tokenizer.decode(tokens[a + 1:b]) for a, b in zip(cuts[:-1], cuts[1:])]


@needs_datasets
def test_hub_layout_with_its_validation_split(hub_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # a cache of its own, nothing shared
    root, stories = hub_repo
    src = hub_source(f"hf:{root}", text_column="story", val_split="validation")
    out = prepare_hub(src, tmp_path / "out", vocab_size=400, progress=False)
    ds = open_dataset(out)
    assert _tokens_by_doc(ds, "train") == stories[:120]  # both parquet parts, in order
    assert _tokens_by_doc(ds, "val") == stories[120:]
    assert ds.meta["source"]["splits"] == {"train": 120, "validation": 10}
    stamp = (out / "train.bin").stat().st_mtime_ns
    assert prepare_hub(src, out, vocab_size=400, progress=False) == out  # reused
    assert (out / "train.bin").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="other settings"):
        prepare_hub(src, out, vocab_size=500, progress=False)


@needs_datasets
def test_hub_layout_with_a_hash_split_and_bad_requests(hub_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root, stories = hub_repo
    out = prepare_hub(hub_source(f"hf:{root}", text_column="story"), tmp_path / "out",
                      vocab_size=400, val_fraction=0.2, seed=4, progress=False)
    ds = open_dataset(out)
    train, val = _tokens_by_doc(ds, "train"), _tokens_by_doc(ds, "val")
    assert sorted(train + val) == sorted(stories[:120]) and 5 < len(val) < 45
    with pytest.raises(DataError, match=r"no column 'text' \(columns: id, story\)"):
        prepare_hub(hub_source(f"hf:{root}"), tmp_path / "x", progress=False)
    with pytest.raises(DataError, match="Unknown split"):
        prepare_hub(hub_source(f"hf:{root}", text_column="story", split="test"), tmp_path / "y",
                    progress=False)


def test_names_and_default_directories():
    assert hub_source("tinystories") == ALIASES["tinystories"]
    assert hub_source("tinystories").repo == "roneneldan/TinyStories"
    assert hub_source("tinystories", val_split="other").val_split == "other"
    assert hub_source("hf:org/name").repo == "org/name" and hub_source("hf:") is None
    assert hub_source("corpus.txt") is None
    assert str(default_out_dir("hf:org/name")) == "data/org--name"
    assert str(default_out_dir("tinystories")) == "data/tinystories"


@needs_datasets
def test_offline_prepare_is_one_line(tmp_path):
    # HF_HUB_OFFLINE: the hub is treated as unreachable; the empty HF_HOME has nothing cached.
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = run_cli("prepare", "tinystories", "--no-progress", cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "cannot download roneneldan/TinyStories" in r.stderr
    assert "unreachable" in r.stderr and str(tmp_path / "hf") in r.stderr
    assert not (tmp_path / "data").exists()


def test_missing_datasets_library_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network probe
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(DataError, match=r"needs the `datasets` library.*pip install"):
        prepare_hub(hub_source("tinystories"), tmp_path / "out", progress=False)
