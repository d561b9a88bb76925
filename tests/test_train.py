"""Optimizer and training loop: AdamW + clipping against torch over 10 steps, the LR schedule, the
loop's outputs, and resume bit-exactness (N + save + load + N == 2N, losses and weights bitwise)."""

import json
import math

import numpy as np
import pytest
import torch

import xtrain
from xtrain import graphs, ops
from modelhelp import prepared_stories, run_log, tiny_run
from xtrain.trainer import runconfig
from xtrain.optim import AdamW, clip_grad_norm_
from xtrain.trainer.schedule import cosine_lr
from xtrain.trainer.train import train

SHAPES = {"w1": (8, 6), "b1": (6,), "emb": (10, 4), "norm": (4,)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("train-data"))


def test_adamw_and_clipping_match_torch(device):
    rng = np.random.default_rng(0)
    init = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    xs = {n: xtrain.tensor(a, device=device, requires_grad=True) for n, a in init.items()}
    ts = {n: torch.nn.Parameter(torch.tensor(a)) for n, a in init.items()}
    opt = AdamW(list(xs.items()), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert [opt.names[i] for i in opt.decay] == ["w1", "emb"]  # 2-D weights decay, 1-D do not
    ref = torch.optim.AdamW([{"params": [ts["w1"], ts["emb"]], "weight_decay": 0.1},
                             {"params": [ts["b1"], ts["norm"]], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    clipped = 0
    for step in range(10):
        lr = cosine_lr(step, 1e-2, 1e-3, 3, 10)
        opt.lr = lr
        for group in ref.param_groups:
            group["lr"] = lr
        scale = 3.0 if step % 2 == 0 else 0.05  # alternately above and below max_norm
        for n in SHAPES:
            g = (scale * rng.standard_normal(SHAPES[n])).astype(np.float32)
            xs[n].grad = xtrain.tensor(g, device=device)
            ts[n].grad = torch.tensor(g)
        norm = clip_grad_norm_(list(xs.values()), 1.0)
        ref_norm = torch.nn.utils.clip_grad_norm_(list(ts.values()), 1.0)
        assert norm.dtype == "float32" and norm.device.startswith(device)
        np.testing.assert_allclose(norm.item(), ref_norm.item(), rtol=1e-6)
        clipped += ref_norm.item() > 1.0
        for n in SHAPES:
            np.testing.assert_allclose(xs[n].grad.numpy(), ts[n].grad.numpy(), rtol=1e-6, atol=1e-7)
        opt.step()
        ref.step()
        opt.zero_grad()
        assert all(x.grad is None for x in xs.values())
        for n in SHAPES:
            np.testing.assert_allclose(xs[n].numpy(), ts[n].detach().numpy(), rtol=2e-6, atol=2e-7,
                                       err_msg=f"{n} after step {step + 1}")
    assert clipped == 5
    assert opt.state_dict()["step"] == 10


def test_adamw_state_round_trip_and_errors(device):
    p = xtrain.tensor(np.ones((3, 2), np.float32), device=device, requires_grad=True)
    opt = AdamW([("p", p)], lr=0.1)
    p.grad = xtrain.tensor(np.full((3, 2), 0.5, np.float32), device=device)
    opt.step()
    st = opt.state_dict()
    other = AdamW([("p", xtrain.tensor(np.ones((3, 2), np.float32), device=device, requires_grad=True))])
    other.load_state_dict(st)
    assert other.step_count == 1 and other.lr == 0.1
    np.testing.assert_array_equal(other.exp_avg[0].numpy(), opt.exp_avg[0].numpy())
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({**st, "exp_avg": {}})
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict({**st, "exp_avg": {"p": np.zeros((2, 3), np.float32)}})
    with pytest.raises(TypeError, match="float32"):
        AdamW([xtrain.tensor(np.ones(2), dtype="float64", requires_grad=True)])
    with pytest.raises(ValueError, match="betas"):
        AdamW([p], betas=(0.9, 1.5))


def test_cosine_lr():
    lrs = [cosine_lr(s, 1.0, 0.1, 10, 100) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))            # warm-up rises
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101]))     # then decays
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[100] == lrs[119] == 0.1


