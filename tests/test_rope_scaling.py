"""Llama 3's RoPE scaling (TransformerConfig.rope_scaling, the ops' llama3 argument): the rotation
against transformers' own inverse frequencies (_compute_llama3_parameters), a small
LlamaForCausalLM with rope_type "llama3" imported through from_pretrained against transformers'
float32 logits and gradients at positions where the scaling matters, the config's record and its
checks, the preset, export's config.json, generation, and the CUDA kernels against the CPU."""
import json

import numpy as np
import pytest

import xtrain
from modelhelp import bits_equal, small_config
from xtrain import ops
from xtrain.io.export import hf_config
from xtrain.models import TinyTransformer, TransformerConfig, config_for
from xtrain.models.transformer import RopeScaling

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import _compute_llama3_parameters  # noqa: E402  (after the skips)

# A short original context so that a 16-wide head has frequencies in all three bands (kept,
# blended, divided by factor) and the scaling changes the angles from the first positions on.
SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
LLAMA3 = (8.0, 1.0, 4.0, 64.0)


def _hf_inv_freq(theta, head_dim, scaling):
    config = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                      max_position_embeddings=4 * scaling["original_max_position_embeddings"],
                                      rope_theta=theta, rope_scaling=dict(rope_type="llama3", **scaling))
    return _compute_llama3_parameters(config, "cpu")[0].double()


def _torch_rope(x, positions, inv_freq):
    """Rotate-half RoPE of x (B, S, H, D) float64 at positions (S,) or (B, S) with float32 angles."""
    pos = torch.as_tensor(positions)
    pos = pos.expand(x.shape[0], -1) if pos.ndim == 1 else pos
    angles = (pos.float()[..., None] * inv_freq.float()).double()[:, :, None, :]  # (B, S, 1, D/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("theta,head_dim,scaling", [
    (10000.0, 16, SCALING),
    (500000.0, 64, dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192)),  # Llama-3.2-1B's
    (1e6, 128, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)),
])
def test_rope_llama3_matches_transformers_frequencies(device, theta, head_dim, scaling):
    """ops.rope with llama3 rotates by transformers' llama3 frequencies (float64 rotation of float32
    angles as the reference): forward and gradient; plain RoPE is far from it."""
    rng = np.random.default_rng(0)
    S, H = 300, 2
    positions = np.arange(S, dtype=np.int64) * 37  # up to ~11000: past 8192 / factor
    x = rng.standard_normal((1, S, H, head_dim))
    llama3 = (scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
              float(scaling["original_max_position_embeddings"]))
    want = _torch_rope(torch.from_numpy(x), positions, _hf_inv_freq(theta, head_dim, scaling)).numpy()
    xt = xtrain.tensor(x, device=device)
    pos = xtrain.tensor(positions, device=device)
    got = ops.rope(xt, pos, theta, llama3).numpy()
    # float64 rotations of float32 angles; xtrain's base frequency (the power in double, rounded
    # once) may sit one float32 ulp from torch's float32 power: ~1e-7 at these angles
    np.testing.assert_allclose(got, want, atol=2e-6)
    plain = ops.rope(xt, pos, theta).numpy()
    assert np.abs(plain - want).max() > 0.1
    # the backward is the inverse rotation by the same frequencies
    x32 = xtrain.tensor(x.astype(np.float32), device=device, requires_grad=True)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    ops.rope(x32, pos, theta, llama3).backward_seeded(xtrain.tensor(dy, device=device))
    inv = _hf_inv_freq(theta, head_dim, scaling)  # rotating back: the angles of -positions
    want_dx = _torch_rope(torch.from_numpy(dy.astype(np.float64)), -torch.as_tensor(positions), inv).numpy()
    np.testing.assert_allclose(x32.grad.numpy(), want_dx, atol=2e-5)


