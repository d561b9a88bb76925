"""Muon (xtrain.optim.Muon, _C.optim.muon_step): its update against torch.optim.Muon (with
torch.optim.AdamW for the other parameters), the non-finite guard, the device constants of CUDA
graphs, state and checkpoints, and the trainer's gates with --optimizer muon: determinism, resume
bit-exact, recompute on/off bitwise, the CLI flag, graphs on/off bitwise (GPU), bad inputs.

Tolerance against torch: the Newton-Schulz iteration runs in bf16 (8-bit mantissa) on GEMMs that
accumulate in float32 in an order of their own, and the momentum's lerp may round once more or
less (a fused multiply-add), so an input one bf16 rounding apart can come out of the five
iterations a few bf16 units apart. The orthogonalised update's entries are at most about 1, so
one step's parameters agree to within tol * lr * ratio (ratio: adjust_lr's factor, tol four bf16
units of a unit entry on the CPU, eight on CUDA); the momentum buffers and the AdamW part are float32 and agree
to float32 rounding."""

import json
import math

import numpy as np
import pytest
import torch

import xtrain
from modelhelp import batch, make_model, prepared_stories, run_cli, run_log, small_config, tiny_run
from xtrain import _C, graphs, ops
from xtrain.optim import AdamW, Muon, muon_lr_ratio, step_guard
from xtrain.trainer.train import train

BF16_UPDATE_TOL = 4 * 2.0 ** -8  # CPU (measured: at most 2.5 units); CUDA: twice this (cuBLAS's own orders)
NS = dict(ns_coefficients=(3.4445, -4.7750, 2.0315), ns_steps=5)
needs_gpu = pytest.mark.skipif(not xtrain.cuda.is_available(),
                               reason="needs a CUDA GPU (the lead runs these on the H200)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("muon-data"))


def _update_tol(device) -> float:
    return BF16_UPDATE_TOL * (2 if device.startswith("cuda") else 1)


def _state(opt) -> dict:
    """The optimizer's state arrays as "<kind>.<name>" -> a copy (a checkpoint's tensor names)."""
    return {f"{kind}.{n}": a.copy() for kind, arrays in opt.state_arrays().items() for n, a in arrays.items()}


def _block_matrices(model):
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and len(p.shape) == 2]


# ---------------------------------------------------------------- the update against torch

@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_step_matches_torch(device, adjust, nesterov):
    """Plain tensors (one per-tensor launch list): tall, wide and square matrices, two of one shape
    (batched into one GEMM), a 1-D parameter for AdamW; fixed random gradients, clipping on."""
    rng = np.random.default_rng(0)
    shapes = {"wide": (12, 40), "tall": (40, 12), "wide2": (12, 40), "square": (24, 24), "norm": (24,)}
    init = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    xs = {n: xtrain.tensor(a, device=device, requires_grad=True) for n, a in init.items()}
    ts = {n: torch.nn.Parameter(torch.tensor(a)) for n, a in init.items()}
    mats = ["wide", "tall", "wide2", "square"]
    lr, wd = 2e-2, 0.1
    opt = Muon(list(xs.items()), matrices=mats, lr=lr, weight_decay=wd, nesterov=nesterov, adjust_lr_fn=adjust)
    ref_m = torch.optim.Muon([ts[n] for n in mats], lr=lr, weight_decay=wd, nesterov=nesterov, adjust_lr_fn=adjust)
    ref_a = torch.optim.AdamW([ts["norm"]], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=False)
    for step in range(4):
        step_lr = lr * (1.0 - 0.2 * step)  # a schedule: every step its own learning rate
        opt.lr = step_lr
        for g in ref_m.param_groups + ref_a.param_groups:
            g["lr"] = step_lr
        scale = 3.0 if step % 2 == 0 else 0.05  # alternately clipped and not
        for n, s in shapes.items():
            g = (scale * rng.standard_normal(s)).astype(np.float32)
            xs[n].grad = xtrain.tensor(g, device=device)
            ts[n].grad = torch.tensor(g)
        before = {n: x.numpy().copy() for n, x in xs.items()}
        for n in ts:  # the same weights and momentum going into this step: the step's own error
            ts[n].data = torch.tensor(before[n])
        for n, b in zip(mats, opt.momentum_buffers):
            if ts[n] in ref_m.state:
                ref_m.state[ts[n]]["momentum_buffer"] = torch.tensor(b.numpy())
        norm = opt.clip_and_step(1.0)
        ref_norm = torch.nn.utils.clip_grad_norm_(list(ts.values()), 1.0)
        np.testing.assert_allclose(norm.item(), ref_norm.item(), rtol=1e-6)
        ref_m.step()
        ref_a.step()
        opt.zero_grad()
        for n, b in zip(mats, opt.momentum_buffers):
            np.testing.assert_allclose(b.numpy(), ref_m.state[ts[n]]["momentum_buffer"].numpy(), rtol=1e-6,
                                       atol=1e-7, err_msg=f"momentum of {n} after step {step + 1}")
        for n in mats:
            step_size = step_lr * muon_lr_ratio(adjust, shapes[n])
            got, want = xs[n].numpy(), ts[n].detach().numpy()
            assert np.abs(got - want).max() <= _update_tol(device) * step_size, (n, step, np.abs(got - want).max())
            assert np.abs(got - before[n]).max() > 0.1 * step_size  # the step moved the weights
        np.testing.assert_allclose(xs["norm"].numpy(), ts["norm"].detach().numpy(), rtol=2e-6, atol=2e-7)
    assert opt.step_count == 4


