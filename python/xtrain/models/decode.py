"""TinyTransformer's forward for generation: a KV cache (KVCache) and forward_cached(model, ids,
cache), written as functions over the model's modules. xtrain.models.generate runs them.

    prefill (cache empty)  ids (B, P) -> embed_tokens -> L x block(x, P, cache layer)
                           -> each row's last real position -> norm -> lm_head -> logits (B, V)
    decode step            token (B, 1) at each row's position -> embed_tokens -> L x decode block
                           -> norm -> lm_head -> logits (B, V)

Decisions:
- The prefill is the blocks' own forward over plain tensors (causal flash attention over
  right-padded rows, so padding never reaches a real position); Attention.forward writes k (after
  q/k norm and RoPE) and v into the cache on the way. The head runs on each row's last real
  position only.
- A decode step above DECODE_GEMV_MAX_ROWS rows (block_decode) is ~9 kernels per layer: one q/k/v
  GEMM (ops.linear_multi), ops.decode_prep_attention (q/k norm, RoPE and both cache writes at each
  row's position, then the attention over the row's slots: one kernel on CUDA where the one-pass
  attention applies, two otherwise), o_proj, each residual add fused with the norm after it
  (ops.add_rms_norm: the block's post-attention norm, then the next block's input norm or the
  final norm, so the stream carries (x, norm(x)) from block to block), the gate/up GEMM, swiglu
  and down_proj.
- At most DECODE_GEMV_MAX_ROWS rows (block_decode_rows) the linears are matrix-vector kernels
  (ops.linear_rows; cuBLAS's GEMMs cost ~4.8 us a call at batch 1 on the H200, far more than
  their bytes need) and each residual add + norm runs inside the kernel after it
  (ops.rms_norm_linear_rows: q/k/v, gate/up with swiglu, the head; ops.linear_rows for o_proj and
  down_proj): 5 kernels per layer at batch 1 on CUDA, bitwise the GEMM step's values.
- At those batches the attention kernel also asks L2 for the weights the step reads next
  (l2_prefetch: a hint, no value changes), within DECODE_L2_PREFETCH_BYTES; and the step runs
  inside xtrain.cuda.early_launch(): each kernel reads before its wait only weights, the residual,
  the cache's earlier slots, positions and lengths, none of which the launch before it writes.
- A captured decode step (generate's KeptDecode) reads the weight buffers at fixed addresses and
  was built under these switches: signature(model) is what it depends on besides its own buffers.

Note [The tied head's cast in generation]
A tied model's head is the float32 embedding table cast to the compute dtype (head_weight(); the
store's flat compute copies hold the blocks' linears only). Cast per forward, a decode step cast
the whole table twice (the head and the L2 prefetch hint before it), [V, dim] read in float32 and
written in bf16 each time: on the H200 at qwen3-0.6b, batch 1, 0.42 of the step's ~1.8 ms
(generate-qwen3-0.6b-20261205-130357.json), twice as much at the wider tables of llama3.2-1b and
qwen3-1.7b. The weights do not change during a call, so the cache casts it once, at the prefill
(eager, before any capture), into a buffer it keeps (KVCache.head_weight): the decode steps and
their CUDA graph read that buffer, and a kept graph's next call re-casts into the same address at
its prefill, so training between calls is seen. The values are the cast's: the same tokens and
logits.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

import xtrain
from xtrain import ops

from . import gpt2_decode

# A decode step of at most this many rows runs its linears as matrix-vector products
# (ops.linear_rows: one kernel per linear or merged group, each weight row read once); larger
# batches keep the GEMMs (ops.linear_multi, ops.linear). 0 keeps the GEMMs at every batch.
DECODE_GEMV_MAX_ROWS = 8
# At those batches each block's decode attention also asks L2 for the weights the step reads next
# (ops.decode_prep_attention's prefetch): the block's o_proj, gate/up and down_proj, then the next
# block's q/k/v or the head, in that order while they fit this many bytes (a share of the H200's
# 50 MB L2, which also holds the KV cache). 0 asks for nothing.
DECODE_L2_PREFETCH_BYTES = 24 << 20


class LayerKV:
    """One layer's cache: k and v (B, L, H_kv, D), and the positions/lengths its KVCache holds (a
    weak reference: no cycle, so a dropped cache frees its device memory at once)."""

    def __init__(self, cache: "KVCache", k, v):
        self._cache, self.k, self.v = weakref.ref(cache), k, v

    @property
    def cache(self) -> "KVCache":
        return self._cache()

    @property
    def positions(self):
        return self.cache.positions

    def write(self, k, v):
        """k, v (B, S, H_kv, D) into slots positions[b] .. positions[b] + S - 1 of each row."""
        ops.kv_cache_write_(self.k, k, self.cache.positions)
        ops.kv_cache_write_(self.v, v, self.cache.positions)

    def prep_attend(self, q, k, v, q_norm_weight, k_norm_weight, eps: float, theta: float, scale: float,
                    prefetch=(), llama3=None):
        """A decode step's heads: q (B, H, D), k, v (B, H_kv, D) normed and rotated at positions[b],
        k and v written into that slot, then q against the first lengths[b] slots -> (B, H, D)
        (ops.decode_prep_attention: rms_norm, rope and the cache writes, then ops.decode_attention,
        bitwise; prefetch: its L2 hint; llama3: RoPE's Llama 3 scaling, RopeScaling.llama3())."""
        return ops.decode_prep_attention(q, k, v, self.k, self.v, self.cache.positions, self.cache.lengths,
                                         q_norm_weight, k_norm_weight, eps=eps, theta=theta, scale=scale,
                                         prefetch=list(prefetch), llama3=llama3)


class KVCache:
    """The keys and values of every layer for B rows of up to `slots` tokens, preallocated in the
    model's compute dtype on its device. positions (int64 (B,), on the device) is the slot each
    row's new token goes to, lengths = positions + 1 the slots a decode step attends to."""

    def __init__(self, model, batch: int, slots: int):
        c = model.config
        n_kv_heads = getattr(c, "n_kv_heads", None) or c.n_heads
        shape = (batch, slots, n_kv_heads, c.head_dim)
        self.layers = [LayerKV(self, xtrain.empty(*shape, dtype=c.dtype, device=model.device),
                               xtrain.empty(*shape, dtype=c.dtype, device=model.device))
                       for _ in range(c.n_layers)]
        self.device = model.device
        self.empty = True
        self.positions = self.lengths = None
        self._head = None  # the tied head's cast that head_weight() keeps

    def head_weight(self, model):
        """The head's weight in the compute dtype for this cache's calls (Note [The tied head's
        cast in generation]): a tied table's cast made at the prefill into a buffer this cache
        keeps, else model.head_weight() itself."""
        if model.config.dtype == "float32" or not getattr(model.config, "tie_embeddings", True):
            return model.head_weight()
        if self._head is None:
            self._head = model.head_weight()  # the cast of the float32 table
        elif self.empty:
            self._head.copy_(model.head_weight())  # a kept cache's next call: the same address
        return self._head

    def at(self, positions: np.ndarray):
        """Set every row's write slot (and attend to the slots up to it) for the next call."""
        positions = np.asarray(positions, dtype=np.int64)
        self.positions = xtrain.tensor(positions, device=self.device)
        self.lengths = xtrain.tensor(positions + 1, device=self.device)


def signature(model) -> tuple:
    """What a captured decode step of `model` (generate's KeptDecode) depends on besides its own
    buffers: the addresses of the weight buffers it reads and the decode switches it was built
    under."""
    s = model.store
    return (s.params.data_ptr(), s.compute.data_ptr() if s.compute is not None else 0, DECODE_GEMV_MAX_ROWS,
            DECODE_L2_PREFETCH_BYTES)


def forward_cached(model, ids, cache: KVCache, last=None):
    """Generation's forward of `model` (a TinyTransformer), under no_grad: new tokens ids int (B, S)
    and a KV cache -> logits (B, V) in the compute dtype, one row per sequence.
    Prefill (the cache is empty): the S positions 0..S-1 of right-padded prompts run as in
    model.forward and fill the cache; the logits are those of flat row last[b] (int64 (B,),
    b*S + length_b - 1). Decode (S == 1): each row's token at its cache position."""
    if getattr(model.config, "arch", None) == "gpt2":  # GPT-2's own decode (models/gpt2_decode.py)
        return gpt2_decode.forward_cached(model, ids, cache, last)
    B, S = ids.shape
    layers = list(model.layers)
    with model.store.bound(model.store.compute_weights()):
        x = model.embed_tokens(ids.reshape(B * S)).to(model.config.dtype)  # (B*S, dim)
        if cache.empty:
            for block, layer in zip(layers, cache.layers):
                x = block(x, S, layer)
            x = ops.embedding(x, last)                                     # (B, dim)
            return ops.linear(model.norm(x), cache.head_weight(model))     # (B, V)
        head = cache.head_weight(model)
        if B <= DECODE_GEMV_MAX_ROWS:
            # Each kernel of the layers and the head reads before its wait only weights, the
            # residual, the cache's earlier slots, positions and lengths, none of which the
            # launch before it writes (the embedding's cast or gather comes first): the promise
            # xtrain.cuda.early_launch asks for.
            with xtrain.cuda.early_launch():
                delta = None                                               # the stream is x + delta
                for i, (block, layer) in enumerate(zip(layers, cache.layers)):
                    if i + 1 < len(layers):
                        a = layers[i + 1].self_attn
                        after = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
                    else:
                        after = [head]
                    x, delta = block_decode_rows(block, x, delta, layer, after)
                return norm_rows(x, delta, model.norm, [head])[1][0]           # (B, V)
        h = layers[0].input_layernorm(x)
        next_norms = [block.input_layernorm for block in layers[1:]] + [model.norm]
        for block, layer, next_norm in zip(layers, cache.layers, next_norms):
            x, h = block_decode(block, x, h, layer, next_norm)             # h: next_norm(x)
        return ops.linear(h, head)                                         # (B, V)


# ---- a decode step above DECODE_GEMV_MAX_ROWS rows: GEMMs

def block_decode(block, x, h, cache: LayerKV, next_norm):
    """One new token per row through `block`: the residual stream x (B, dim) and h =
    input_layernorm(x) -> (x', next_norm(x')), with the layer's KV cache. Each residual add is
    fused with the norm after it (ops.add_rms_norm, bitwise the add then the norm): the block's own
    post-attention norm, and next_norm, the next block's input norm or the final norm."""
    post = block.post_attention_layernorm
    x, h = ops.add_rms_norm(attention_decode(block.self_attn, h, cache), x, post.weight, post.eps)
    return ops.add_rms_norm(block.mlp(h), x, next_norm.weight, next_norm.eps)


def attention_decode(attn, x, cache: LayerKV):
    """One new token per row: x (B, dim), already normed -> (B, dim), attending to the row's
    cached keys and values plus its own. q, k, v from one batched GEMM; attention_heads then norms
    and rotates q and k, writes k and v and attends."""
    q, k, v = ops.linear_multi(x, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    return attn.o_proj(attention_heads(attn, q, k, v, cache))


def attention_heads(attn, q, k, v, cache: LayerKV, prefetch=()):
    """A decode step's attention from q (B, H*D), k and v (B, Hkv*D) -> (B, H*D), before o_proj:
    ops.decode_prep_attention norms (q/k RMSNorm when the model has it) and rotates q and k at
    each row's position (cache.positions), writes k and v into the row's cache slot (bitwise
    rms_norm then rope) and attends (on CUDA at small batches: one kernel). prefetch: tensors the
    ops after it read, asked into L2 meanwhile (a hint)."""
    B, H, Hkv, D = q.shape[0], attn.n_heads, attn.n_kv_heads, attn.head_dim
    norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
    return cache.prep_attend(q.reshape(B, H, D), k.reshape(B, Hkv, D), v.reshape(B, Hkv, D), *norms, eps=attn.eps,
                             theta=attn.rope_theta, scale=1.0 / math.sqrt(D), prefetch=prefetch,
                             llama3=attn.rope_llama3).reshape(B, H * D)


# ---- a decode step of at most DECODE_GEMV_MAX_ROWS rows: matrix-vector kernels

def block_decode_rows(block, x, delta, cache: LayerKV, after=()):
    """block_decode at B <= DECODE_GEMV_MAX_ROWS with every residual add left to the next kernel:
    the stream x (B, dim) before its pending add delta (None: nothing pending) -> (x', delta'), the
    block's output being x' + delta'. Each add + norm runs inside the matrix-vector kernel after
    it (norm_rows), the MLP's swiglu inside the gate/up kernel; per layer norm+q/k/v,
    decode_prep_attention (1 or 3), o_proj, norm+gate/up+swiglu, down_proj. Bitwise block_decode.
    after: the weights the step reads after this block (l2_prefetch)."""
    attn, mlp = block.self_attn, block.mlp
    x, (q, k, v) = norm_rows(x, delta, block.input_layernorm,
                             [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    nxt = l2_prefetch([attn.o_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, *after])
    o = ops.linear_rows(attention_heads(attn, q, k, v, cache, nxt), [attn.o_proj.weight])[0]
    x, (g,) = norm_rows(x, o, block.post_attention_layernorm,
                        [mlp.gate_proj.weight, mlp.up_proj.weight], swiglu=True)
    return x, mlp.dropout(ops.linear_rows(g, [mlp.down_proj.weight])[0])


def l2_prefetch(weights) -> list:
    """The longest prefix of `weights` (in the order the step reads them) that fits
    DECODE_L2_PREFETCH_BYTES: what the decode attention asks L2 for."""
    nxt, room = [], DECODE_L2_PREFETCH_BYTES
    for w in weights:
        if w.nbytes > room:
            break
        nxt.append(w)
        room -= w.nbytes
    return nxt


def norm_rows(x, delta, norm, weights, swiglu=False):
    """A decode step's residual add and norm fused into the matrix-vector products after them
    (B <= DECODE_GEMV_MAX_ROWS): x' = delta + x (x itself when delta is None) and
    [norm(x') @ w^T for w in weights] (swiglu: [swiglu(gate, up)]) -> (x', list); bitwise
    ops.add_rms_norm (ops.rms_norm), ops.linear_rows and ops.swiglu."""
    if delta is None:
        return x, ops.rms_norm_linear_rows(x, weights, norm.weight, norm.eps, swiglu=swiglu)[1]
    return ops.rms_norm_linear_rows(delta, weights, norm.weight, norm.eps, residual=x, swiglu=swiglu)