def test_llama3_fused_and_composed_bitwise(device):
    """qk_norm_rope with llama3 is bitwise rms_norm then rope with llama3 (values and gradients)."""
    rng = np.random.default_rng(1)
    q0, k0 = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 40, 4, 16), (2, 40, 2, 16)))
    w0, v0 = ((1 + 0.1 * rng.standard_normal(16)).astype(np.float32) for _ in range(2))
    dq, dk = rng.standard_normal(q0.shape).astype(np.float32), rng.standard_normal(k0.shape).astype(np.float32)

    def run(fused):
        q, k = (xtrain.tensor(a, device=device, requires_grad=True) for a in (q0, k0))
        wq, wk = (xtrain.tensor(a, device=device, requires_grad=True) for a in (w0, v0))
        if fused:
            qo, ko = ops.qk_norm_rope(q, k, wq, wk, 1e-6, 1e4, None, LLAMA3)
        else:
            qo = ops.rope(ops.rms_norm(q, wq, 1e-6), None, 1e4, LLAMA3)
            ko = ops.rope(ops.rms_norm(k, wk, 1e-6), None, 1e4, LLAMA3)
        (ops.sum(qo * xtrain.tensor(dq, device=device)) + ops.sum(ko * xtrain.tensor(dk, device=device))).backward()
        return [t.numpy() for t in (qo, ko, q.grad, k.grad, wq.grad, wk.grad)]

    for a, b in zip(run(True), run(False)):
        assert bits_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D, L, norm", [(16, 300, False), (64, 40, True), (32, 1100, True)])
