"""bench/gpt2_peers.py measures what it says: its CPU smoke run trains xtrain's GPT-2 on the
shards it writes in llm.c's format, its parser reads llm.c's step lines as llm.c prints them, and
its llm.c build patches cudaMemAdvise for CUDA 13 and links cuDNN by its versioned name."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import gpt2_peers  # noqa: E402


def test_smoke_run_trains_xtrain_on_llmc_shards(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(BENCH / "gpt2_peers.py"), "--smoke", "--only", "xtrain",
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("gpt2_peers-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [(r["framework"], r["recompute"]) for r in rows] == [("xtrain", 0), ("xtrain", 1)]
    for r in rows:
        assert r["ms_step"] > 0 and r["tok_s"] > 0 and np.isfinite(r["loss_last"]), r
    shard = tmp_path / "work" / "data" / "gpt2peers_train_000000.bin"
    header = np.fromfile(shard, dtype="<i4", count=3)
    assert header[0] == 20240520 and header[1] == 1
    assert shard.stat().st_size == 1024 + 2 * header[2]


# nanoGPT's model.py interface as gpt2_peers.py calls it (GPTConfig, GPT, forward(idx, targets) ->
# (logits, loss), configure_optimizers): CI has no nanoGPT checkout, so the worker's own code runs
# here against this small stand-in (a bigram model), and on the GPU machine against the real one.
NANOGPT_STANDIN = """
from dataclasses import dataclass
import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets):
        logits = self.head(self.wte(idx))
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
"""


def test_smoke_run_trains_the_nanogpt_worker(tmp_path):
    (tmp_path / "nanogpt").mkdir()
    (tmp_path / "nanogpt" / "model.py").write_text(NANOGPT_STANDIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(BENCH / "gpt2_peers.py"), "--smoke", "--only", "nanogpt",
                           "--nanogpt", str(tmp_path / "nanogpt"), "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("gpt2_peers-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [r["framework"] for r in rows] == ["nanoGPT"] * len(rows) and rows, rows
    for r in rows:
        assert "error" not in r, r
        assert r["ms_step"] > 0 and r["tok_s"] > 0 and np.isfinite(r["loss_last"]), r


def test_parse_llmc_step_lines():
    out = "\n".join(
        f"step {i:4d}/31 | loss {11.0 - i * 0.01:7.6f} (+0.00z)| norm 5.1234 (+0.00z)| lr 6.00e-04 | "
        f"{ms:.2f} ms | {mfu:.1f}% bf16 MFU | 300000 tok/s"
        for i, ms, mfu in [(1, 900.0, 5.0), (2, 100.0, 40.0), (3, 110.0, 38.0), (4, 105.0, 39.0)])
    row = gpt2_peers.parse_llmc(out)
    assert row["ms_step"] == 105.0 and row["steps_timed"] == 3  # the first step left out
    assert abs(row["llmc_mfu"] - 0.39) < 1e-9 and row["loss_first"] == 10.99
    assert "error" in gpt2_peers.parse_llmc("no steps here")
    unknown_gpu = out.replace("39.0% bf16", "-100.0% bf16").replace("38.0% bf16", "-100.0% bf16") \
        .replace("40.0% bf16", "-100.0% bf16")
    row = gpt2_peers.parse_llmc(unknown_gpu)  # llm.c's MFU table lacks the H200: it prints -100.0%
    assert row["ms_step"] == 105.0 and row["llmc_mfu"] is None


def test_llmc_build_commands(tmp_path):
    plan = gpt2_peers.llmc_commands(tmp_path, False, None, True)
    assert plan["patch"][:2] == ["sed", "-i"] and "cudaMemLocationTypeHost" in plan["patch"][2]
    (link,) = plan["steps"]
    assert link[0] == "nvcc" and "train_gpt2.cu" in link and "-DENABLE_BF16" in link
    assert gpt2_peers.llmc_commands(tmp_path, False, None, False)["patch"] is None
    frontend = tmp_path / "frontend"
    (frontend / "include").mkdir(parents=True)
    fake = tmp_path / "nvidia" / "cudnn"
    (fake / "include").mkdir(parents=True)
    (fake / "include" / "cudnn.h").write_text("")
    (fake / "lib").mkdir()
    (fake / "lib" / "libcudnn.so.9").write_text("")
    roots = gpt2_peers.cuda_roots
    gpt2_peers.cuda_roots = lambda: [tmp_path / "toolkit", fake]
    try:
        plan = gpt2_peers.llmc_commands(tmp_path, True, frontend, True)
    finally:
        gpt2_peers.cuda_roots = roots
    obj, link = plan["steps"]
    assert "llmc/cudnn_att.cpp" in obj and "-DENABLE_CUDNN" in obj and f"-I{frontend / 'include'}" in obj
    assert str(fake / "lib" / "libcudnn.so.9") in link and "cudnn_att.o" in link
    assert str(fake / "lib") in plan["env"]["LD_LIBRARY_PATH"]
