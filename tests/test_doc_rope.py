"""RoPE positions restarting per document (TransformerConfig.doc_rope, --doc-rope): per-row
positions [B, S] in ops.rope and ops.qk_norm_rope, ops.document_positions, and the model and
training with the option.

ops.rope at document positions is checked against RoPE applied to each document on its own (a
numpy float64 reference, and ops.rope on the document's slice from position 0, bit for bit);
qk_norm_rope at [B, S] positions is bitwise rms_norm then rope (values and gradients); the
backward is deterministic; recompute on/off gives the same bits; the option changes the model's
loss only when rows hold several documents; a run with it resumes bit-exactly."""
import numpy as np
import pytest

import xtrain
from modelhelp import bits_equal, batch, make_model, prepared_stories, run_log, small_config, tiny_run

ops = xtrain.ops
SEP = 3


def rows_with_documents(B, S, lengths, seed=0, vocab=50):
    """ids [B, S] cut into documents of the given lengths (cycled, row b from length b), each ending
    with SEP, and the reference positions: each token's distance from its document's start."""
    ids = np.random.default_rng(seed).integers(4, vocab, size=(B, S))
    pos = np.zeros((B, S), dtype=np.int64)
    for b in range(B):
        start, i = 0, b
        for s in range(S):
            pos[b, s] = s - start
            if s - start + 1 == lengths[i % len(lengths)]:
                ids[b, s] = SEP
                start, i = s + 1, i + 1
    return ids, pos


def documents_of(pos_row):
    """(start, end) of each document of a row of positions."""
    starts = [s for s in range(len(pos_row)) if pos_row[s] == 0] + [len(pos_row)]
    return list(zip(starts[:-1], starts[1:]))