def _losses(out):
    return [(r["step"], r["loss"]) for r in run_log(out) if "loss" in r]


def test_train_writes_log_checkpoint_plot_and_sample(tmp_path, data, device):
    summary = train(tiny_run(tmp_path, data, 6, device, eval_every=3, eval_batches=2))
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(6))
    want = {"step", "loss", "lr", "grad_norm", "tok_s", "ms", "mem_mb"} | ({"mfu"} if device == "cuda" else set())
    assert set(steps[0]) == want
    assert [r["step"] for r in records if "val_loss" in r] == [0, 3, 6]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps)
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prompt = runconfig.read_toml(tmp_path / "config.toml")["sample_prompt"]  # the start of a val document
    assert prompt and (tmp_path / "sample.txt").read_text().startswith(prompt)
    assert summary["steps"] == 6 and (tmp_path / "ckpt" / "state.json").is_file()


def test_resume_is_bit_exact(tmp_path, data, device):
    # dropout > 0 makes the RNG state part of what must be restored.
    kw = dict(decay_steps=8, dropout=0.1)
    train(tiny_run(tmp_path / "straight", data, 8, device, **kw))
    train(tiny_run(tmp_path / "split", data, 4, device, **kw))
    train(tiny_run(tmp_path / "split", data, 8, device, resume=str(tmp_path / "split" / "ckpt"), **kw))
    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "split")
    assert [s for s, _ in b] == list(range(8))
    assert a == b  # floats from JSON: equal means bitwise equal
    for name in ("model.safetensors", "optim.safetensors"):
        assert (tmp_path / "straight" / "ckpt" / name).read_bytes() == \
            (tmp_path / "split" / "ckpt" / name).read_bytes(), name


def test_resume_rejects_another_preset(tmp_path, data, device):
    train(tiny_run(tmp_path, data, 1, device))
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        train(tiny_run(tmp_path, data, 2, device, preset="dim384", resume=str(tmp_path / "ckpt")))


class _OneRankContext:
    """A one-rank stand-in for xtrain.launch.distributed.RankContext on any device: the collectives are
    the identity, so the data-parallel code path of train() must give the single-device run."""

    def __init__(self, device):
        self.rank, self.world_size, self.is_main, self.devices = 0, 1, True, [0]
        self.device = "cpu" if device == "cpu" else "cuda:0"
        self.comm, self.calls = self, []

    def check(self):
        self.calls.append("check")

    def broadcast(self, tensors, root=0):
        self.calls.append("broadcast")

    def all_reduce(self, tensors, op="avg"):
        self.calls.append(("all_reduce", len(tensors), op))

    def reduce_scatter(self, flat, op="avg", extra=()):
        self.calls.append(("reduce_scatter", len(extra), op))

    def all_gather(self, flat):
        self.calls.append("all_gather")

    def exchange(self, key, value):
        self.calls.append(("exchange", key))
        return [value]

    def note_replay(self):
        self.calls.append("note_replay")

    def describe(self):
        return f"1 GPU ({self.device})"