def test_muon_on_a_model_matches_torch(device):
    """A model's store (the flat path): Muon for the blocks' matrices, AdamW (2-D decaying, 1-D
    not) for the embedding, the head and the norms, on the model's own gradients."""
    cfg = small_config()
    model = make_model(cfg, device=device, weights_seed=1)
    mats = _block_matrices(model)
    assert len(mats) == 7 * cfg.n_layers
    lr, wd = 1e-2, 0.1
    opt = Muon(model.named_parameters(), matrices=mats, lr=lr, weight_decay=wd)
    named = dict(model.named_parameters())
    ts = {n: torch.nn.Parameter(torch.tensor(p.numpy())) for n, p in named.items()}
    ref_m = torch.optim.Muon([ts[n] for n in mats], lr=lr, weight_decay=wd, adjust_lr_fn="match_rms_adamw")
    ref_a = torch.optim.AdamW(
        [{"params": [ts[n] for n, p in named.items() if n not in mats and len(p.shape) == 2], "weight_decay": wd},
         {"params": [ts[n] for n, p in named.items() if len(p.shape) == 1], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for step in range(3):
        ids, targets = batch(cfg, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        for n, p in named.items():
            ts[n].grad = torch.tensor(p.grad.numpy())
            ts[n].data = torch.tensor(p.numpy())
        for n, b in zip(mats, opt.momentum_buffers):
            if ts[n] in ref_m.state:
                ref_m.state[ts[n]]["momentum_buffer"] = torch.tensor(b.numpy())
        adam_state = opt.state_arrays()
        for n, p in named.items():
            if n not in mats and ts[n] in ref_a.state:
                ref_a.state[ts[n]]["exp_avg"] = torch.tensor(adam_state["exp_avg"][n])
                ref_a.state[ts[n]]["exp_avg_sq"] = torch.tensor(adam_state["exp_avg_sq"][n])
        opt.clip_and_step(1.0, loss)
        torch.nn.utils.clip_grad_norm_(list(ts.values()), 1.0)
        ref_m.step()
        ref_a.step()
        opt.zero_grad()
        st = opt.state_arrays()
        for n, p in named.items():
            got, want = p.numpy(), ts[n].detach().numpy()
            if n in mats:
                tol = _update_tol(device) * lr * muon_lr_ratio("match_rms_adamw", p.shape)
                assert np.abs(got - want).max() <= tol, (n, step)
                np.testing.assert_allclose(st["momentum_buffer"][n], ref_m.state[ts[n]]["momentum_buffer"].numpy(),
                                           rtol=1e-6, atol=1e-7, err_msg=n)
                assert n not in st["exp_avg"] and n not in st["exp_avg_sq"]  # no AdamW moment of a matrix
            else:
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7, err_msg=f"{n} after step {step + 1}")


# ---------------------------------------------------------------- guard, determinism, device constants

@pytest.mark.parametrize("poison", ["grad", "loss"])
def test_a_non_finite_step_writes_nothing(device, poison):
    cfg = small_config()
    model = make_model(cfg, device=device, weights_seed=2)
    opt = Muon(model.named_parameters(), matrices=_block_matrices(model), lr=1e-2)
    for step in range(2):
        ids, targets = batch(cfg, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        if step == 1:
            if poison == "grad":
                model.layers[0].mlp.up_proj.weight.grad.fill_(float("inf"))
            else:
                loss = ops.mul(loss, float("nan"))
            before = {n: p.numpy().copy() for n, p in model.named_parameters()}
            moments = _state(opt)
        opt.clip_and_step(1.0, loss)
        opt.zero_grad()
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), before[n], err_msg=n)
    for key, a in _state(opt).items():
        np.testing.assert_array_equal(a, moments[key], err_msg=key)


def _train_small(device, hyper=False, prepared=False, steps=4):
    cfg = small_config()
    model = make_model(cfg, device=device, weights_seed=3)
    opt = Muon(model.named_parameters(), matrices=_block_matrices(model), lr=1e-2)
    if hyper:
        opt.use_device_hyper()
    losses = []
    for step in range(steps):
        opt.lr = 1e-2 / (step + 1)
        ids, targets = batch(cfg, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        if prepared:
            opt.prepare_step()
        opt.clip_and_step(1.0, loss, prepared=prepared)
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.numpy().copy() for n, p in model.named_parameters()}, _state(opt)


def test_muon_is_deterministic_and_device_constants_give_the_same_bits(device):
    base = _train_small(device)
    for kw in ({}, {"hyper": True}, {"hyper": True, "prepared": True}):
        got = _train_small(device, **kw)
        assert got[0] == base[0], kw
        for a, b in zip(got[1:], base[1:]):
            for n in b:
                np.testing.assert_array_equal(a[n], b[n], err_msg=f"{n} {kw}")


def test_prepare_step_needs_device_constants():
    model = make_model(small_config())
    opt = Muon(model.named_parameters(), matrices=_block_matrices(model))
    with pytest.raises(RuntimeError, match="use_device_hyper"):
        opt.prepare_step()
    with pytest.raises(RuntimeError, match="use_device_hyper"):
        opt.step(prepared=True)


def test_muon_consts_are_what_the_step_reads():
    decay, lr = _C.optim.muon_consts(3e-3, 0.1)
    assert decay == float(np.float32(1.0 - 3e-3 * 0.1)) and lr == float(np.float32(3e-3))


def test_capture_step_equals_eager_with_muon(monkeypatch):
    """test_graphs' stand-in graph (the 'captured' work runs as it is queued): the capture step,
    Muon's prepared step on device constants, equals the eager step bit for bit."""
    from test_graphs import _RunAtOnce

    monkeypatch.setattr(xtrain.cuda, "Graph", _RunAtOnce)
    monkeypatch.setattr(_RunAtOnce, "made", 0)
    monkeypatch.setattr(_RunAtOnce, "fail_at", None)
    cfg = small_config()
    rng = np.random.default_rng(1)
    batches = [(b, b) for b in (rng.integers(0, cfg.vocab_size, (2, 8)) for _ in range(3))]
    results = []
    for use_graphs in (False, True):
        model = make_model(cfg, weights_seed=4)
        opt = Muon(model.named_parameters(), matrices=_block_matrices(model), lr=1e-2)
        sg = graphs.StepGraphs(model, opt, 1, 1.0, note=lambda msg: None)
        values = []
        for x, y in batches:
            out = sg.step(x, y) if use_graphs else None
            if out is None:
                loss = graphs.forward_backward(model, x, y, 1)
                norm = opt.clip_and_step(1.0, loss)
                opt.zero_grad(set_to_none=True)
                sg.eager()
            else:
                loss, norm = out
            values.append((loss.item(), norm.item()))
        assert sg.active == use_graphs and opt.step_count == 3
        results.append((values, {n: p.numpy().copy() for n, p in model.named_parameters()}, _state(opt)))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1:], results[1][1:]):
        for n in a:
            np.testing.assert_array_equal(a[n], b[n], err_msg=n)


