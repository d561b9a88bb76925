"""Attention within documents: ops.document_starts and flash_attention(..., doc_start=...).

The masked attention is compared with PyTorch's scaled_dot_product_attention in float64 under a
block-diagonal causal mask built from the same documents (out, lse and every gradient, GQA,
head_dim 32/64/128, boundaries inside and across the kernels' 64-row tiles, documents longer than
a tile); one document per row gives plain causal attention's bits exactly; the backward is
bitwise deterministic; malformed doc_start and bad arguments raise.
"""
import math

import numpy as np
import pytest
import torch

import xtrain
from ophelp import bits, to_numpy64

ops = xtrain.ops
SEP = 3  # the separator id of these tests

TOL = {"bfloat16": {"out": 1e-2, "lse": 2e-5, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2},
       "float32": {"out": 2e-5, "lse": 2e-5, "dq": 2e-5, "dk": 2e-5, "dv": 2e-5}}


def starts_of(ids: np.ndarray) -> np.ndarray:
    """The reference: a document begins at 0 and after each separator."""
    out = np.zeros(ids.shape, dtype=np.int32)
    for b in range(ids.shape[0]):
        start = 0
        for s in range(ids.shape[1]):
            if s > 0 and ids[b, s - 1] == SEP:
                start = s
            out[b, s] = start
    return out


def ids_with_documents(B, S, lengths, seed=0):
    """ids [B, S] whose rows are cut into documents of the given lengths (cycled; each ends with SEP)."""
    g = np.random.default_rng(seed)
    ids = g.integers(4, 50, size=(B, S))
    for b in range(B):
        pos, i = 0, b
        while True:
            pos += lengths[i % len(lengths)]
            i += 1
            if pos > S:
                break
            ids[b, pos - 1] = SEP
    return ids


