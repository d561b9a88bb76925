"""The benchmarks' Muon and race options, in small CPU runs: bench/train_throughput.py --optimizer
muon steps Muon on both sides (the two frameworks' losses agree) and records it; bench/time_to_loss.py
--corpus reads a race corpus folder (scripts/race_corpus.py's layout) and records its manifest; the
GPT-2 PyTorch peer (transformers' GPT2LMHeadModel with xtrain's weights) computes xtrain's loss,
and its Muon split takes each block's four matrices."""

import json

import numpy as np
import pytest

import xtrain
from modelhelp import prepared_stories
from test_bench import BENCH, _bench_function, _run
from xtrain.models import GPT2, preset_config


def test_train_throughput_optimizer_muon_on_both_sides(tmp_path):
    result = _run("train_throughput.py", tmp_path, "--preset", "tiny", "--batch", "2", "--seq", "32", "--steps", "2",
                  "--warmup", "1", "--windows", "1", "--no-compile", "--vocab", "512", "--fp32", "--optimizer", "muon")
    assert result["args"]["optimizer"] == "muon" and not result["failed"]
    assert next(tmp_path.glob("*.json")).name.startswith("train_throughput-tiny-b2-s32-fp32-muon-")
    rows = {r["framework"]: r for r in result["results"]}
    assert set(rows) == {"xtrain", "torch eager"}
    xt, pt = rows["xtrain"]["loss_last"], rows["torch eager"]["loss_last"]
    assert abs(xt - pt) < 1e-3 * xt, (xt, pt)  # Muon's bf16 Newton-Schulz rounds in each framework's order
    assert rows["xtrain"]["loss_last"] != rows["xtrain"]["loss_first"]


def test_time_to_loss_reads_a_corpus_folder(tmp_path):
    corpus = tmp_path / "corpus"
    prepared_stories(corpus)
    (corpus / "stories-data").rename(corpus / "data")
    manifest = {"what": "a test corpus", "data": "data", "packages": []}
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    result = _run("time_to_loss.py", tmp_path / "out", "--corpus", str(corpus), "--preset", "tiny", "--batch", "2",
                  "--seq", "64", "--steps", "2", "--warmup", "1", "--eval-every", "2", "--eval-batches", "1",
                  "--targets", "9", "--lrs", "1e-3", "--fp32", "--compile-mode", "none",
                  "--arms", "xtrain-muon-nodoc,torch-muon")
    assert result["corpus"] == manifest and result["data"] == str(corpus / "data")
    a, b = (result["runs"][arm]["0.001"]["curve"][-1]["val_loss"] for arm in ("xtrain-muon-nodoc", "torch-muon"))
    assert abs(a - b) < 1e-3 * a, (a, b)
    assert "torch_muon_token_ratio" not in result["summary"]["9.0"]  # no torch-adamw arm ran


def test_gpt2_torch_peer_computes_xtrains_loss_and_splits_the_matrices(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(BENCH))  # the script's own imports (torch_model) at call time
    torch_gpt2 = _bench_function("time_to_loss", "torch_gpt2")
    torch_optimizers = _bench_function("time_to_loss", "torch_optimizers")
    cfg = preset_config("gpt2-124m", 96, n_layers=2, dim=32, n_heads=2, max_seq=16)
    model = GPT2(cfg, seed=1)
    weights = {n: p.numpy().copy() for n, p in model.named_parameters()}
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 96, (2, 16)), rng.integers(0, 96, (2, 16))
    with xtrain.no_grad():
        want = model(xtrain.tensor(ids), xtrain.tensor(targets))[1].item()
    peer = torch_gpt2(weights, cfg, "cpu")
    got = peer(torch.from_numpy(ids), torch.from_numpy(targets))[1].item()
    assert abs(got - want) < 1e-5 * want, (got, want)
    muon, adamw = torch_optimizers("torch-muon", peer, 1e-3)
    matrices = {id(p) for group in muon.param_groups for p in group["params"]}
    named = dict(peer.named)
    assert matrices == {id(named[f"transformer.h.{i}.{n}.weight"]) for i in range(2)
                        for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    rest = [p for group in adamw.param_groups for p in group["params"]]
    assert len(rest) + len(matrices) == len(named)
    assert len(torch_optimizers("torch-adamw", peer, 1e-3)) == 1