# ---------------------------------------------------------------- state

def test_state_round_trip_and_refusals():
    cfg = small_config()
    model = make_model(cfg, weights_seed=5)
    mats = _block_matrices(model)
    opt = Muon(model.named_parameters(), matrices=mats, lr=1e-2, momentum=0.9, adjust_lr_fn="original")
    ids, targets = batch(cfg)
    _, loss = model(ids, targets)
    loss.backward()
    opt.clip_and_step(1.0, loss)
    st = opt.state_dict()
    assert st["hyper"]["optimizer"] == "muon" and st["hyper"]["muon"]["matrices"] == mats
    json.dumps(st["hyper"])  # what the checkpoint's state.json holds
    other = Muon(make_model(cfg).named_parameters(), matrices=mats)
    other.load_state_dict(st)
    assert other.step_count == 1 and other.momentum == 0.9 and other.adjust_lr_fn == "original"
    assert other.lr_ratios == opt.lr_ratios
    for a, b in zip(other.momentum_buffers, opt.momentum_buffers):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    adamw = AdamW(make_model(cfg).named_parameters())
    with pytest.raises(ValueError, match="muon's, not AdamW's"):
        adamw.load_state_dict(st)
    with pytest.raises(ValueError, match="adamw's"):
        other.load_state_dict(adamw.state_dict())
    with pytest.raises(ValueError, match="matrices"):
        Muon(make_model(cfg).named_parameters(), matrices=mats[:3]).load_state_dict(st)
    bad = {**st, "hyper": {**st["hyper"], "muon": {**st["hyper"]["muon"], "adjust_lr_fn": "nope"}}}
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        other.load_state_dict(bad)