def test_data_parallel_path_of_train_matches_one_device(tmp_path, data, device):
    """train(cfg, ctx=...) is the loop every rank of `xtrain train --devices N` runs; with one rank
    and identity collectives it must reproduce train(cfg) bit for bit, with no --lr given (the
    preset's learning rate)."""
    from xtrain.io import state as ckpt_state
    from xtrain.data import open_dataset

    kw = dict(lr=None, eval_every=3, eval_batches=2)
    train(tiny_run(tmp_path / "single", data, 5, device, **kw))
    ctx = _OneRankContext(device)
    cfg = tiny_run(tmp_path / "rank", data, 5, device, **kw)
    xtrain.manual_seed(cfg.seed)  # what train_data_parallel does before starting the ranks
    summary = train(cfg, ctx=ctx, prepared=(open_dataset(data), None))
    assert _losses(tmp_path / "single") == _losses(tmp_path / "rank")
    assert summary["devices"] == [0] and summary["steps"] == 5
    assert ctx.calls.count("broadcast") == 1 and ctx.calls.count("check") == 5
    reduces = [c for c in ctx.calls if isinstance(c, tuple) and c[0] == "all_reduce"]
    assert len(reduces) == 3  # one per evaluation (steps 0, 3, 5); one rank needs no norm reduction
    # Per step one reduce-scatter (gradients + loss) and one all-gather (the weights); one more per
    # moment (gathered in turn for rank 0 to save) before the final save. On CUDA the step is
    # captured after the warm-up: the capture step calls them once, the replays re-run the captured
    # work without calling them, and each replay is noted for the watchdog.
    host_steps = 5 if device == "cpu" else graphs.WARMUP_STEPS + 1
    assert ctx.calls.count(("reduce_scatter", 1, "avg")) == host_steps
    assert ctx.calls.count("all_gather") == host_steps + 2
    assert ctx.calls.count("note_replay") == 5 - host_steps + (device != "cpu")
    assert ctx.calls.count(("exchange", "rank_rng")) == 1  # every rank's generator, final checkpoint
    assert (tmp_path / "single" / "ckpt" / "model.safetensors").read_bytes() == \
        (tmp_path / "rank" / "ckpt" / "model.safetensors").read_bytes()
    assert ckpt_state.load(tmp_path / "rank" / "ckpt").step == 5


def test_data_parallel_resume_with_dropout_is_bit_exact(tmp_path, data, device):
    """The rank path saves every rank's device generator ("rank_rng") and each rank restores its
    own, so a resumed run with dropout draws the masks the uninterrupted run draws."""
    from xtrain.io import state as ckpt_state
    from xtrain.data import open_dataset

    def run(out, steps, resume=False):
        cfg = tiny_run(out, data, steps, device, dropout=0.1, decay_steps=6,
                   resume=str(out / "ckpt") if resume else None)
        if not resume:
            xtrain.manual_seed(cfg.seed)
        ckpt = ckpt_state.load(cfg.resume) if resume else None
        train(cfg, ctx=_OneRankContext(device), prepared=(open_dataset(data), ckpt))

    run(tmp_path / "full", 6)
    run(tmp_path / "part", 3)
    meta = ckpt_state.load(tmp_path / "part" / "ckpt").meta
    assert len(meta["rank_rng"]) == 1
    xtrain.manual_seed(12345)  # whatever the generators hold now, resume must put them back
    run(tmp_path / "part", 6, resume=True)
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")