def test_llama3_decode_prep_attention_is_the_composition(device, dtype, D, L, norm):
    """The decode step's head preparation with llama3 is bitwise rms_norm, rope (llama3) at each
    row's position and the cache writes, then decode_attention (on CUDA: the fused one-pass kernel
    at L 40 and 300, the preparation kernel then the split attention at L 1100)."""
    rng = np.random.default_rng(D + L)
    B, H, Hkv = 3, 4, 2

    def t(*shape):
        return ops.cast(xtrain.tensor(rng.standard_normal(shape).astype(np.float32), device=device), dtype)

    q, k, v = t(B, H, D), t(B, Hkv, D), t(B, Hkv, D)
    wq, wk = (t(D), t(D)) if norm else (None, None)
    positions = xtrain.tensor(np.array([L - 1, L // 3, 9]), device=device)
    lengths = xtrain.tensor(np.array([L, L // 3 + 1, 10]), device=device)
    base = rng.standard_normal((B, L, Hkv, D)).astype(np.float32)
    caches = [[ops.cast(xtrain.tensor(base, device=device), dtype) for _ in range(2)] for _ in range(2)]
    qn, kn = (ops.rms_norm(q, wq, 1e-5), ops.rms_norm(k, wk, 1e-5)) if norm else (q, k)
    qp = ops.rope(qn.reshape(1, B, H, D), positions, 5e5, LLAMA3).reshape(B, H, D)
    kp = ops.rope(kn.reshape(1, B, Hkv, D), positions, 5e5, LLAMA3).reshape(B, 1, Hkv, D)
    ops.kv_cache_write_(caches[0][0], kp, positions)
    ops.kv_cache_write_(caches[0][1], v.reshape(B, 1, Hkv, D), positions)
    want = ops.decode_attention(qp, *caches[0], lengths, 0.3)
    got = ops.decode_prep_attention(q, k, v, *caches[1], positions, lengths, wq, wk, eps=1e-5, theta=5e5,
                                    scale=0.3, llama3=LLAMA3)
    assert bits_equal(ops.cast(got, "float32").numpy(), ops.cast(want, "float32").numpy())
    for a, b in zip(caches[0], caches[1]):
        assert bits_equal(ops.cast(a, "float32").numpy(), ops.cast(b, "float32").numpy())
    plain = ops.decode_prep_attention(q, k, v, *caches[1], positions, lengths, wq, wk, eps=1e-5, theta=5e5,
                                      scale=0.3)
    assert not bits_equal(ops.cast(plain, "float32").numpy(), ops.cast(want, "float32").numpy())


def test_llama3_bad_arguments():
    x = xtrain.tensor(np.zeros((1, 2, 1, 4), np.float32))
    for bad, message in [((0.5, 1.0, 4.0, 64.0), "factor must be finite and >= 1"),
                         ((8.0, 4.0, 4.0, 64.0), "0 < low_freq_factor < high_freq_factor"),
                         ((8.0, 1.0, float("nan"), 64.0), "low_freq_factor < high_freq_factor"),
                         ((8.0, 1.0, 4.0, 0.0), "original_max_position_embeddings must be finite and >= 1")]:
        with pytest.raises(ValueError, match=message):
            ops.rope(x, None, 1e4, bad)
        with pytest.raises(ValueError, match=message):
            ops.qk_norm_rope(x, x, xtrain.ones([4]), xtrain.ones([4]), 1e-6, 1e4, None, bad)
        with pytest.raises(ValueError, match=message):
            z = xtrain.zeros(1, 1, 4)
            ops.decode_prep_attention(z, z, z, xtrain.zeros(1, 2, 1, 4), xtrain.zeros(1, 2, 1, 4),
                                      xtrain.tensor(np.array([0])), xtrain.tensor(np.array([1])), llama3=bad)
    with pytest.raises(TypeError):
        ops.rope(x, None, 1e4, (8.0, 1.0, 4.0))


# ---------------------------------------------------------------- the model

def _hf_llama(tmp_path, vocab=97, tie=False):
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=tie,
                                      rope_scaling=dict(rope_type="llama3", **SCALING))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(tmp_path)
    return model.eval()


def test_llama3_import_matches_transformers_logits_and_gradients(tmp_path):
    """A LlamaForCausalLM with rope_type llama3 (float32, CPU) imported by from_pretrained: logits
    and every parameter gradient of the mean cross-entropy against transformers', over 96
    positions (past original_max_position_embeddings / factor = 8, and past 64 itself); the same
    weights with plain RoPE are far off, so the comparison sees the scaling."""
    hf = _hf_llama(tmp_path)
    model = TinyTransformer.from_pretrained(tmp_path)
    assert model.config.rope_scaling == RopeScaling(**SCALING)
    rng = np.random.default_rng(3)
    B, S, V = 2, 96, hf.config.vocab_size
    ids, targets = rng.integers(0, V, (B, S)), rng.integers(0, V, (B, S))
    out = hf(torch.from_numpy(ids))
    want_logits = out.logits.reshape(B * S, V)
    torch.nn.functional.cross_entropy(want_logits, torch.from_numpy(targets).reshape(-1)).backward()
    logits, _ = model(ids)
    np.testing.assert_allclose(logits.numpy(), want_logits.detach().numpy(), rtol=1e-4, atol=1e-4)
    _, loss = model(ids, targets)
    loss.backward()
    hf_params = dict(hf.named_parameters())
    for name, p in model.named_parameters():
        want = hf_params[name if name.startswith("lm_head") else "model." + name].grad.numpy()
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-3, atol=1e-4 * scale, err_msg=name)
    plain = TinyTransformer.from_pretrained(tmp_path, rope_scaling=None)
    plain_logits, _ = plain(ids)
    assert np.abs(plain_logits.numpy() - want_logits.detach().numpy()).max() > 1e-2


def test_llama3_checkpoint_and_export_round_trip(tmp_path):
    """A checkpoint keeps the scaling (saved and read back); export writes it into config.json;
    transformers reads it back as llama3 and computes xtrain's logits; xtrain imports the export
    again as the same config."""
    from xtrain.data import generate_stories, train_bpe
    from xtrain.io import state
    from xtrain.io.export import export

    tok = train_bpe(generate_stories(100), 300)
    hf = _hf_llama(tmp_path / "src", vocab=tok.vocab_size + 16, tie=True)
    model = TinyTransformer.from_pretrained(tmp_path / "src")
    state.save(tmp_path / "ckpt", model, None, 0, tokenizer=tok)
    assert state.load(tmp_path / "ckpt").config == model.config
    assert hf_config(model.config, "f32", 0)["rope_scaling"] == dict(rope_type="llama3", **SCALING)
    export(tmp_path / "ckpt", tmp_path / "out", dtype="f32")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"] == dict(rope_type="llama3", **SCALING)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    ids = np.random.default_rng(5).integers(0, hf.config.vocab_size, (1, 80))
    with torch.no_grad():
        want = back(torch.from_numpy(ids)).logits.reshape(80, -1).numpy()
    np.testing.assert_allclose(model(ids)[0].numpy(), want, rtol=1e-4, atol=1e-4)
    assert TinyTransformer.from_pretrained(tmp_path / "out").config == model.config


def test_llama3_generation_matches_forward(tmp_path, device):
    """The decode path rotates with the same scaled frequencies: greedy tokens from generate equal
    the argmax of full forwards, token by token, at positions past original / factor."""
    _hf_llama(tmp_path)
    model = TinyTransformer.from_pretrained(tmp_path, device=device)
    prompt = np.random.default_rng(7).integers(0, model.config.vocab_size, (1, 70))
    out = model.generate(prompt, max_new_tokens=6, greedy=True)
    seq = prompt
    for _ in range(6):
        logits, _ = model(seq)
        seq = np.concatenate([seq, [[int(np.argmax(logits.numpy()[-1]))]]], axis=1)
    assert np.array_equal(out[0, -6:], seq[0, -6:])
    plain = TinyTransformer.from_pretrained(tmp_path, device=device, rope_scaling=None)
    assert not np.array_equal(plain.generate(prompt, max_new_tokens=6, greedy=True), out)


def test_config_record_and_checks():
    """rope_scaling is saved in to_dict() and read back; a record without it (older checkpoints)
    reads as none; bad values are ValueErrors naming the field."""
    c = small_config(rope_scaling=RopeScaling(**SCALING))
    d = json.loads(json.dumps(c.to_dict()))
    assert d["rope_scaling"] == dict(SCALING, rope_type="llama3")
    assert TransformerConfig.from_dict(d) == c
    old = dict(d)
    del old["rope_scaling"]
    assert TransformerConfig.from_dict(old).rope_scaling is None
    for bad, message in [(dict(SCALING, rope_type="yarn"), "only RoPE scaling"),
                         (dict(SCALING, factor=0.5), "factor must be >= 1"),
                         (dict(SCALING, low_freq_factor=5.0), "low_freq_factor < high_freq_factor"),
                         (dict(SCALING, original_max_position_embeddings=64.5), "must be an integer"),
                         (dict(SCALING, factor=float("inf")), "finite"),
                         ({"factor": 8.0}, "missing keys"), (dict(SCALING, extra=1), "unknown keys")]:
        with pytest.raises(ValueError, match=message):
            TransformerConfig.from_dict({**d, "rope_scaling": bad})
    with pytest.raises(ValueError, match="rope_scaling must be None or a RopeScaling"):
        small_config(rope_scaling=(8.0, 1.0, 4.0, 64))


def test_checkpoint_schema_takes_the_scaling():
    from xtrain.io.schema import SchemaError, check_config

    d = small_config(rope_scaling=RopeScaling(**SCALING)).to_dict()
    check_config(d)
    with pytest.raises(SchemaError, match="rope_scaling"):
        check_config({**d, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


def test_llama_preset_has_the_published_scaling():
    c = config_for("llama3.2-1b", 128256)
    assert c.rope_theta == 5e5
    assert c.rope_scaling == RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192)
    assert hf_config(c, "bf16", 0)["rope_scaling"] == {
        "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        "rope_type": "llama3"}


@pytest.mark.cuda
@pytest.mark.skipif(not xtrain.cuda.is_available(),
                    reason="no CUDA device (xtrain.cuda.is_available() is False): runs on the GPU machine")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama3_cuda_matches_cpu(dtype):
    """The CUDA kernels compute the llama3 frequencies as the CPU does (uncontracted float32):
    rope, qk_norm_rope (forward and backward) and the decode head preparation agree with the CPU
    to the rounding of cos/sin; the frequencies themselves are the same bits (a rotation at
    position 1 of a unit pair, float64, equal to 1e-15)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 50, 3, 64)).astype(np.float32)
    pos = np.arange(50, dtype=np.int64) * 211
    tol = 2e-5 if dtype == "float32" else 2e-2
    got = {}
    for dev in ("cpu", "cuda"):
        t = ops.cast(xtrain.tensor(x, device=dev), dtype)
        got[dev] = ops.cast(ops.rope(t, xtrain.tensor(pos, device=dev), 5e5, LLAMA3), "float32").numpy()
    np.testing.assert_allclose(got["cuda"], got["cpu"], atol=tol)
    unit = np.zeros((1, 2, 1, 64))
    unit[..., :32] = 1.0
    one = {dev: ops.rope(xtrain.tensor(unit, device=dev), xtrain.tensor(np.array([0, 1]), device=dev), 5e5,
                         LLAMA3).numpy() for dev in ("cpu", "cuda")}
    np.testing.assert_allclose(one["cuda"], one["cpu"], atol=1e-15)
    q, k = x[:, :, :2], x[:, :, 2:]
    w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    res = {}
    for dev in ("cpu", "cuda"):
        qt, kt = (xtrain.tensor(np.ascontiguousarray(a), device=dev, requires_grad=True) for a in (q, k))
        wt = xtrain.tensor(w, device=dev, requires_grad=True)
        qo, ko = ops.qk_norm_rope(ops.cast(qt, dtype), ops.cast(kt, dtype), wt, wt, 1e-6, 5e5,
                                  xtrain.tensor(np.tile(pos, (2, 1)), device=dev), LLAMA3)
        (ops.sum(ops.cast(qo, "float32")) + ops.sum(ops.cast(ko, "float32") * 0.5)).backward()
        res[dev] = [ops.cast(qo, "float32").numpy(), qt.grad.numpy(), kt.grad.numpy()]
    for a, b in zip(res["cuda"], res["cpu"]):
        np.testing.assert_allclose(a, b, atol=tol * 5, rtol=tol)