def rope_reference(x, theta):
    """RoPE of x (S, H, D) float64 at positions 0..S-1, float32 angles of xtrain's frequencies
    (1 / theta^(2i/D), the power in double rounded to float32)."""
    S, _, D = x.shape
    expo = (2 * np.arange(D // 2)).astype(np.float32) / np.float32(D)
    inv = (np.float32(1) / (theta ** expo.astype(np.float64)).astype(np.float32)).astype(np.float32)
    ang = (np.arange(S, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)[:, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


def test_document_positions(device):
    ids, want = rows_with_documents(3, 40, [7, 1, 13, 4])
    docs = ops.document_starts(xtrain.tensor(ids, device=device), SEP)
    got = ops.document_positions(docs)
    assert got.dtype == "int64" and tuple(got.shape) == (3, 40)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(ops.document_positions(ops.document_starts(xtrain.tensor(ids[:, :0], device=device),
                                                                             SEP)).numpy(), np.zeros((3, 0)))
    with pytest.raises(ValueError, match="doc_start must be int32"):
        ops.document_positions(xtrain.tensor(want, device=device))


def test_rope_per_document_matches_each_document_alone(device):
    """Per-row positions: each document rotated as if it stood alone from position 0 (numpy float64
    reference; float32 bit for bit against ops.rope of the document's slice)."""
    ids, pos = rows_with_documents(2, 64, [9, 1, 30, 5])
    x = np.random.default_rng(1).standard_normal((2, 64, 3, 16))
    got = ops.rope(xtrain.tensor(x, device=device), xtrain.tensor(pos, device=device), 500.0).numpy()
    x32 = x.astype(np.float32)
    got32 = ops.rope(xtrain.tensor(x32, device=device), xtrain.tensor(pos, device=device), 500.0).numpy()
    for b in range(2):
        for st, en in documents_of(pos[b]):
            np.testing.assert_allclose(got[b, st:en], rope_reference(x[b, st:en], 500.0), atol=1e-12)
            alone = ops.rope(xtrain.tensor(np.ascontiguousarray(x32[b:b + 1, st:en]), device=device), None, 500.0)
            assert bits_equal(got32[b:b + 1, st:en], alone.numpy())
    # [S] positions stay what they were: the same row positions for every batch row
    row = np.arange(64, dtype=np.int64)
    assert bits_equal(ops.rope(xtrain.tensor(x32, device=device), xtrain.tensor(row, device=device), 500.0).numpy(),
                      ops.rope(xtrain.tensor(x32, device=device), xtrain.tensor(np.tile(row, (2, 1)), device=device),
                               500.0).numpy())
    assert not np.array_equal(got32, ops.rope(xtrain.tensor(x32, device=device), None, 500.0).numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_per_document_gradient_is_the_inverse_rotation(device, dtype):
    _, pos = rows_with_documents(2, 33, [4, 11, 2])
    rng = np.random.default_rng(2)
    x = xtrain.tensor(rng.standard_normal((2, 33, 2, 32)).astype(np.float32), device=device)
    dy = xtrain.tensor(rng.standard_normal((2, 33, 2, 32)).astype(np.float32), device=device)
    p = xtrain.tensor(pos, device=device)
    xs = ops.cast(x, dtype).detach()
    xs.requires_grad = True
    grads = []
    for _ in range(2):  # deterministic
        xs.grad = None
        ops.rope(xs, p, 1e4).backward_seeded(ops.cast(dy, dtype))
        grads.append(xs.grad.numpy())
    assert bits_equal(grads[0], grads[1])
    # the inverse rotation: rope at the negated positions (the angles' negatives, exactly)
    want = ops.rope(ops.cast(dy, dtype), xtrain.tensor(-pos, device=device), 1e4)
    np.testing.assert_allclose(grads[0].astype(np.float32), ops.cast(want, "float32").numpy(),
                               atol=1e-6 if dtype == "float32" else 1e-2)


def _prep_inputs(seed, B=2, S=37, H=4, Hkv=2, D=32):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((B, S, H, D)), rng.standard_normal((B, S, Hkv, D))
    wq, wk = 1 + 0.1 * rng.standard_normal(D), 1 + 0.1 * rng.standard_normal(D)
    dq, dk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    return [a.astype(np.float32) for a in (q, k, wq, wk, dq, dk)]


def _run_prep(fused, arrays, pos, dtype, device):
    q0, k0, wq0, wk0, dq, dk = arrays
    q, k = (ops.cast(xtrain.tensor(a, device=device), dtype).detach() for a in (q0, k0))
    q.requires_grad = k.requires_grad = True
    wq, wk = (xtrain.tensor(a, device=device, requires_grad=True) for a in (wq0, wk0))
    p = None if pos is None else xtrain.tensor(pos, device=device)
    if fused:
        qo, ko = ops.qk_norm_rope(q, k, wq, wk, 1e-6, 1e4, p)
    else:
        qo, ko = ops.rope(ops.rms_norm(q, wq, 1e-6), p, 1e4), ops.rope(ops.rms_norm(k, wk, 1e-6), p, 1e4)
    loss = ops.sum(ops.cast(qo, "float32") * xtrain.tensor(dq, device=device)) + \
        ops.sum(ops.cast(ko, "float32") * xtrain.tensor(dk, device=device))
    loss.backward()
    return [ops.cast(t, "float32").numpy() for t in (qo, ko, q.grad, k.grad)] + [wq.grad.numpy(), wk.grad.numpy()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D", [32, 48, 64])
def test_qk_norm_rope_per_document_is_bitwise_the_composition(device, dtype, D):
    """The fused head preparation at [B, S] positions is bitwise rms_norm then rope at them
    (values and every gradient), and differs from positions 0..S-1."""
    _, pos = rows_with_documents(2, 37, [6, 1, 17])
    arrays = _prep_inputs(3, D=D)
    fused, composed = _run_prep(True, arrays, pos, dtype, device), _run_prep(False, arrays, pos, dtype, device)
    for name, a, b in zip(("q", "k", "dq", "dk", "dwq", "dwk"), fused, composed):
        assert bits_equal(a, b), name
    plain = _run_prep(True, arrays, None, dtype, device)
    assert not bits_equal(fused[0], plain[0])
    # 0..S-1 given as [B, S] or [S] rows are the default positions' bits
    for given in (np.tile(np.arange(37), (2, 1)), np.arange(37)):
        assert all(bits_equal(a, b) for a, b in zip(plain, _run_prep(True, arrays, given, dtype, device)))
    assert all(bits_equal(a, b) for a, b in zip(fused, _run_prep(True, arrays, pos, dtype, device)))


def test_positions_bad_inputs(device):
    x = xtrain.tensor(np.zeros((2, 5, 1, 4), np.float32), device=device)
    w = xtrain.ones(4, device=device)
    for bad, err, message in [(np.zeros((3, 5), np.int64), ValueError, r"\[5\] or \[2, 5\]"),
                              (np.zeros((2, 5, 1), np.int64), ValueError, r"\[5\] or \[2, 5\]"),
                              (np.zeros((2, 5), np.int32), TypeError, "positions must be int64")]:
        with pytest.raises(err, match=message):
            ops.rope(x, xtrain.tensor(bad, device=device), 1e4)
        with pytest.raises(err, match=message):
            ops.qk_norm_rope(x, x, w, w, 1e-6, 1e4, xtrain.tensor(bad, device=device))


# ---------------------------------------------------------------- the model

def _loss_and_grads(config, ids, targets, device="cpu"):
    """(loss, logits, name -> gradient) of a model with fixed random weights."""
    model = make_model(config, device=device, weights_seed=4)
    logits, loss = model(ids, targets, return_logits=True)
    loss.backward()
    return loss.numpy(), logits.numpy(), {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("qk_norm", [True, False])
def test_doc_rope_changes_the_model_only_with_several_documents(device, qk_norm):
    """One document per row: doc_rope's positions are 0..S-1, the same bits. Several: the logits
    and gradients change, but only by the angles' rounding (within documents RoPE's scores depend
    on distances only), so they stay close (the loss of these 128 tokens even rounds alike)."""
    base = dict(max_seq=64, doc_sep=SEP, qk_norm=qk_norm, vocab_size=50)
    ids, _ = rows_with_documents(2, 64, [10, 3, 25, 7, 19])
    single = np.random.default_rng(5).integers(4, 50, size=(2, 64))
    single[:, -1] = SEP  # a separator ending the row's only document
    targets = np.random.default_rng(6).integers(0, 50, size=(2, 64))
    on, off = small_config(doc_rope=True, **base), small_config(**base)
    (la, xa, ga), (lb, xb, gb) = _loss_and_grads(on, single, targets, device), _loss_and_grads(off, single, targets,
                                                                                               device)
    assert bits_equal(la, lb) and bits_equal(xa, xb) and all(bits_equal(ga[n], gb[n]) for n in ga)
    (la, xa, ga), (lb, xb, gb) = _loss_and_grads(on, ids, targets, device), _loss_and_grads(off, ids, targets, device)
    assert not bits_equal(xa, xb)
    assert not all(bits_equal(ga[n], gb[n]) for n in ga)
    np.testing.assert_allclose(xa, xb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(la, lb, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_doc_rope_recompute_is_bitwise_exact(device, dtype):
    ids, _ = rows_with_documents(2, 48, [5, 20, 2, 9])
    targets = np.random.default_rng(8).integers(0, 50, size=(2, 48))
    runs = [_loss_and_grads(small_config(max_seq=48, doc_sep=SEP, doc_rope=True, vocab_size=50,
                                         bf16=dtype == "bfloat16", recompute=r), ids, targets, device)
            for r in (False, True)]
    assert bits_equal(runs[0][0], runs[1][0]) and bits_equal(runs[0][1], runs[1][1])
    for n in runs[0][2]:
        assert bits_equal(runs[0][2][n], runs[1][2][n]), n


def test_doc_rope_config():
    c = small_config(doc_sep=SEP, doc_rope=True)
    assert xtrain.models.TransformerConfig.from_dict(c.to_dict()) == c
    old = c.to_dict()
    del old["doc_rope"]  # a record from before the option: off
    assert xtrain.models.TransformerConfig.from_dict(old).doc_rope is False
    with pytest.raises(ValueError, match="doc_rope needs doc_sep"):
        small_config(doc_rope=True)
    with pytest.raises(ValueError, match="doc_rope must be True or False"):
        small_config(doc_sep=SEP, doc_rope=1)


def test_doc_rope_generation_starts_prompts_at_zero():
    """Generation rotates a prompt from position 0 with the option on or off: the same tokens."""
    kw = dict(max_seq=48, doc_sep=SEP, vocab_size=50)
    prompt = np.random.default_rng(9).integers(4, 50, size=(1, 20))
    a = make_model(small_config(doc_rope=True, **kw), weights_seed=2).generate(prompt, 8, greedy=True)
    b = make_model(small_config(**kw), weights_seed=2).generate(prompt, 8, greedy=True)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- training

def test_training_with_doc_rope_and_resume(tmp_path):
    """xtrain train --doc-rope: the checkpoint's model has it, the loss of packed stories differs
    from the run without it, and 2 + resume 2 steps give the 4-step run's losses and weights."""
    from xtrain.io import state as ckpt_state
    from xtrain.trainer.train import train

    data = prepared_stories(tmp_path / "data")
    kw = dict(seq=256, decay_steps=4)
    train(tiny_run(tmp_path / "off", data, 2, **kw))
    train(tiny_run(tmp_path / "straight", data, 4, doc_rope=True, **kw))
    train(tiny_run(tmp_path / "split", data, 2, doc_rope=True, **kw))
    on_2 = (tmp_path / "split" / "ckpt" / "model.safetensors").read_bytes()
    train(tiny_run(tmp_path / "split", data, 4, doc_rope=True, resume=str(tmp_path / "split" / "ckpt"), **kw))
    assert ckpt_state.load(tmp_path / "straight" / "ckpt").config.doc_rope is True
    losses = {name: [r["loss"] for r in run_log(tmp_path / name) if "loss" in r]
              for name in ("off", "straight", "split")}
    assert losses["straight"] == losses["split"]
    # several stories per row of 256 tokens: the gradients, hence the weights after 2 steps, differ
    assert (tmp_path / "off" / "ckpt" / "model.safetensors").read_bytes() != on_2
    for name in ("model.safetensors", "optim.safetensors"):
        assert (tmp_path / "straight" / "ckpt" / name).read_bytes() == \
            (tmp_path / "split" / "ckpt" / name).read_bytes(), name


def test_doc_rope_flag_rules():
    from xtrain.trainer.runconfig import ConfigError, TrainConfig, validate

    validate(TrainConfig(doc_rope=True))
    with pytest.raises(ConfigError, match="--doc-rope .* drop --no-doc-mask"):
        validate(TrainConfig(doc_rope=True, doc_mask=False))
    with pytest.raises(ConfigError, match="learned positions"):
        validate(TrainConfig(doc_rope=True, preset="gpt2-124m"))


def test_doc_rope_on_a_gpt2_checkpoint_is_one_config_error(tmp_path):
    """--doc-rope with a GPT-2 model that comes from a checkpoint (no --preset to check it by) is
    a ConfigError naming the architecture, not GPT2Config's 'unknown fields'."""
    from xtrain.io import state
    from xtrain.models import GPT2, GPT2Config
    from xtrain.optim import AdamW
    from xtrain.trainer.runconfig import ConfigError
    from xtrain.trainer.train import train
    from xtrain.data import open_dataset

    data = prepared_stories(tmp_path / "data")
    tok = open_dataset(data).tokenizer
    model = GPT2(GPT2Config(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, max_seq=64))
    state.save(tmp_path / "run" / "ckpt", model, AdamW(model.named_parameters(), lr=1e-3), 2, tokenizer=tok,
               loader_state=None)
    with pytest.raises(ConfigError, match="--doc-rope applies to .* GPT2Config"):
        train(tiny_run(tmp_path / "run", data, 4, preset=None, resume=str(tmp_path / "run" / "ckpt"),
                       doc_rope=True))