def test_a_non_finite_step_updates_nothing(device):
    """AdamW's guard (the step's norm + 0 * loss): NaN or Inf anywhere skips the update on the
    device, weights and moments alike; a finite guard changes nothing about the step."""
    from xtrain.models import TinyTransformer, TransformerConfig
    from xtrain.optim import step_guard

    cfg = TransformerConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, head_dim=16, ffn_dim=64, max_seq=8)
    ids = np.random.default_rng(0).integers(0, 64, (2, 8))
    runs = []
    for poison in (None, "grad", "loss"):
        model = TinyTransformer(cfg, device=device, seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        for step in range(2):
            _, loss = model(ids, ids)
            loss.backward()
            if step == 1 and poison == "grad":
                model.layers[0].mlp.up_proj.weight.grad.fill_(float("inf"))
            if step == 1 and poison == "loss":
                loss = ops.mul(loss, float("nan"))
            if step == 1:
                before = {n: p.numpy().copy() for n, p in model.named_parameters()}
                moments = {n: a.copy() for n, a in opt.moment_arrays()[0].items()}
            norm = clip_grad_norm_(opt.params, 1.0)
            opt.step(guard=step_guard(norm, loss))
            opt.zero_grad()
        runs.append({n: p.numpy().copy() for n, p in model.named_parameters()})
        if poison is not None:
            for n, p in model.named_parameters():
                np.testing.assert_array_equal(p.numpy(), before[n], err_msg=n)
                np.testing.assert_array_equal(opt.moment_arrays()[0][n], moments[n], err_msg=n)
    assert any(not np.array_equal(runs[0][n], runs[1][n]) for n in runs[0])  # the clean run did step


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(tmp_path, data, device):
    from xtrain.trainer.cli import main
    from xtrain.trainer.train import NonFiniteStepsError

    # lr 1e6 ruins the weights within a few steps; the loss then stays NaN, and the run stops. (No
    # saves meanwhile: a save of such weights is set aside as diverged, tests/test_reliability_runs.py.)
    cfg = tiny_run(tmp_path / "run", data, 40, device, lr=1e6, warmup=1, save_every=0, nonfinite_limit=3)
    with pytest.raises(NonFiniteStepsError, match="3 steps in a row") as e:
        train(cfg)
    assert f"To go on, start again: xtrain train --out {tmp_path / 'run'} --overwrite" in str(e.value)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r.get("skipped")]
    assert len(skipped) == 3 and all(not (np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])) for r in skipped)
    assert [r["step"] for r in skipped] == list(range(skipped[0]["step"], skipped[0]["step"] + 3))
    assert not (tmp_path / "run" / "ckpt").exists()  # no checkpoint of those weights
    # the command line: one line, exit status 1
    code = main(["train", "--data", str(data), "--out", str(tmp_path / "cli"), "--preset", "tiny", "--fp32",
                 "--batch", "4", "--seq", "32", "--steps", "40", "--lr", "1e6", "--warmup", "1",
                 "--eval-every", "0", "--nonfinite-limit", "2", "--no-progress", "--device", device])
    assert code == 1


def test_read_async_gives_the_values(device):
    """xtrain.cuda.read_async: the training loop's one-step-late read of loss and norm."""
    a = xtrain.tensor(np.float32(2.5), device=device)
    b = xtrain.tensor(np.array([7], np.int64), device=device)
    pending = xtrain.cuda.read_async([ops.mul(a, 2.0), b, a.to("bfloat16")])
    assert pending.wait() == [5.0, 7, 2.5] and pending.ready()
    with pytest.raises(ValueError, match="one-element"):
        xtrain.cuda.read_async([xtrain.zeros((2,), device=device)])


def test_read_array_async_gives_the_tensor_as_queued(device):
    """xtrain.cuda.read_array_async: a whole tensor's values at the point the read was queued (generate's
    token ring), any size (pinned slots beyond the scalar reads' 64 bytes), reused across reads."""
    ring = xtrain.tensor(np.arange(32 * 3, dtype=np.int64).reshape(32, 3), device=device)
    first = xtrain.cuda.read_array_async(ring)
    ring.copy_(xtrain.tensor(2 * np.arange(96).reshape(32, 3), device=device))  # queued after the read
    second = xtrain.cuda.read_array_async(ring)
    got = first.wait()
    assert got.dtype == np.int64 and got.shape == (32, 3) and first.ready()
    np.testing.assert_array_equal(got, np.arange(96).reshape(32, 3))
    np.testing.assert_array_equal(second.wait(), 2 * np.arange(96).reshape(32, 3))
    for shape, dtype in [((5,), "float32"), ((2, 2), "float64"), ((0, 4), "int64"), ((300,), "int32")]:
        want = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
        out = xtrain.cuda.read_array_async(xtrain.tensor(want, device=device)).wait()
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want)
    with pytest.raises(TypeError, match="bfloat16"):
        xtrain.cuda.read_array_async(xtrain.zeros((2,), device=device).to("bfloat16"))