def reference(q, k, v, dout, doc, scale, device):
    dev = "cuda" if device.startswith("cuda") else "cpu"
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, device=dev, requires_grad=True) for a in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    qh = tq.transpose(1, 2)
    kh = tk.repeat_interleave(rep, dim=2).transpose(1, 2)
    vh = tv.repeat_interleave(rep, dim=2).transpose(1, 2)
    S = q.shape[1]
    d = torch.tensor(doc, device=dev)
    j = torch.arange(S, device=dev)
    # [B, 1, S, S]: key j visible from query i iff doc[i] <= j <= i (block-diagonal causal)
    allowed = (j[None, None, :] <= j[None, :, None]) & (j[None, None, :] >= d[:, :, None])
    allowed = allowed[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=scale)
    out.backward(torch.tensor(dout, dtype=torch.float64, device=dev).transpose(1, 2))
    with torch.no_grad():
        s = ((qh @ kh.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
    as_np = lambda t: t.detach().cpu().numpy()
    return {"out": as_np(out.transpose(1, 2)), "lse": as_np(lse), "dq": as_np(tq.grad), "dk": as_np(tk.grad),
            "dv": as_np(tv.grad)}


def run(device, dtype, arrays, doc_start):
    q, k, v = (xtrain.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in arrays[:3])
    out, lse = ops.flash_attention(q, k, v, causal=True, return_lse=True, doc_start=doc_start)
    out.backward_seeded(xtrain.tensor(arrays[3], dtype=dtype, device=device))
    return {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def test_document_starts_matches_the_reference(device):
    ids = ids_with_documents(3, 300, [1, 7, 64, 65, 130, 2], seed=1)
    ids[1] = 5  # a row without a separator: one document
    ids[2, -1] = SEP  # a separator at the very end starts nothing
    for dt in ("int64", "int32"):
        got = ops.document_starts(xtrain.tensor(ids, dtype=dt, device=device), SEP)
        assert got.dtype == "int32" and got.shape == (3, 300)
        np.testing.assert_array_equal(got.numpy(), starts_of(ids))
    long = ids_with_documents(2, 5000, [900, 3, 1500], seed=2)  # more positions than the CUDA block's threads
    np.testing.assert_array_equal(ops.document_starts(xtrain.tensor(long, device=device), SEP).numpy(),
                                  starts_of(long))


CASES = [  # (B, S, H, Hkv, document lengths)
    (2, 40, 2, 2, [5, 12, 1]),
    (2, 200, 4, 2, [64, 70, 3, 30]),
    (1, 300, 4, 1, [129, 1, 100]),
    (2, 256, 2, 2, [256]),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-S{c[1]}-H{c[2]}/{c[3]}-docs{'_'.join(map(str, c[4]))}")
def test_masked_attention_matches_torch(device, case, D, dtype):
    B, S, H, Hkv, lengths = case
    if device == "cpu" and D == 128 and S > 200:
        pytest.skip("time: the CPU runs head_dim 128 on the shorter cases")
    g = np.random.default_rng(S + D)
    arrays = [g.standard_normal(s) for s in ((B, S, H, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, H, D))]
    ids = ids_with_documents(B, S, lengths, seed=S)
    doc = ops.document_starts(xtrain.tensor(ids, device=device), SEP)
    got = run(device, dtype, arrays, doc)
    leaves = [to_numpy64(xtrain.tensor(a, dtype=dtype)) for a in arrays]  # the inputs as rounded
    want = reference(*leaves, starts_of(ids), 1.0 / math.sqrt(D), device)
    for what, ref in want.items():
        val = to_numpy64(got[what])
        err = np.abs(val - ref).max() / max(np.abs(ref).max(), 1e-1)
        assert np.all(np.isfinite(val)) and err <= TOL[dtype][what], f"{what}: error {err:.2e}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_one_document_per_row_gives_causal_bits(device, dtype):
    """Without a separator every query's document starts at 0: the same bits as plain causal
    attention (skipped tiles would only have added zeros)."""
    g = np.random.default_rng(4)
    B, S, H, D = 2, 200, 4, 64
    arrays = [g.standard_normal(s) for s in ((B, S, H, D), (B, S, 2, D), (B, S, 2, D), (B, S, H, D))]
    doc = ops.document_starts(xtrain.tensor(np.full((B, S), 7), device=device), SEP)
    masked, plain = run(device, dtype, arrays, doc), run(device, dtype, arrays, None)
    for what in masked:
        assert np.array_equal(bits(masked[what]), bits(plain[what])), what


def test_masked_backward_is_deterministic(device):
    g = np.random.default_rng(5)
    B, S, H, D = 2, 333, 4, 64
    arrays = [g.standard_normal(s) for s in ((B, S, H, D), (B, S, 2, D), (B, S, 2, D), (B, S, H, D))]
    doc = ops.document_starts(xtrain.tensor(ids_with_documents(B, S, [50, 90, 7], seed=3), device=device), SEP)
    a, b = run(device, "bfloat16", arrays, doc), run(device, "bfloat16", arrays, doc)
    for what in a:
        assert np.array_equal(bits(a[what]), bits(b[what])), what


def test_bad_doc_start_and_arguments(device):
    q = xtrain.zeros((1, 6, 2, 8), device=device)
    good = ops.document_starts(xtrain.tensor(np.array([[1, SEP, 1, 1, SEP, 1]]), device=device), SEP)
    with pytest.raises(ValueError, match="causal"):
        ops.flash_attention(q, q, q, causal=False, doc_start=good)
    with pytest.raises(ValueError, match=r"int32 \[B, S\]"):
        ops.flash_attention(q, q, q, doc_start=xtrain.zeros((1, 5), dtype="int32", device=device))
    with pytest.raises(ValueError, match=r"int32 \[B, S\]"):
        ops.flash_attention(q, q, q, doc_start=xtrain.zeros((1, 6), dtype="int64", device=device))
    with pytest.raises(TypeError, match="ids must be int32 or int64"):
        ops.document_starts(xtrain.zeros((1, 6), device=device), SEP)
    with pytest.raises(TypeError, match=r"\[B, S\]"):
        ops.document_starts(xtrain.zeros((6,), dtype="int64", device=device), SEP)
    if device == "cpu":  # CPU doc_start values are checked; CUDA ones are only clamped by the kernels
        for bad in ([0, 0, 3, 3, 3, 6], [0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, -1]):
            with pytest.raises(ValueError, match="is not a document start"):
                ops.flash_attention(q, q, q, doc_start=xtrain.tensor(np.array([bad]), dtype="int32"))


# ---- the model: TransformerConfig.doc_sep

def _model(device, **kw):
    from xtrain.models import TinyTransformer, config_for

    return TinyTransformer(config_for("tiny", 64, **kw), device=device, seed=3)


def test_a_packed_document_reads_like_the_document_alone(device):
    """With doc_sep, the tokens of the second document of a packed row get the logits they get
    when that document is the whole row (RoPE is relative, so the shift only rounds differently);
    without it they do not (they attend to the first document)."""
    g = np.random.default_rng(7)
    first, second = g.integers(4, 64, size=37), g.integers(4, 64, size=29)
    first[-1] = SEP
    packed = np.concatenate([first, second])[None]
    alone = second[None]
    masked = _model(device, doc_sep=SEP)
    plain = _model(device)
    with xtrain.no_grad():
        got = masked(packed)[0].numpy()[len(first):]
        want = masked(alone)[0].numpy()
        leak = plain(packed)[0].numpy()[len(first):]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert np.abs(leak - want).max() > 1e-3
    with xtrain.no_grad():  # the first document is unaffected either way
        np.testing.assert_array_equal(masked(packed)[0].numpy()[:len(first)], plain(packed)[0].numpy()[:len(first)])


@pytest.mark.parametrize("dtype_bf16", [False, True])
def test_documents_with_recompute_are_bitwise_the_same(device, dtype_bf16):
    ids = ids_with_documents(2, 96, [20, 41, 7], seed=4) % 64
    ids[ids == SEP] = 5
    ids[:, 30] = SEP
    ids[1, 70] = SEP
    runs = []
    for recompute in (False, True):
        m = _model(device, doc_sep=SEP, recompute=recompute, bf16=dtype_bf16)
        _, loss = m(ids[:, :-1], ids[:, 1:])
        loss.backward()
        runs.append([bits(loss)] + [bits(p.grad) for _, p in m.named_parameters()])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_doc_sep_must_be_a_token_id():
    from xtrain.models import config_for

    for bad in (-1, 64, 2.0, True, "3"):
        with pytest.raises(ValueError, match="doc_sep"):
            config_for("tiny", 64, doc_sep=bad)


def test_training_masks_documents_by_default(tmp_path):
    """xtrain train: --doc-mask is the default (the checkpoint's model has the tokenizer's
    end-of-text as doc_sep) and changes the loss of packed stories; --no-doc-mask is plain causal."""
    from modelhelp import prepared_stories, run_log, tiny_run
    from xtrain.io import state as ckpt_state
    from xtrain.trainer.train import train

    data = prepared_stories(tmp_path / "data")
    losses = {}
    for mask in (True, False):
        out = tmp_path / f"run-{mask}"
        train(tiny_run(out, data, 2, doc_mask=mask, seq=512))  # ~480-token stories: boundaries in every batch
        losses[mask] = [r["loss"] for r in run_log(out) if "loss" in r]
        ckpt = ckpt_state.load(out / "ckpt")
        assert ckpt.config.doc_sep == (ckpt.tokenizer().eot_id if mask else None)
    assert losses[True][0] != losses[False][0]


@pytest.mark.parametrize("recompute", [False, True])
def test_gpt2_masks_documents_too(device, recompute):
    """GPT-2 (learned absolute positions) with doc_sep: the first document's logits are those of
    plain causal attention, the second's differ; recompute gives the same bits."""
    from xtrain.models.gpt2 import GPT2, GPT2Config

    def model(**kw):
        return GPT2(GPT2Config(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq=128, **kw), device=device, seed=1)

    g = np.random.default_rng(9)
    ids = g.integers(4, 64, size=(2, 70))
    ids[:, 30] = SEP
    with xtrain.no_grad():
        masked = model(doc_sep=SEP, recompute=recompute)(ids)[0].numpy().reshape(2, 70, -1)
        plain = model()(ids)[0].numpy().reshape(2, 70, -1)
        again = model(doc_sep=SEP, recompute=not recompute)(ids)[0].numpy().reshape(2, 70, -1)
    np.testing.assert_array_equal(masked[:, :31], plain[:, :31])
    assert np.abs(masked[:, 31:] - plain[:, 31:]).max() > 1e-3
    np.testing.assert_array_equal(masked, again)


def test_resuming_a_run_recorded_before_doc_mask_keeps_causal_attention(tmp_path):
    """A run whose record has no doc_mask (made before the flag existed) resumes as it trained:
    causal attention over the whole sequence; --doc-mask given on the command line still wins."""
    from modelhelp import prepared_stories, tiny_run
    from xtrain.trainer.cli import _train_values, build_parser
    from xtrain.trainer.train import train

    data = prepared_stories(tmp_path / "data")
    out = tmp_path / "run"
    train(tiny_run(out, data, 2, doc_mask=False))
    toml = out / "config.toml"
    toml.write_text("".join(line for line in toml.read_text().splitlines(True) if not line.startswith("doc-mask")))
    parser = build_parser()
    args = ["train", "--out", str(out), "--resume", "--steps", "4", "--device", "cpu"]
    assert _train_values(parser.parse_args(args))["doc_mask"] is False
    assert _train_values(parser.parse_args(args + ["--doc-mask"]))["doc_mask"] is True