# ---------------------------------------------------------------- bad inputs

def test_bad_arguments_are_clear_errors():
    model = make_model(small_config())
    mats = _block_matrices(model)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon(named, matrices=mats, adjust_lr_fn="spectral")
    with pytest.raises(ValueError, match="momentum"):
        Muon(named, matrices=mats, momentum=-0.1)
    with pytest.raises(ValueError, match="momentum"):
        Muon(named, matrices=mats, momentum=1.0)
    with pytest.raises(ValueError, match="ns_steps"):
        Muon(named, matrices=mats, ns_steps=0)
    with pytest.raises(ValueError, match="ns_coefficients"):
        Muon(named, matrices=mats, ns_coefficients=(1.0, 2.0))
    with pytest.raises(ValueError, match="ns_eps"):
        Muon(named, matrices=mats, ns_eps=0.0)
    with pytest.raises(ValueError, match="nesterov"):
        Muon(named, matrices=mats, nesterov="yes")
    with pytest.raises(ValueError, match="2-D"):
        Muon(named, matrices=["layers.0.input_layernorm.weight"])
    with pytest.raises(ValueError, match="not among"):
        Muon(named, matrices=["layers.9.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match="no matrix"):
        Muon(named, matrices=[])
    with pytest.raises(ValueError, match="lr"):
        Muon(named, matrices=mats, lr=-1.0)


def test_op_checks_its_arguments():
    p = xtrain.zeros((4, 6), dtype="float32")
    g = xtrain.zeros((4, 6), dtype="float32")
    b = xtrain.zeros((4, 6), dtype="float32")
    args = dict(lr=1e-2, weight_decay=0.1, momentum=0.95, nesterov=True, eps=1e-7, lr_ratios=[1.0], **NS)
    _C.optim.muon_step([p], [g], [b], **args)
    with pytest.raises(ValueError, match="differ in shape"):
        _C.optim.muon_step([p], [xtrain.zeros((6, 4), dtype="float32")], [b], **args)
    with pytest.raises(ValueError, match="2-D"):
        _C.optim.muon_step([xtrain.zeros((24,), dtype="float32")], [xtrain.zeros((24,), dtype="float32")],
                           [xtrain.zeros((24,), dtype="float32")], **args)
    with pytest.raises(TypeError, match="float32"):
        _C.optim.muon_step([p], [g.to(dtype="bfloat16")], [b], **args)
    with pytest.raises(ValueError, match="same length"):
        _C.optim.muon_step([p], [g], [b], **{**args, "lr_ratios": [1.0, 2.0]})
    with pytest.raises(ValueError, match="momentum"):
        _C.optim.muon_step([p], [g], [b], **{**args, "momentum": -0.5})
    with pytest.raises(ValueError, match="ns_steps"):
        _C.optim.muon_step([p], [g], [b], **{**args, "ns_steps": 100})
    with pytest.raises(ValueError, match="ns_coefficients"):
        _C.optim.muon_step([p], [g], [b], **{**args, "ns_coefficients": [1.0, float("nan"), 2.0]})
    with pytest.raises(ValueError, match="lr_ratios"):
        _C.optim.muon_step([p], [g], [b], **{**args, "lr_ratios": [0.0]})
    with pytest.raises(TypeError, match="hyper"):
        _C.optim.muon_step([p], [g], [b], **args, hyper=xtrain.zeros((3,), dtype="float32"))
    with pytest.raises(ValueError, match="max_norm"):
        _C.optim.muon_step([p], [g], [b], **args, clip_norm=xtrain.zeros((), dtype="float32"), max_norm=0.0)


# ---------------------------------------------------------------- the trainer (--optimizer muon)

def _losses(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in run_log(out) if "loss" in r]


def _same_checkpoints(a, b):
    for name in ("model.safetensors", "optim.safetensors"):
        assert (a / "ckpt" / name).read_bytes() == (b / "ckpt" / name).read_bytes(), name


def test_train_with_muon_is_deterministic_and_learns(tmp_path, data, device):
    train(tiny_run(tmp_path / "a", data, 6, device, optimizer="muon"))
    train(tiny_run(tmp_path / "b", data, 6, device, optimizer="muon"))
    train(tiny_run(tmp_path / "adamw", data, 6, device))
    a = _losses(tmp_path / "a")
    assert a == _losses(tmp_path / "b") and len(a) == 6
    assert a[-1][1] < a[0][1]
    assert a != _losses(tmp_path / "adamw")  # the flag did change the optimizer
    _same_checkpoints(tmp_path / "a", tmp_path / "b")
    state = json.loads((tmp_path / "a" / "ckpt" / "state.json").read_text())
    assert state["optimizer"]["hyper"]["optimizer"] == "muon"
    assert "optimizer = \"muon\"" in (tmp_path / "a" / "config.toml").read_text()


def test_train_resume_with_muon_is_bit_exact(tmp_path, data, device):
    kw = dict(decay_steps=8, optimizer="muon")
    train(tiny_run(tmp_path / "straight", data, 8, device, **kw))
    train(tiny_run(tmp_path / "split", data, 4, device, **kw))
    train(tiny_run(tmp_path / "split", data, 8, device, resume=str(tmp_path / "split" / "ckpt"), **kw))
    assert [s for s, _, _ in _losses(tmp_path / "split")] == list(range(8))
    assert _losses(tmp_path / "straight") == _losses(tmp_path / "split")
    _same_checkpoints(tmp_path / "straight", tmp_path / "split")


def test_resuming_with_another_optimizer_is_refused(tmp_path, data, device):
    from xtrain.io.state import CheckpointError

    train(tiny_run(tmp_path, data, 2, device, optimizer="muon"))
    with pytest.raises(CheckpointError, match="AdamW"):
        train(tiny_run(tmp_path, data, 4, device, optimizer="adamw", resume=str(tmp_path / "ckpt")))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_recompute_on_off_is_bitwise_with_muon(tmp_path, data, device, bf16):
    kw = dict(optimizer="muon", bf16=bf16)
    train(tiny_run(tmp_path / "off", data, 4, device, recompute=False, **kw))
    train(tiny_run(tmp_path / "on", data, 4, device, recompute=True, **kw))
    assert _losses(tmp_path / "on") == _losses(tmp_path / "off")
    _same_checkpoints(tmp_path / "on", tmp_path / "off")


def test_make_optimizer_picks_the_blocks_matrices():
    from xtrain.trainer.train import TrainConfig, make_optimizer

    model = make_model(small_config())
    opt = make_optimizer(TrainConfig(optimizer="muon"), model, 1e-3)
    assert isinstance(opt, Muon) and [opt.names[i] for i in opt.matrices] == _block_matrices(model)
    assert isinstance(make_optimizer(TrainConfig(), model, 1e-3), AdamW)


def test_cli_optimizer_flag(tmp_path, data):
    r = run_cli("train", "--preset", "tiny", "--data", data, "--out", tmp_path / "run", "--device", "cpu",
                "--batch", "2", "--seq", "32", "--steps", "2", "--eval-every", "0", "--sample-tokens", "4",
                "--no-progress", "--optimizer", "muon")
    assert r.returncode == 0, r.stderr
    assert 'optimizer = "muon"' in (tmp_path / "run" / "config.toml").read_text()
    r = run_cli("train", "--preset", "tiny", "--data", data, "--out", tmp_path / "bad", "--device", "cpu",
                "--optimizer", "sgd")
    assert r.returncode != 0 and "--optimizer" in r.stderr and "invalid choice" in r.stderr
    r = run_cli("train", "--help")
    assert "--optimizer" in r.stdout and "muon" in r.stdout


# ---------------------------------------------------------------- CUDA graphs (GPU)

@needs_gpu
@pytest.mark.parametrize("kw", [{}, {"bf16": True}, {"bf16": True, "recompute": True, "grad_accum": 2}],
                         ids=["fp32", "bf16", "bf16-recompute-accum2"])
def test_graph_steps_equal_eager_steps_bitwise_with_muon(tmp_path, data, kw):
    steps = 6
    train(tiny_run(tmp_path / "eager", data, steps, "cuda", cuda_graphs=False, optimizer="muon", **kw))
    train(tiny_run(tmp_path / "graphs", data, steps, "cuda", cuda_graphs=True, optimizer="muon", **kw))
    assert _losses(tmp_path / "graphs") == _losses(tmp_path / "eager")
    replayed = [r["step"] for r in run_log(tmp_path / "graphs") if r.get("graph")]
    assert replayed == list(range(graphs.WARMUP_STEPS, steps))
    _same_checkpoints(tmp_path / "graphs", tmp_path / "eager")


@needs_gpu
def test_cuda_muon_matches_cpu_muon_closely():
    """The CUDA step against the CPU step on the same state: cuBLAS and OpenBLAS accumulate in
    other orders, so within the bf16 tolerance, not bitwise."""
    shapes = [(64, 96), (96, 64), (64, 96), (80, 80)]
    outs = []
    for device in ("cpu", "cuda"):
        ps = [xtrain.tensor(np.random.default_rng(i).standard_normal(s).astype(np.float32), device=device)
              for i, s in enumerate(shapes)]
        gs = [xtrain.tensor(np.random.default_rng(10 + i).standard_normal(s).astype(np.float32), device=device)
              for i, s in enumerate(shapes)]
        bs = [xtrain.zeros(s, dtype="float32", device=device) for s in shapes]
        ratios = [muon_lr_ratio("match_rms_adamw", s) for s in shapes]
        _C.optim.muon_step(ps, gs, bs, 1e-2, 0.1, 0.95, True, lr_ratios=ratios, eps=1e-7, **NS)
        outs.append([p.numpy() for p in ps])
    for s, a, b in zip(shapes, *outs):
        assert np.abs(a - b).max() <= _update_tol("cuda") * 1e-2 * muon_lr_ratio("match_rms_adamw", s)
