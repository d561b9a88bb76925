"""Helpers shared by the model, training, state, export and CLI tests: a small config, weights large
enough that comparisons mean something, a small prepared story corpus, and a checkpoint built on
it."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import xtrain
from xtrain.models import TinyTransformer, TransformerConfig

REPO = Path(__file__).resolve().parents[1]


def small_config(**overrides) -> TransformerConfig:
    base = dict(vocab_size=96, dim=32, n_layers=2, n_heads=2, head_dim=16, ffn_dim=48, max_seq=16)
    return TransformerConfig(**{**base, **overrides})


def random_weights(model, seed=0, std=0.3) -> dict:
    """name -> float32 array: matrices N(0, std^2), norm weights 1 + N(0, 0.1^2). Init-scale
    weights (0.02) would make logits and gradients so small that any tolerance passes."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_parameters():
        if len(p.shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
        else:
            out[name] = (std * rng.standard_normal(p.shape)).astype(np.float32)
    return out


def make_model(config, device="cpu", seed=0, weights_seed=None):
    model = TinyTransformer(config, device=device, seed=seed)
    if weights_seed is not None:
        model.load_state_dict(random_weights(model, weights_seed))
    return model


def batch(config, B=2, S=8, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(B, S), dtype=np.int64)
    targets = rng.integers(0, config.vocab_size, size=(B, S), dtype=np.int64)
    return ids, targets


def grads_numpy(model) -> dict:
    return {n: np.asarray(p.grad.numpy(), dtype=np.float64) for n, p in model.named_parameters()}


def prepared_stories(root: Path) -> Path:
    """A small prepared copy of the built-in stories (BPE 512), made once per directory."""
    from xtrain.data import prepare, write_corpus

    data = root / "stories-data"
    if not (data / "meta.json").is_file():
        corpus = write_corpus(root / "stories.txt", 400_000)
        prepare(corpus, data, vocab_size=512, val_fraction=0.05, progress=False)
    return data


def cli_env(env=None) -> dict:
    """The environment of a `python -m xtrain` subprocess: this one's (and `env` added), with the
    xtrain this process imported first on PYTHONPATH, then the caller's PYTHONPATH made absolute
    (where the libraries the extension loads may live), and no XTRAIN_DEBUG."""
    env = {**os.environ, **(env or {})}
    paths = [str(Path(xtrain.__file__).parent.parent)]
    paths += [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("XTRAIN_DEBUG", None)
    return env


def run_cli(*args, cwd=None, timeout=300, env=None):
    """`python -m xtrain ARGS` in a subprocess with this process's PYTHONPATH (and `env` added)."""
    env = cli_env(env)
    return subprocess.run([sys.executable, "-m", "xtrain", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def fp8_gemm_tolerance(K: int) -> float:
    """A bound on a Hopper FP8 GEMM's error over a reduction of length K, relative to the output's
    largest magnitude: the tensor cores keep ~14 bits of the running sum and drop the rest once per
    32-deep k-step (fast accumulation never promotes it to float32, so the error grows with K/32;
    with promotion it still appears between promotions). Measured on the H200 against an exact
    reference: 1.1e-4 at K=48 and 8e-5 at K=16 (dgrad), 5e-3 at K=6144 (forward); this is twice
    that model, 2^-12 per step."""
    return 2.0 ** -12 * -(-K // 32)


def bits_equal(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def tiny_run(out, data, steps, device="cpu", **kw):
    """The TrainConfig of a short tiny-preset run (batch 4 x 32, no evaluation, no saves but the
    last, no progress bar) of `steps` steps on prepared data, writing into `out`; kw overrides."""
    from xtrain.trainer.train import TrainConfig

    base = dict(preset="tiny", data=str(data), out=str(out), device=device, batch=4, seq=32,
                steps=steps, lr=3e-3, warmup=2, eval_every=0, save_every=0, sample_tokens=8,
                progress=False)
    return TrainConfig(**{**base, **kw})


def run_log(out) -> list[dict]:
    """The records of a run's log.jsonl."""
    import json

    return [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]

