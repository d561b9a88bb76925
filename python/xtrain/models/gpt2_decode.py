"""GPT2's forward for generation over a KV cache (decode.KVCache): what decode.forward_cached runs
for a GPT2 model, so that xtrain.models.generate (prompts, picks, stop tokens, the decode step as a
CUDA graph) works unchanged.

    prefill (cache empty)  ids (B, P) -> wte + wpe(0..P-1) -> L x block(x, P, cache layer)
                           -> each row's last real position -> ln_f -> head (wte) -> logits (B, V)
    decode step            token (B, 1) at each row's position -> wte + wpe(position) -> L x
                           decode block -> ln_f -> head -> logits (B, V)

Decisions:
- The prefill is the model's own blocks over plain tensors (Attention.forward writes k and v into
  the cache): causal flash attention over right-padded rows, so padding never reaches a real
  position.
- A decode step per layer: ln_1 (its residual add fused: ops.add_layer_norm), the q/k/v GEMM
  (ops.linear_multi) and biases, k and v written at each row's position (ops.kv_cache_write_),
  ops.decode_attention over the row's first `length` slots, c_proj, ln_2 (fused add), the MLP.
  Everything a step reads that changes from token to token (positions, lengths, the cache) is in
  device memory, so generate captures the step as a CUDA graph as it does for TinyTransformer.
  The Qwen3 path's matrix-vector kernels for small batches (ops.linear_rows, the fused
  norm + linear rows) are RMSNorm's and bias-free, so GPT-2 decodes with GEMMs at every batch.
"""

from __future__ import annotations

import math

from xtrain import nn, ops


def forward_cached(model, ids, cache, last=None):
    """decode.forward_cached for a GPT2: ids int (B, S) and a KV cache -> logits (B, V) in the
    compute dtype, under no_grad. Prefill (cache.empty): positions 0..S-1, logits of flat rows
    last[b]. Decode (S == 1): each row's token at cache.positions[b]."""
    import xtrain

    B, S = ids.shape
    with model.store.bound(model.store.compute_weights()):
        if cache.empty:
            x = model.embed(ids, xtrain.arange(0, S, dtype="int64", device=model.device))  # (B*S, dim)
            for block, layer in zip(model.h, cache.layers):
                x = block(x, S, layer)
            x = ops.embedding(x, last)                                    # (B, dim)
            return ops.linear(model.ln_f(x), cache.head_weight(model))   # (B, V)
        x = nn.ResidualStream(model.embed(ids, cache.positions))         # (B, dim)
        for block, layer in zip(model.h, cache.layers):
            x = block_decode(block, x, layer)
        # the tied head's cast made at the prefill (Note [The tied head's cast in generation])
        return ops.linear(model.ln_f(x), cache.head_weight(model))       # (B, V)


def block_decode(block, x, layer):
    """One new token per row through `block`: the residual stream x (B, dim) -> the stream after
    the block (its last add pending, fused into the next norm)."""
    attn = block.attn
    B, H, D = x.base.shape[0], attn.n_heads, attn.head_dim
    q, k, v = attn.qkv(block.ln_1(x))                                     # (B, dim) each
    k, v = k.reshape(B, 1, H, D), v.reshape(B, 1, H, D)
    layer.write(k, v)                                                     # slot positions[b] of row b
    a = ops.decode_attention(q.reshape(B, H, D), layer.k, layer.v, layer.cache.lengths, scale=1.0 / math.sqrt(D))
    x = x + attn.c_proj(a.reshape(B, H * D))
    return x + block.mlp(block.ln_2(x))
