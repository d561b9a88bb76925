"""Generation with a KV cache (xtrain.models.generate, over xtrain.models.decode's cache and step):
the decode-attention ops against a numpy reference and against flash attention's rows; the cached
generator against the old full re-run (greedy tokens, each step's logits); batched prompts of
different lengths; sampling rules (seeds, top-k, top-p, temperature 0); end-of-text; max_seq; bad
arguments. The `device` fixture adds CUDA on a GPU machine."""

import math

import numpy as np
import pytest

import xtrain
from modelhelp import make_model, random_weights, small_config
from xtrain import ops
from xtrain.models import decode
from xtrain.models import generate as gen
from xtrain.models.decode import KVCache, forward_cached
from xtrain.models.generate import pick

TOL = {"float32": (1e-5, 1e-6), "bfloat16": (2e-2, 2e-2), "float64": (1e-12, 1e-12)}


# ---------------------------------------------------------------- reference implementations

def rerun_greedy(model, prompt, n):
    """The pre-KV-cache generator: re-run the whole prefix for every new token (the baseline)."""
    row = [int(t) for t in prompt]
    with xtrain.no_grad():
        for _ in range(n):
            if len(row) >= model.config.max_seq:
                break
            logits, _ = model(np.array([row]))
            row.append(int(np.argmax(np.asarray(logits.numpy(), np.float32)[-1])))
    return row


