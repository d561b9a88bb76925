"""The CPU profile (xtrain._C.profile, docs/cpu.md): enabled around a small model's forward and
backward it records the CPU kernels the step runs, forward and backward apart, and the backward
Nodes, each with calls > 0 and a time; disabled it records nothing; reset empties it."""
import numpy as np
import pytest

import xtrain
from xtrain.models import TinyTransformer, config_for

prof = xtrain._C.profile


@pytest.fixture(autouse=True)
def profile_off():
    prof.cpu_enable(False)
    prof.cpu_reset()
    yield
    prof.cpu_enable(False)
    prof.cpu_reset()


def step(model, seed=0):
    r = np.random.default_rng(seed)
    ids = xtrain.tensor(r.integers(0, 64, (2, 8)).astype(np.int64))
    targets = xtrain.tensor(r.integers(0, 64, (2, 8)).astype(np.int64))
    loss = model.forward(ids, targets)[1]
    loss.backward()


def small_model(**overrides):
    return TinyTransformer(config_for("tiny", 64, n_layers=1, max_seq=16, **overrides), device="cpu", seed=0)


@pytest.mark.parametrize("lean", [False, True])
def test_records_the_step_kernels_and_nodes(lean):
    model = small_model(lean_activations=lean)
    prof.cpu_enable(True)
    assert prof.cpu_enabled()
    step(model)
    prof.cpu_enable(False)
    entries = prof.cpu_read()
    kernels = {(e["name"], e["phase"]): e for e in entries if e["kind"] == "kernel"}
    nodes = {e["name"]: e for e in entries if e["kind"] == "node"}
    for name, phase in [("flash_attention_forward", "forward"), ("flash_attention_backward", "backward"),
                        ("qk_norm_rope_forward", "forward"), ("qk_norm_rope_backward", "backward"),
                        ("gemm", "forward"), ("gemm", "backward"), ("gemm_ld", "forward"),
                        ("cross_entropy_forward", "forward"), ("cross_entropy_backward", "backward"),
                        ("swiglu_forward", "forward"), ("swiglu_backward", "backward"),
                        ("embedding_forward", "forward"), ("embedding_backward", "backward")] + (
                        # what the lean ops recompute in backward (docs/model.md, "Activation memory")
                        [("qk_norm_rope_forward", "backward"), ("swiglu_forward", "backward"),
                         ("rmsnorm_forward", "backward")] if lean else []):
        assert (name, phase) in kernels, f"{name} ({phase}) not recorded: {sorted(kernels)}"
        assert kernels[name, phase]["calls"] > 0 and kernels[name, phase]["seconds"] > 0.0
    assert kernels["flash_attention_forward", "forward"]["calls"] == 1  # one layer, one call
    expected = ([("QkNormRopeAttentionBackward", 1), ("LinearCrossEntropyBackward", 1), ("SwigluLinearBackward", 1),
                 ("RmsNormLinearMultiBackward", 2)] if lean else
                [("FlashAttentionBackward", 1), ("LinearCrossEntropyBackward", 1), ("QkNormRopeBackward", 1)])
    for name, calls in expected:
        assert name in nodes and nodes[name]["calls"] == calls and nodes[name]["phase"] == "backward", name
    if not lean:  # the plain blocks recompute nothing in backward
        assert ("swiglu_forward", "backward") not in kernels and ("qk_norm_rope_forward", "backward") not in kernels


def test_off_records_nothing_and_reset_empties():
    model = small_model()
    assert not prof.cpu_enabled()
    step(model)
    assert prof.cpu_read() == []
    prof.cpu_enable(True)
    step(model)
    first = {(e["name"], e["kind"], e["phase"]): e["calls"] for e in prof.cpu_read()}
    step(model)
    prof.cpu_enable(False)
    second = {(e["name"], e["kind"], e["phase"]): e["calls"] for e in prof.cpu_read()}
    assert second == {k: 2 * v for k, v in first.items()}  # the same step twice: twice the calls
    step(model)
    assert {(e["name"], e["kind"], e["phase"]): e["calls"] for e in prof.cpu_read()} == second
    prof.cpu_reset()
    assert prof.cpu_read() == []