def decode_reference(q, k, v, lengths, scale):
    """q (B, H, D), k/v (B, L, Hkv, D), float64."""
    B, H, D = q.shape
    rep = H // k.shape[2]
    out = np.zeros((B, H, D))
    for b in range(B):
        n = lengths[b]
        for h in range(H):
            if n == 0:
                continue
            s = k[b, :n, h // rep] @ q[b, h] * scale
            p = np.exp(s - s.max())
            out[b, h] = p @ v[b, :n, h // rep] / p.sum()
    return out


def as64(t):
    return np.asarray(t.numpy(), dtype=np.float64)


# ---------------------------------------------------------------- ops

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
# On CUDA every case but the last runs the one-pass kernel (few (b, kv head) pairs, L <= 1024:
# Note [Decode attention in one pass]); the last, L > 1024, the split kernels and their combine.
@pytest.mark.parametrize("H, Hkv, D, L", [(4, 4, 8, 37), (4, 2, 32, 37), (6, 1, 16, 5), (2, 2, 32, 700),
                                          (2, 1, 32, 1100),
                                          # the published shapes' heads: Qwen3 16/8 x 128, Llama-3.2 32/8 x 64
                                          (16, 8, 128, 300), (32, 8, 64, 1100)])
def test_decode_attention_matches_reference(device, dtype, H, Hkv, D, L):
    rng = np.random.default_rng(0)
    B = 4
    q = xtrain.tensor(rng.standard_normal((B, H, D)), dtype=dtype, device=device)
    k = xtrain.tensor(rng.standard_normal((B, L, Hkv, D)), dtype=dtype, device=device)
    v = xtrain.tensor(rng.standard_normal((B, L, Hkv, D)), dtype=dtype, device=device)
    lengths = np.array([L, 1, 0, max(L // 3, 1)], dtype=np.int64)
    out = ops.decode_attention(q, k, v, xtrain.tensor(lengths, device=device))
    assert tuple(out.shape) == (B, H, D) and out.dtype == dtype
    ref = decode_reference(as64(q), as64(k), as64(v), lengths, 1 / math.sqrt(D))
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(as64(out), ref, rtol=rtol, atol=atol * 10)
    assert not as64(out)[2].any()  # length 0: zeros
    again = ops.decode_attention(q, k, v, xtrain.tensor(lengths, device=device))
    assert np.array_equal(as64(again), as64(out))  # deterministic


@pytest.mark.parametrize("Hkv", [4, 2])
def test_decode_attention_is_flash_attention_row(device, Hkv):
    """Query i of causal flash attention = decode attention over the first i + 1 keys."""
    rng = np.random.default_rng(1)
    B, S, H, D = 2, 9, 4, 16
    q = xtrain.tensor(rng.standard_normal((B, S, H, D)), dtype="float32", device=device)
    k = xtrain.tensor(rng.standard_normal((B, S, Hkv, D)), dtype="float32", device=device)
    v = xtrain.tensor(rng.standard_normal((B, S, Hkv, D)), dtype="float32", device=device)
    full = ops.flash_attention(q, k, v, causal=True).numpy()
    qn = q.numpy()
    for i in range(S):
        qi = xtrain.tensor(np.ascontiguousarray(qn[:, i]), device=device)
        out = ops.decode_attention(qi, k, v, xtrain.tensor(np.full(B, i + 1, np.int64), device=device))
        np.testing.assert_allclose(out.numpy(), full[:, i], rtol=1e-5, atol=1e-6)


def test_kv_cache_write(device):
    rng = np.random.default_rng(2)
    cache = xtrain.zeros(3, 6, 2, 4, device=device)
    x = rng.standard_normal((3, 2, 2, 4)).astype(np.float32)
    ops.kv_cache_write_(cache, xtrain.tensor(x, device=device), xtrain.tensor(np.array([0, 4, 1]), device=device))
    expect = np.zeros((3, 6, 2, 4), np.float32)
    expect[0, 0:2], expect[1, 4:6], expect[2, 1:3] = x[0], x[1], x[2]
    assert np.array_equal(cache.numpy(), expect)
    with pytest.raises(ValueError, match="more than the cache"):
        ops.kv_cache_write_(cache, xtrain.zeros(3, 7, 2, 4, device=device), xtrain.tensor(np.zeros(3, np.int64),
                                                                                            device=device))
    with pytest.raises(TypeError, match="dtype"):
        ops.kv_cache_write_(cache, xtrain.zeros(3, 1, 2, 4, dtype="bfloat16", device=device),
                            xtrain.tensor(np.zeros(3, np.int64), device=device))


def test_bad_positions_and_lengths(device):
    cache = xtrain.zeros(2, 5, 1, 4, device=device)
    x = xtrain.ones(2, 2, 1, 4, device=device)
    with pytest.raises(IndexError, match="positions"):  # both rows out of range: none written anywhere
        ops.kv_cache_write_(cache, x, xtrain.tensor(np.array([4, -1]), device=device))
        cache.numpy()  # CUDA: reported at the next sync point
    q = xtrain.ones(2, 2, 4, device=device)
    with pytest.raises(IndexError, match="lengths"):
        ops.decode_attention(q, cache, cache, xtrain.tensor(np.array([6, 1]), device=device)).numpy()
    assert np.array_equal(cache.numpy(), np.zeros((2, 5, 1, 4), np.float32))  # nothing written, still usable
    with pytest.raises(TypeError, match="int64"):
        ops.decode_attention(q, cache, cache, xtrain.tensor(np.array([1, 1], np.int32), device=device))
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        ops.decode_attention(q, cache, cache, xtrain.tensor(np.array([1, 1, 1]), device=device))
    with pytest.raises(ValueError, match="multiple"):
        ops.decode_attention(xtrain.ones(2, 3, 4, device=device), xtrain.zeros(2, 5, 2, 4, device=device),
                             xtrain.zeros(2, 5, 2, 4, device=device), xtrain.tensor(np.array([1, 1]), device=device))
    with pytest.raises(ValueError, match=r"\[B, H, D\]"):
        ops.decode_attention(xtrain.ones(2, 2, 8, device=device), cache, cache,
                             xtrain.tensor(np.array([1, 1]), device=device))


def _prep_composition(q, k, v, k_cache, v_cache, positions, wq, wk, eps, theta):
    """A decode step's head preparation (decode_prep_attention's first half) from the separate ops:
    rms_norm, rope at the rows' positions (the rows as rope's sequence axis), the two cache writes."""
    B, H, D = q.shape
    Hkv = k.shape[1]
    if wq is not None:
        q, k = ops.rms_norm(q, wq, eps), ops.rms_norm(k, wk, eps)
    q = ops.rope(q.reshape(1, B, H, D), positions, theta).reshape(B, H, D)
    k = ops.rope(k.reshape(1, B, Hkv, D), positions, theta)
    ops.kv_cache_write_(k_cache, k.reshape(B, 1, Hkv, D), positions)
    ops.kv_cache_write_(v_cache, v.reshape(B, 1, Hkv, D), positions)
    return q


# On CUDA all but the last run the fused one-pass kernel (Note [Decode head preparation inside the
# one-pass attention]; L = 700: rows longer than its 512 threads, past the slots it loads before its
# wait); the last (L > 1024) the head preparation kernel then the split attention kernels. The
# fourth row's new slot lies inside the slots it attends to (length past position + 1). The
# reference composes the separate ops: the preparation (_prep_composition), then decode_attention.
@pytest.mark.parametrize("dtype, w_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                            ("bfloat16", "bfloat16"), ("float64", "float64")])
@pytest.mark.parametrize("H, Hkv, D, L", [(4, 4, 8, 9), (4, 2, 32, 40), (6, 1, 64, 300), (2, 2, 128, 9),
                                          (2, 2, 32, 700), (2, 2, 32, 1100), (16, 8, 128, 40), (32, 8, 64, 300)])
@pytest.mark.parametrize("norm", [True, False])
def test_decode_prep_attention_is_prep_then_attention_bitwise(device, dtype, w_dtype, H, Hkv, D, L, norm):
    rng = np.random.default_rng(H * D + L)
    B = 4

    def t(*shape, dt=dtype):
        return xtrain.tensor(rng.standard_normal(shape).astype(np.float32), device=device).to(dt)
    q, k, v = t(B, H, D), t(B, Hkv, D), t(B, Hkv, D)
    wq, wk = (t(D, dt=w_dtype), t(D, dt=w_dtype)) if norm else (None, None)
    positions = xtrain.tensor(np.array([0, L - 1, L // 3, L // 2]), device=device)
    lengths = xtrain.tensor(np.array([1, L, L // 3 + 1, L]), device=device)
    base = rng.standard_normal((B, L, Hkv, D)).astype(np.float32)
    caches = [[xtrain.tensor(base, device=device).to(dtype) for _ in range(2)] for _ in range(2)]
    qp = _prep_composition(q, k, v, *caches[0], positions, wq, wk, 1e-5, 5000.0)
    want = ops.decode_attention(qp, *caches[0], lengths, 0.3)
    got = ops.decode_prep_attention(q, k, v, *caches[1], positions, lengths, wq, wk, eps=1e-5, theta=5000.0, scale=0.3)
    assert got.dtype == q.dtype and tuple(got.shape) == (B, H, D)
    assert np.array_equal(got.numpy(), want.numpy())
    # The L2 hint changes no value (the same slots rewritten with the same values)
    hinted = ops.decode_prep_attention(q, k, v, *caches[1], positions, lengths, wq, wk, eps=1e-5, theta=5000.0,
                                       scale=0.3, prefetch=[q, caches[0][0], xtrain.zeros(0, device=device)])
    assert np.array_equal(hinted.numpy(), want.numpy())
    for a, b in zip(caches[0], caches[1]):
        assert np.array_equal(a.numpy(), b.numpy())
    # the attention itself, against the float64 reference over the prepared q and the caches
    ref = decode_reference(as64(qp), as64(caches[1][0]), as64(caches[1][1]), lengths.numpy(), 0.3)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(as64(got), ref, rtol=rtol, atol=atol * 10)


def test_decode_prep_attention_bad_arguments(device):
    q, k = xtrain.ones(2, 2, 4, device=device), xtrain.ones(2, 1, 4, device=device)
    cache = xtrain.zeros(2, 5, 1, 4, device=device)
    pos = xtrain.tensor(np.array([0, 4]), device=device)
    with pytest.raises(ValueError, match="lengths must have shape"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, xtrain.tensor(np.array([1]), device=device))
    with pytest.raises(TypeError, match="lengths must be int64"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, xtrain.zeros(2, device=device))
    with pytest.raises(ValueError, match="both q_norm_weight and k_norm_weight"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, pos, xtrain.ones(4, device=device), None)
    with pytest.raises(ValueError, match="scale must be finite"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, pos, scale=float("nan"))
    with pytest.raises(ValueError, match="at most 8 prefetch"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, pos, prefetch=[q] * 9)
    with pytest.raises(TypeError):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, pos, prefetch=[None])
    if device != "cpu":
        with pytest.raises(ValueError, match="on q's device"):
            ops.decode_prep_attention(q, k, k, cache, cache, pos, pos, prefetch=[xtrain.ones(3)])
    with pytest.raises(IndexError, match="lengths"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, xtrain.tensor(np.array([1, 6]), device=device)).numpy()
    with pytest.raises(IndexError, match="positions"):
        ops.decode_prep_attention(q, k, k, cache, cache, xtrain.tensor(np.array([5, 0]), device=device), pos).numpy()
    ok = ops.decode_prep_attention(q, k, k, cache, cache, pos, xtrain.tensor(np.array([1, 5]), device=device))
    assert np.isfinite(ok.numpy()).all()  # the stream and the op work again after the raises


def test_decode_prep_attention_bad_head_arguments(device):
    q, k = xtrain.ones(2, 2, 4, device=device), xtrain.ones(2, 1, 4, device=device)
    cache = xtrain.zeros(2, 5, 1, 4, device=device)
    pos = xtrain.tensor(np.array([0, 1]), device=device)
    lengths = xtrain.tensor(np.array([1, 2]), device=device)
    w = xtrain.ones(4, device=device)
    with pytest.raises(ValueError, match="both"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, lengths, w, None)
    with pytest.raises(ValueError, match=r"\[B, H_kv, D\]"):
        ops.decode_prep_attention(q, q, q, cache, cache, pos, lengths)
    with pytest.raises(ValueError, match="even"):
        ops.decode_prep_attention(xtrain.ones(2, 2, 3, device=device), xtrain.ones(2, 1, 3, device=device),
                                  xtrain.ones(2, 1, 3, device=device), xtrain.zeros(2, 5, 1, 3, device=device),
                                  xtrain.zeros(2, 5, 1, 3, device=device), pos, lengths)
    with pytest.raises(ValueError, match=r"shape \[4\]"):
        ops.decode_prep_attention(q, k, k, cache, cache, pos, lengths, xtrain.ones(3, device=device),
                                  xtrain.ones(3, device=device))
    with pytest.raises(IndexError, match="positions"):  # slot 5 of 5: nothing written
        ops.decode_prep_attention(q, k, k, cache, cache, xtrain.tensor(np.array([5, -1]), device=device),
                                  lengths).numpy()
    assert np.array_equal(cache.numpy(), np.zeros((2, 5, 1, 4), np.float32))


def _greedy_state(B, positions, limits, done=None, count=None):
    z = np.zeros(B, np.int64)
    return np.stack([z, positions, np.asarray(positions) + 1, limits,
                     z if done is None else done, z if count is None else count]).astype(np.int64)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_greedy_next_picks_like_numpy_and_advances(device, dtype):
    rng = np.random.default_rng(4)
    B, V = 5, 3001
    logits = rng.standard_normal((B, V)).astype(np.float32)
    logits[1, [7, 2900]] = 9.0           # a tie: the first
    logits[2, [5, 40]] = np.nan          # NaN above everything: the first NaN
    logits[3] = 0.0
    logits[3, [11, 12]] = [-0.0, 0.0]    # all equal: index 0
    host = np.asarray(xtrain.tensor(logits).to(dtype).numpy(), np.float32)
    want = np.argmax(host, axis=1)
    assert want[1] == 7 and want[2] == 5 and want[3] == 0
    # row 3 at its limit, row 4 already done: neither takes a token
    state = xtrain.tensor(_greedy_state(B, [4, 0, 9, 6, 2], [9, 2, 20, 7, 9], done=[0, 0, 0, 0, 1],
                                        count=[0, 0, 0, 0, 0]), device=device)
    ring = xtrain.zeros(2, B, dtype="int64", device=device)
    x = xtrain.tensor(logits, device=device).to(dtype)
    ops.greedy_next_(x, state, ring, stop_token=int(want[2]))
    s = state.numpy()
    assert ring.numpy()[0].tolist() == [want[0], want[1], want[2], -1, -1]
    assert s[0, :3].tolist() == want[:3].tolist() and s[0, 3:].tolist() == [0, 0]
    assert s[1].tolist() == [5, 1, 10, 6, 2] and s[2].tolist() == [6, 2, 11, 7, 3]
    assert s[4].tolist() == [0, 0, 1, 1, 1]          # row 2 took its stop token, row 3 hit its limit
    assert s[5].tolist() == [1] * B
    ops.greedy_next_(x, state, ring)                  # row 1 reaches its limit of 2: done, -1
    ops.greedy_next_(x, state, ring)                  # the ring wraps to slot 0
    r = ring.numpy()
    assert r[1].tolist() == [want[0], -1, -1, -1, -1] and r[0].tolist() == [want[0], -1, -1, -1, -1]
    assert state.numpy()[1].tolist() == [7, 1, 10, 6, 2] and state.numpy()[5].tolist() == [3] * B


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_next_on_long_rows_picks_the_first_maximum(device, dtype):
    # rows long enough for the CUDA kernel's unrolled loads (8 per thread of 512) and its tail:
    # ties and NaNs in the unrolled part, in the tail, and split between the two
    rng = np.random.default_rng(11)
    B, V = 6, 8 * 512 * 3 + 77
    logits = rng.standard_normal((B, V)).astype(np.float32)
    logits[0, [5000, 9000]] = 7.0                 # tie inside the unrolled part, same thread's share
    logits[1, [V - 3, 100]] = 7.0                 # the tail's maximum ties an earlier one: the earlier
    logits[2, [V - 1]] = 8.0                      # the maximum is the last element
    logits[3, [4095, 4096 + 511]] = np.nan        # NaN beats everything: the first
    logits[4] = -1.0                              # all equal: index 0
    logits[5, [512 * 8 + 1, 1]] = 6.5             # the same thread, two loop trips apart
    host = np.asarray(xtrain.tensor(logits).to(dtype).numpy(), np.float32)
    want = np.argmax(host, axis=1)
    assert want.tolist()[:5] == [5000, 100, V - 1, 4095, 0]
    state = xtrain.tensor(_greedy_state(B, [0] * B, [100] * B), device=device)
    ring = xtrain.zeros(1, B, dtype="int64", device=device)
    ops.greedy_next_(xtrain.tensor(logits, device=device).to(dtype), state, ring)
    assert ring.numpy()[0].tolist() == want.tolist()


def test_greedy_next_bad_arguments(device):
    x = xtrain.zeros(2, 5, device=device)
    state = xtrain.tensor(_greedy_state(2, [0, 0], [3, 3]), device=device)
    ring = xtrain.zeros(1, 2, dtype="int64", device=device)
    with pytest.raises(ValueError, match=r"\[6, B\]"):
        ops.greedy_next_(x, xtrain.zeros(5, 2, dtype="int64", device=device), ring)
    with pytest.raises(TypeError, match="int64"):
        ops.greedy_next_(x, state, xtrain.zeros(1, 2, device=device))
    with pytest.raises(ValueError, match=r"\[R, B\]"):
        ops.greedy_next_(x, state, xtrain.zeros(0, 2, dtype="int64", device=device))
    with pytest.raises(ValueError, match="stop_token"):
        ops.greedy_next_(x, state, ring, stop_token=-3)
    with pytest.raises(ValueError, match="V >= 1"):
        ops.greedy_next_(xtrain.zeros(2, 0, device=device), state, ring)


# ---------------------------------------------------------------- the cached generator

def _model(device, dtype="float32", **overrides):
    return make_model(small_config(max_seq=48, bf16=dtype == "bfloat16", **overrides), device, weights_seed=2)


PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 41, 42, 43, 44, 45]]


@pytest.mark.parametrize("n_heads, head_dim, options", [
    (2, 16, {}), (4, 8, {}),
    (4, 8, {"n_kv_heads": 2, "tie_embeddings": True}),  # grouped-query attention, tied head
    (4, 16, {"n_kv_heads": 1, "qk_norm": False}),        # multi-query, Llama-style (no q/k norm)
])
def test_greedy_equals_the_full_rerun(device, n_heads, head_dim, options):
    model = _model(device, n_heads=n_heads, head_dim=head_dim, **options)
    for prompt in PROMPTS:  # one at a time, several lengths
        out = model.generate([prompt], 12, greedy=True)
        assert out.tolist() == [rerun_greedy(model, prompt, 12)]
    out = model.generate(PROMPTS, 12, greedy=True)  # batched, different lengths
    assert out.shape == (len(PROMPTS), max(map(len, PROMPTS)) + 12)
    for b, prompt in enumerate(PROMPTS):
        ref = rerun_greedy(model, prompt, 12)
        assert out[b, :len(ref)].tolist() == ref
        assert (out[b, len(ref):] == 0).all()  # padded with pad_token (default 0 without a stop token)


def test_step_logits_match_the_full_forward(device):
    """Prefill and every decode step give the logits of the full forward's last row."""
    model = _model(device)
    rng = np.random.default_rng(3)
    lens = [3, 7, 1]
    seqs = [rng.integers(0, 96, n + 10) for n in lens]
    B, P = len(lens), max(lens)
    cache = KVCache(model, B, P + 10)
    padded = np.zeros((B, P), np.int64)
    for b, n in enumerate(lens):
        padded[b, :n] = seqs[b][:n]
    with xtrain.no_grad():
        cache.at(np.zeros(B, np.int64))
        last = xtrain.tensor(np.arange(B) * P + np.array(lens) - 1, device=device)
        logits = forward_cached(model, xtrain.tensor(padded, device=device), cache, last)
        cache.empty = False
        for t in range(10):
            for b, n in enumerate(lens):
                full, _ = model(seqs[b][None, :n + t])
                np.testing.assert_allclose(logits.numpy()[b], full.numpy()[-1], rtol=1e-5, atol=2e-5,
                                           err_msg=f"step {t}, row {b}")
            cache.at(np.array(lens) + t)
            ids = np.array([[seqs[b][n + t]] for b, n in enumerate(lens)])
            logits = forward_cached(model, xtrain.tensor(ids, device=device), cache)
    assert xtrain.is_grad_enabled()


def test_bf16_step_logits_close(device):
    if device == "cpu":
        pytest.skip("bf16 models run on CUDA (the CPU test of the cache is float32)")
    model = _model(device, "bfloat16")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    out = model.generate([prompt], 8, greedy=True)
    with xtrain.no_grad():
        full, _ = model(out[:, :-1])
    ref = np.asarray(full.numpy(), np.float32)
    # every generated token is (nearly) the argmax of the full forward at its position
    for i in range(len(prompt), out.shape[1]):
        row = ref[i - 1]
        assert row[out[0, i]] >= row.max() - 0.1 * (np.abs(row).max() + 1)


def test_recompute_model_generates_the_same(device):
    a = _model(device).generate(PROMPTS, 6, greedy=True)
    b = _model(device, recompute=True).generate(PROMPTS, 6, greedy=True)
    assert np.array_equal(a, b)


def test_sampling_is_reproducible(device):
    model = _model(device)
    kw = dict(temperature=1.3, top_k=20, top_p=0.95)
    a = model.generate(PROMPTS, 10, seed=7, **kw)
    assert np.array_equal(a, model.generate(PROMPTS, 10, seed=7, **kw))
    assert not np.array_equal(a, model.generate(PROMPTS, 10, seed=8, **kw))
    g = np.random.Generator(np.random.PCG64(7))
    assert np.array_equal(a, model.generate(PROMPTS, 10, generator=g, **kw))
    assert model.training  # restored


def test_greedy_limits_of_sampling(device):
    model = _model(device)
    greedy = model.generate(PROMPTS, 8, greedy=True)
    assert np.array_equal(model.generate(PROMPTS, 8, temperature=0), greedy)
    assert np.array_equal(model.generate(PROMPTS, 8, temperature=2.0, top_k=1, seed=3), greedy)
    assert np.array_equal(model.generate(PROMPTS, 8, temperature=2.0, top_p=1e-9, seed=3), greedy)
    # top_p = 1 and top_k >= vocab are no restriction: the same draws as neither
    plain = model.generate(PROMPTS, 8, temperature=1.0, seed=5)
    assert np.array_equal(model.generate(PROMPTS, 8, temperature=1.0, top_p=1.0, seed=5), plain)
    assert np.array_equal(model.generate(PROMPTS, 8, temperature=1.0, top_k=500, seed=5), plain)


def test_pick_top_k_and_top_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.tile(np.log(probs), (4000, 1)).astype(np.float32)
    rng = np.random.Generator(np.random.PCG64(0))

    def support(**kw):
        return set(pick(logits, 1.0, kw.get("top_k"), kw.get("top_p"), False, rng).tolist())

    assert support() == {0, 1, 2, 3}
    assert support(top_k=2) == {0, 1}
    assert support(top_p=0.45) == {0}            # the most likely token alone reaches 0.45
    assert support(top_p=0.79) == {0, 1}
    assert support(top_p=0.81) == {0, 1, 2}
    assert support(top_p=0.99) == {0, 1, 2, 3}
    assert support(top_k=3, top_p=0.99) == {0, 1, 2}
    draws = pick(logits, 1.0, None, None, False, rng)
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), probs, atol=0.03)
    # top-p over a vocabulary larger than its candidate window
    wide = np.zeros((2, 5000), np.float32)
    assert len(set(pick(wide, 1.0, None, 0.5, False, rng).tolist())) == 2
    hot = np.full((1000, 5000), -5.0, np.float32)
    hot[:, 4321] = 10.0
    assert set(pick(hot, 1.0, None, 0.9, False, rng).tolist()) == {4321}
    assert pick(hot[:2], 1.0, None, None, True, rng).tolist() == [4321, 4321]


def test_stop_token_ends_its_row(device):
    model = _model(device)
    greedy = model.generate(PROMPTS, 10, greedy=True)
    stop = int(greedy[0, len(PROMPTS[0]) + 2])  # row 0's third new token
    out = model.generate(PROMPTS, 10, greedy=True, stop_token=stop)
    for b, prompt in enumerate(PROMPTS):
        new = greedy[b, len(prompt):len(prompt) + 10].tolist()
        n = new.index(stop) + 1 if stop in new else len(new)
        assert out[b, :len(prompt) + n].tolist() == greedy[b, :len(prompt) + n].tolist()
        assert (out[b, len(prompt) + n:] == stop).all()  # padded with the stop token
    end0 = len(PROMPTS[0]) + greedy[0, len(PROMPTS[0]):].tolist().index(stop) + 1  # row 0's end
    assert end0 <= len(PROMPTS[0]) + 3 and out.shape[1] > end0
    padded = model.generate(PROMPTS, 10, greedy=True, stop_token=stop, pad_token=95)
    assert padded[0, end0 - 1] == stop and (padded[0, end0:] == 95).all()
    # every row stopping at once ends the call early
    one = model.generate([PROMPTS[0]], 10, greedy=True, stop_token=stop)
    assert one.tolist() == [greedy[0, :end0].tolist()]


def test_max_seq_bounds_each_row(device):
    model = _model(device)  # max_seq 48
    out = model.generate([list(range(46)), [1, 2]], 10, greedy=True)
    assert out.shape == (2, 48)
    assert out[0].tolist() == rerun_greedy(model, list(range(46)), 10)  # 2 new tokens, then max_seq
    assert out[1, :12].tolist() == rerun_greedy(model, [1, 2], 10)
    full = model.generate([list(range(48))], 5, greedy=True)
    assert full.tolist() == [list(range(48))]  # a prompt of max_seq tokens gets none
    assert model.generate(PROMPTS, 0).shape == (len(PROMPTS), 11)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(prompts=[[1, 2]], max_new_tokens=3, temperature=-0.5), ValueError, "temperature"),
    (dict(prompts=[[1, 2]], max_new_tokens=3, temperature=float("nan")), ValueError, "temperature"),
    (dict(prompts=[[1, 2]], max_new_tokens=3, top_p=0.0), ValueError, "top_p"),
    (dict(prompts=[[1, 2]], max_new_tokens=3, top_p=1.5), ValueError, "top_p"),
    (dict(prompts=[[1, 2]], max_new_tokens=3, top_k=0), ValueError, "top_k"),
    (dict(prompts=[[1, 2]], max_new_tokens=-1), ValueError, "max_new_tokens"),
    (dict(prompts=[[]], max_new_tokens=3), ValueError, "non-empty"),
    (dict(prompts=[], max_new_tokens=3), ValueError, "non-empty"),
    (dict(prompts=np.zeros((1, 0), np.int64), max_new_tokens=3), ValueError, "non-empty"),
    (dict(prompts=[[1, 2], [3]], max_new_tokens=3, stop_token=96), ValueError, "stop_token"),
    (dict(prompts=[[1, 200]], max_new_tokens=3), ValueError, "outside"),
    (dict(prompts=[[0.5, 1.0]], max_new_tokens=3), TypeError, "integer"),
    (dict(prompts=[list(range(49))], max_new_tokens=3), ValueError, "max_seq"),
])
def test_bad_arguments(kwargs, error, match):
    model = _model("cpu")
    with pytest.raises(error, match=match):
        model.generate(**kwargs)


@pytest.mark.parametrize("ring", [32, 3, 1])
def test_device_greedy_equals_host_greedy(device, monkeypatch, ring):
    """Greedy decoding picks on the device (ops.greedy_next_, the tokens read every `ring` steps):
    the same tokens as picking on the host with numpy's argmax, for batched prompts of different
    lengths, with a stop token (found late, mid-ring), and rows cut by max_seq."""
    monkeypatch.setattr(gen, "GREEDY_RING", ring)
    dtype = "bfloat16" if str(device).startswith("cuda") else "float32"
    for options in ({}, dict(n_heads=4, head_dim=8, n_kv_heads=1, qk_norm=False)):
        model = _model(device, dtype, **options)
        host = {}
        for on_device in (False, True):
            monkeypatch.setattr(gen, "DEVICE_GREEDY", on_device)
            plain = model.generate(PROMPTS, 40, greedy=True)          # rows end at max_seq 48
            stop = int(plain[1, len(PROMPTS[1]) + 5])
            stopped = model.generate(PROMPTS, 20, greedy=True, stop_token=stop, pad_token=1)
            one = model.generate([PROMPTS[2]], 7, greedy=True)
            got = (plain, stopped, one)
            if not on_device:
                host = got
        for a, b in zip(host, got):
            assert np.array_equal(a, b)
        assert plain.shape == (len(PROMPTS), 48)


# ---------------------------------------------------------------- the decode step as a CUDA graph

needs_gpu = pytest.mark.skipif(not xtrain.cuda.is_available(),
                               reason="needs a CUDA GPU (the lead runs these on the H200)")
GRAPH_CONFIGS = {"mha": {}, "gqa": dict(n_heads=4, head_dim=8, n_kv_heads=2), "tied": dict(tie_embeddings=True),
                 "mqa-no-qk-norm": dict(n_heads=4, head_dim=8, n_kv_heads=1, qk_norm=False)}


def _generate_recording(monkeypatch, model, prompts, n, **kw):
    """model.generate(...) and the float32 logits (R, V) of each step that pick saw, copied."""
    seen = []
    real_pick = gen.pick

    def spy(logits, *args):
        seen.append(np.array(logits, copy=True))
        return real_pick(logits, *args)

    monkeypatch.setattr(gen, "pick", spy)
    out = model.generate(prompts, n, **kw)
    monkeypatch.setattr(gen, "pick", real_pick)
    return out, seen


def _same_steps(a, b):
    (out_a, logits_a), (out_b, logits_b) = a, b
    assert np.array_equal(out_a, out_b)
    assert len(logits_a) == len(logits_b)
    for t, (x, y) in enumerate(zip(logits_a, logits_b)):
        assert np.array_equal(x, y), f"step {t}"


class _Rerun:
    """Stands in for xtrain.cuda.Graph on the CPU (with _record as generate's _capture): the
    'capture' keeps the step and runs nothing, as a real capture; each replay runs the step again
    from whatever its buffers hold now. So a replay follows the eager step only if every per-token
    value goes through buffers that exist before the capture."""
    made = []
    fail = False

    def __init__(self, device=0, share_pool_with=None):
        type(self).made.append(self)
        self.replays, self.num_nodes = 0, 7

    def record(self, step):
        if type(self).fail:
            raise RuntimeError("a host-to-device copy cannot run while this thread captures a CUDA graph")
        self.step = step

    def replay(self):
        self.replays += 1
        self.step()


def _stand_in_graphs(monkeypatch, fail=False):
    monkeypatch.setattr(_Rerun, "made", [])
    monkeypatch.setattr(_Rerun, "fail", fail)
    monkeypatch.setattr(xtrain.cuda, "Graph", _Rerun)
    monkeypatch.setattr(gen, "_capture", lambda graph, step: graph.record(step))
    monkeypatch.setattr(gen, "decode_graph_blocker", lambda model, cuda_graphs: None if cuda_graphs else "off")
    monkeypatch.setattr(gen, "_failure_noted", False)


def _made_graphs(monkeypatch):
    """The DecodeGraph objects generate() makes from now on, in a list."""
    made = []

    class Spy(gen.DecodeGraph):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(gen, "DecodeGraph", Spy)
    return made


def test_decode_graph_blocker_and_switch():
    model = _model("cpu")
    assert gen.decode_graph_blocker(model, True) == "not a CUDA device"
    assert gen.decode_graph_blocker(model, False) == "switched off"
    with pytest.raises(TypeError, match="cuda_graphs"):
        model.generate([[1, 2]], 3, cuda_graphs="yes")
    # on the CPU the switch changes nothing
    on = model.generate(PROMPTS, 6, greedy=True, cuda_graphs=True)
    off = model.generate(PROMPTS, 6, greedy=True, cuda_graphs=False)
    assert np.array_equal(on, off)


@pytest.mark.parametrize("name", ["mha", "gqa", "tied", "mqa-no-qk-norm"])
def test_decode_graph_plumbing_with_a_stand_in(monkeypatch, capsys, name):
    """Warm-up step, capture at the second decode step, one replay per later step, every per-token
    value (tokens, positions, lengths) through the static inputs: the same tokens and logits as
    the eager path, batched prompts of different lengths, sampled and with a stop token."""
    model = _model("cpu", **GRAPH_CONFIGS[name])
    made = _made_graphs(monkeypatch)
    greedy = model.generate(PROMPTS, 10, greedy=True, cuda_graphs=False)
    stop = int(greedy[0, len(PROMPTS[0]) + 2])
    for kw in (dict(greedy=True), dict(temperature=0.9, top_k=20, seed=3, stop_token=stop)):
        eager = _generate_recording(monkeypatch, model, PROMPTS, 10, cuda_graphs=False, **kw)
        _stand_in_graphs(monkeypatch)
        made.clear()
        graphed = _generate_recording(monkeypatch, model, PROMPTS, 10, **kw)
        _same_steps(eager, graphed)
        (g,) = _Rerun.made
        (dg,) = made
        # one step per pick after the prefill's; no replay for the warm-up step
        assert dg.runs == (len(graphed[1]) - 1 if graphed[1] else 9) and g.replays == dg.runs - 1
        off = _generate_recording(monkeypatch, model, PROMPTS, 10, cuda_graphs=False, **kw)
        _same_steps(eager, off)
        assert len(_Rerun.made) == 1  # switched off: nothing captured
        made.clear()
    one = _generate_recording(monkeypatch, model, [PROMPTS[2]], 5, greedy=True)
    _same_steps(_generate_recording(monkeypatch, model, [PROMPTS[2]], 5, greedy=True, cuda_graphs=False), one)
    assert "xtrain" not in capsys.readouterr().err


@pytest.mark.parametrize("model_kw", [{}, dict(dtype="bfloat16", tie_embeddings=True)], ids=["f32", "bf16-tied"])
@pytest.mark.parametrize("kw", [dict(greedy=True), dict(temperature=0.9, top_k=20, seed=3)])
def test_kept_decode_step_replays_for_the_next_call_of_its_shape(monkeypatch, kw, model_kw):
    """generate() keeps its captured step (KeptDecode): a later call of the same shape with other
    prompts makes no new graph and replays from its first decode step, with the eager path's
    tokens and logits; new weights (load_state_dict writes the same buffers) are seen; another
    shape, release_decode, KEEP_DECODE = False and a cache over KEEP_DECODE_MAX_BYTES each make a
    new one. Run with the CPU stand-in for the graph (every replay reruns the captured step from the
    buffers it was captured with, so a stale buffer would show). In bf16 with a tied head the
    head's cast is the cache's buffer, re-cast at each call's prefill."""
    model = _model("cpu", **model_kw)
    made = _made_graphs(monkeypatch)
    _stand_in_graphs(monkeypatch)
    a = [[1, 2, 3], [5, 6, 7]]
    b = [[9, 8, 7], [30, 31, 32]]      # the same lengths: the same shape

    def check(prompts, n=8, new_graph=False, **extra):
        graphs = len(_Rerun.made)
        eager = _generate_recording(monkeypatch, model, prompts, n, cuda_graphs=False, **kw, **extra)
        made.clear()
        got = _generate_recording(monkeypatch, model, prompts, n, **kw, **extra)
        _same_steps(eager, got)
        assert len(made) == (1 if new_graph else 0) and len(_Rerun.made) == graphs + (1 if new_graph else 0)
        return got

    check(a, new_graph=True)
    (g,) = _Rerun.made
    before = g.replays
    check(b)                                            # kept: replays only, from the first decode step
    assert g.replays == before + 7                      # 8 picks: the prefill's, then 7 replayed steps
    check(a)
    model.load_state_dict(random_weights(model, 9))     # new weights in the same buffers
    check(b)
    check(a, n=9, new_graph=True)                       # another shape (the cache's slots)
    check([[1, 2, 3]], n=9, new_graph=True)             # another batch
    check([[1, 2, 3]], n=9)
    gen.release_decode(model)
    check([[1, 2, 3]], n=9, new_graph=True)
    monkeypatch.setattr(gen, "KEEP_DECODE", False)
    check([[1, 2, 3]], n=9, new_graph=True)
    check([[1, 2, 3]], n=9, new_graph=True)
    monkeypatch.setattr(gen, "KEEP_DECODE", True)
    check([[1, 2, 3]], n=9)                             # what was kept before is still there
    gen.release_decode(model)
    monkeypatch.setattr(gen, "KEEP_DECODE_MAX_BYTES", 64)
    check([[1, 2, 3]], n=9, new_graph=True)
    check([[1, 2, 3]], n=9, new_graph=True)


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_a_tied_heads_cast_is_made_once_per_call(monkeypatch, arch):
    """Note [The tied head's cast in generation]: in bf16 a tied table is cast for the head at the
    prefill only, not at every decode step (eager and with the graph's stand-in), and the tokens
    and logits are those of a cast per step."""
    if arch == "gpt2":
        from xtrain.models.gpt2 import GPT2, GPT2Config
        model = GPT2(GPT2Config(vocab_size=97, dim=32, n_layers=2, n_heads=2, max_seq=48, bf16=True), seed=3)
    else:
        model = _model("cpu", dtype="bfloat16", tie_embeddings=True)
    calls = []
    real = type(model).head_weight

    def counting(self):
        calls.append(1)
        return real(self)

    reference = []
    for per_step in (True, False):
        if per_step:  # the old behaviour: a cast at every forward
            monkeypatch.setattr(decode.KVCache, "head_weight", lambda self, m: m.head_weight())
        monkeypatch.setattr(type(model), "head_weight", counting)
        for graphs in (False, True):
            if graphs:
                _stand_in_graphs(monkeypatch)
            calls.clear()
            got = _generate_recording(monkeypatch, model, PROMPTS, 7, greedy=True, cuda_graphs=graphs)
            if per_step:
                reference.append(got)
                assert len(calls) > 1
            else:
                _same_steps(reference[int(graphs)], got)
                assert len(calls) == 1, calls
        monkeypatch.undo()


def test_kept_decode_step_keys(monkeypatch):
    """A kept step is replayed only where it is the same step: greedy and sampled, the stop token
    and the greedy ring's length each make a new one; a model without a parameter store keeps
    nothing; the keeping thread's step is not replayed on another thread."""
    model = _model("cpu")
    made = _made_graphs(monkeypatch)
    _stand_in_graphs(monkeypatch)
    prompts = [[1, 2, 3], [5, 6, 7]]

    def new_graphs(**kw):
        made.clear()
        model.generate(prompts, 8, **kw)
        return len(made)

    assert new_graphs(greedy=True) == 1 and new_graphs(greedy=True) == 0
    assert new_graphs(temperature=0.5, seed=1) == 1 and new_graphs(temperature=0.7, seed=2) == 0
    assert new_graphs(greedy=True) == 1
    assert new_graphs(greedy=True, stop_token=5) == 1 and new_graphs(greedy=True, stop_token=5) == 0
    assert new_graphs(greedy=True, stop_token=6) == 1
    monkeypatch.setattr(gen, "GREEDY_RING", 4)          # picks > ring: the ring is 4 long, not 8
    assert new_graphs(greedy=True, stop_token=6) == 1
    import threading
    counts = []
    t = threading.Thread(target=lambda: counts.append(new_graphs(greedy=True, stop_token=6)))
    t.start()
    t.join()
    assert counts == [1]
    # release_decode (and a kept step replaced by another) frees the cache at once, without a
    # garbage collection: nothing of it is in a reference cycle
    import gc
    import weakref
    gc.disable()
    try:
        made.clear()
        _Rerun.made.clear()                             # the test's own lists hold every step
        kept = weakref.ref(model.__dict__["_kept_decode"].cache)
        gen.release_decode(model)
        assert kept() is None
        model.generate(prompts, 8, greedy=True)
        kept = weakref.ref(model.__dict__["_kept_decode"].cache)
        made.clear()
        _Rerun.made.clear()
        model.generate(prompts, 9, greedy=True)
        assert kept() is None and model.__dict__["_kept_decode"] is not None
    finally:
        gc.enable()
    key = gen._keep_key(model, ("greedy", 4, None), 2, 8)
    monkeypatch.setattr(decode, "DECODE_L2_PREFETCH_BYTES", 1 << 20)   # the step is built differently
    assert gen._keep_key(model, ("greedy", 4, None), 2, 8) != key


def test_decode_graph_capture_failure_falls_back_once(monkeypatch, capsys):
    model = _model("cpu")
    eager = _generate_recording(monkeypatch, model, PROMPTS, 8, greedy=True, cuda_graphs=False)
    _stand_in_graphs(monkeypatch, fail=True)
    _same_steps(eager, _generate_recording(monkeypatch, model, PROMPTS, 8, greedy=True))
    err = capsys.readouterr().err
    assert err.count("CUDA graph failed") == 1 and "run eagerly" in err and "host-to-device" in err
    _same_steps(eager, _generate_recording(monkeypatch, model, PROMPTS, 8, greedy=True))
    assert capsys.readouterr().err == ""  # noted once per process
    assert all(g.replays == 0 for g in _Rerun.made)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["mha", "gqa", "tied", "mqa-no-qk-norm"])
def test_decode_graph_equals_eager_bitwise(monkeypatch, dtype, name):
    """On a GPU: generate with the decode step replayed as a CUDA graph gives the eager path's
    tokens and the logits of every step bit for bit (batch 1, a batch of different prompt lengths,
    greedy and sampled with a stop token), and the graph really was captured and replayed."""
    model = _model("cuda", dtype, **GRAPH_CONFIGS[name])
    made = _made_graphs(monkeypatch)
    monkeypatch.setattr(gen, "_failure_noted", False)
    greedy = model.generate(PROMPTS, 12, greedy=True, cuda_graphs=False)
    stop = int(greedy[1, len(PROMPTS[1]) + 3])
    for prompts in ([PROMPTS[2]], PROMPTS):
        for kw in (dict(greedy=True), dict(temperature=0.8, top_k=30, top_p=0.95, seed=5, stop_token=stop)):
            eager = _generate_recording(monkeypatch, model, prompts, 12, cuda_graphs=False, **kw)
            made.clear()
            graphed = _generate_recording(monkeypatch, model, prompts, 12, **kw)
            _same_steps(eager, graphed)
            (dg,) = made
            assert dg.failed is None and dg.graph is not None and dg.num_nodes > 0
            assert dg.runs == (len(graphed[1]) - 1 if graphed[1] else 11)  # a step per pick but the prefill's
            assert dg.graph.replays == dg.runs - 1                       # all but the warm-up
    assert gen._failure_noted is False


@needs_gpu
def test_decode_graph_many_steps_and_zero_raw_allocations(monkeypatch):
    """256 new tokens at batch 3 in bf16: the graph path equals the eager one, and once the step is
    captured, no step allocates from the driver."""
    model = make_model(small_config(max_seq=300, bf16=True), "cuda", weights_seed=2)
    prompts = [list(range(1, 9)), [5], list(range(20, 40))]
    eager = model.generate(prompts, 256, greedy=True, cuda_graphs=False)
    raw = []
    real_run = gen.DecodeGraph.run

    def counting_run(self):
        raw.append(xtrain.memory_stats("cuda")["num_raw_alloc"])
        return real_run(self)

    monkeypatch.setattr(gen.DecodeGraph, "run", counting_run)
    graphed = model.generate(prompts, 256, greedy=True)
    assert np.array_equal(eager, graphed)
    assert len(raw) == 255 and len(set(raw[2:])) == 1  # from the first replay on


def test_early_launch_scope_sets_and_restores():
    """xtrain.cuda.early_launch: the thread's request inside the block, the previous one after it
    (also when the block raises), and nested blocks restore in order. Without CUDA nothing launches
    early."""
    assert xtrain._C.cuda.set_early_launch(False) is False
    with xtrain.cuda.early_launch():
        assert xtrain._C.cuda.set_early_launch(True) is True      # asked for inside
        with xtrain.cuda.early_launch(False):
            assert xtrain._C.cuda.set_early_launch(False) is False
        assert xtrain._C.cuda.set_early_launch(True) is True      # the outer request is back
    assert xtrain._C.cuda.set_early_launch(False) is False
    with pytest.raises(KeyError):
        with xtrain.cuda.early_launch():
            raise KeyError("x")
    assert xtrain._C.cuda.set_early_launch(False) is False
    if not xtrain.cuda.is_available():
        with xtrain.cuda.early_launch():
            assert xtrain._C.cuda.early_launch(0) is False


def _sm_major():
    import re
    m = re.search(r"sm_(\d+)", xtrain.cuda.runtime_info())
    return int(m.group(1)) // 10 if m else 0


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_early_launch_changes_no_bit(monkeypatch, dtype, cuda_graphs):
    """On a GPU: the decode step's kernels launched early (Note [Early launch of the decode step's
    kernels]: they load their weights before waiting for the kernel ahead) give the plain launches'
    tokens and every step's logits bit for bit: greedy (the pick launched early too) and sampled,
    batch 1 and a batch of three prompt lengths, eager and replayed, 64 steps each; a width of 256
    takes the lone row's norm-in-registers kernel at batch 1 in bf16. On sm_90 and later the
    request really is in force inside the step."""
    cfg = small_config(vocab_size=300, dim=256, n_layers=3, n_heads=8, head_dim=32, n_kv_heads=4, ffn_dim=512,
                       max_seq=160, bf16=dtype == "bfloat16")
    model = make_model(cfg, "cuda", weights_seed=4)
    real = xtrain.cuda.early_launch
    in_force = []

    class Watched(real):
        def __enter__(self):
            r = super().__enter__()
            in_force.append(xtrain._C.cuda.early_launch(0))
            return r

    prompts = [[[7, 8, 9]], [list(range(1, 9)), [5], list(range(20, 50))]]
    kws = [dict(greedy=True), dict(temperature=0.9, top_k=40, seed=3)]

    def run():
        return [_generate_recording(monkeypatch, model, p, 64, cuda_graphs=cuda_graphs, **kw)
                for p in prompts for kw in kws]

    monkeypatch.setattr(gen, "KEEP_DECODE", False)  # each call captures its own step
    monkeypatch.setattr(xtrain.cuda, "early_launch", Watched)
    early = run()
    assert in_force and all(on == (_sm_major() >= 9) for on in in_force)
    monkeypatch.setattr(xtrain.cuda, "early_launch", lambda on=True: real(False))
    plain = run()
    for a, b in zip(early, plain):
        _same_steps(a, b)
