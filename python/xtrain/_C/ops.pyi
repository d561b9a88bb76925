"""
Differentiable ops (xtrain.ops re-exports these)
"""
from __future__ import annotations
import collections.abc
import typing
import xtrain._C
__all__: list[str] = ['add', 'add_layer_norm', 'add_rms_norm', 'add_scalar', 'cast', 'cast_many', 'cross_entropy', 'decode_attention', 'decode_prep_attention', 'div', 'div_scalar', 'document_positions', 'document_starts', 'dropout', 'embedding', 'exp', 'flash_attention', 'gelu', 'gelu_mlp', 'greedy_next_', 'head_layout', 'kv_cache_write_', 'layer_norm', 'linear', 'linear_bias', 'linear_cross_entropy', 'linear_fp8', 'linear_fp8_multi', 'linear_multi', 'linear_multi_bias', 'linear_rows', 'log', 'log_softmax', 'matmul', 'mean', 'mlp_fp8', 'mul', 'mul_scalar', 'neg', 'permute', 'pow_scalar', 'qk_norm_rope', 'qk_norm_rope_attention', 'rdiv_scalar', 'reshape', 'rms_norm', 'rms_norm_linear_multi', 'rms_norm_linear_rows', 'rope', 'rope_attention', 'rsub_scalar', 'silu', 'softmax', 'sqrt', 'sub', 'sum', 'swiglu', 'swiglu_linear', 'tanh', 'to', 'transpose', 'view']
def add(a: xtrain._C.Tensor, b: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    a + b (numpy broadcasting)
    """
def add_layer_norm(x: xtrain._C.Tensor, residual: xtrain._C.Tensor, weight: xtrain._C.Tensor, bias: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-05) -> tuple[xtrain._C.Tensor, xtrain._C.Tensor]:
    """
    (h, layer_norm(h, weight, bias, eps)) with h = x + residual, in one kernel; bitwise add then layer_norm
    """
def add_rms_norm(x: xtrain._C.Tensor, residual: xtrain._C.Tensor, weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06) -> tuple[xtrain._C.Tensor, xtrain._C.Tensor]:
    """
    (h, rms_norm(h, weight, eps)) with h = x + residual, in one kernel; bitwise add then rms_norm
    """
def add_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    x + s
    """
def cast(x: xtrain._C.Tensor, dtype: typing.Any) -> xtrain._C.Tensor:
    """
    x in another dtype; the gradient comes back in x's dtype
    """
def cast_many(tensors: collections.abc.Sequence[xtrain._C.Tensor], dtype: typing.Any, cached: collections.abc.Sequence[xtrain._C.Tensor] | None = None, recast_saved: bool = False) -> list[xtrain._C.Tensor]:
    """
    [cast(x, dtype) for x in tensors] in one fused kernel; each output keeps its own CastBackward. cached: the casts' values, already computed (no kernel runs; the outputs share their memory). recast_saved: an op that saves an output for backward keeps its source instead and casts it again then (the casts' memory lives only while the forward uses them)
    """
def cross_entropy(logits: xtrain._C.Tensor, targets: xtrain._C.Tensor, ignore_index: typing.SupportsInt | typing.SupportsIndex = -100) -> xtrain._C.Tensor:
    """
    Mean cross-entropy of logits [N, V] against int targets [N], skipping ignore_index; float32 scalar
    """
def decode_attention(q: xtrain._C.Tensor, k_cache: xtrain._C.Tensor, v_cache: xtrain._C.Tensor, lengths: xtrain._C.Tensor, scale: typing.SupportsFloat | typing.SupportsIndex | None = None) -> xtrain._C.Tensor:
    """
    One query per row against a KV cache: q [B, H, D], k_cache and v_cache [B, L, H_kv, D], row b attends to its first lengths[b] slots (int64 [B]); returns [B, H, D]; scale None means 1/sqrt(D); not differentiable
    """
def decode_prep_attention(q: xtrain._C.Tensor, k: xtrain._C.Tensor, v: xtrain._C.Tensor, k_cache: xtrain._C.Tensor, v_cache: xtrain._C.Tensor, positions: xtrain._C.Tensor, lengths: xtrain._C.Tensor, q_norm_weight: xtrain._C.Tensor | None = None, k_norm_weight: xtrain._C.Tensor | None = None, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, scale: typing.SupportsFloat | typing.SupportsIndex | None = None, prefetch: collections.abc.Sequence[xtrain._C.Tensor] = [], llama3: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(4)"] | None = None) -> xtrain._C.Tensor:
    """
    A decode step's head preparation then its attention: k and v [B, H_kv, D] into their cache slots at positions[b] (int64 [B]), q [B, H, D] and k normed (rms_norm(eps), with the norm weights) and rotated (rope(theta, llama3)) at that position, then decode_attention of that q over each row's first lengths[b] slots; returns [B, H, D]. Bitwise those ops; on CUDA one kernel where the one-pass attention applies; not differentiable. prefetch: up to 8 tensors on q's device that the next ops read, asked into L2 by the SMs the attention leaves idle (a hint: no value changes)
    """
def div(a: xtrain._C.Tensor, b: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    a / b (numpy broadcasting)
    """
def div_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    x / s
    """
def document_positions(doc_start: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    int64 [B, S] positions s - doc_start[b, s] of document_starts' int32 [B, S]: each token's distance from the start of its document (RoPE restarting per document)
    """
def document_starts(ids: xtrain._C.Tensor, sep: typing.SupportsInt | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    int32 [B, S]: the position where each token's document begins, for ids [B, S] (int32 or int64) in which a document begins at 0 and after every token equal to sep (flash_attention's doc_start)
    """
def dropout(x: xtrain._C.Tensor, p: typing.SupportsFloat | typing.SupportsIndex, training: bool = True, generator: xtrain._C.Generator = None) -> xtrain._C.Tensor:
    """
    Zero elements with probability p and scale the rest by 1/(1-p); identity when not training
    """
def embedding(weight: xtrain._C.Tensor, ids: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    Rows of weight [vocab, dim] picked by integer ids (IndexError when out of range)
    """
def exp(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    e ** x
    """
def flash_attention(q: xtrain._C.Tensor, k: xtrain._C.Tensor, v: xtrain._C.Tensor, causal: bool = True, scale: typing.SupportsFloat | typing.SupportsIndex | None = None, return_lse: bool = False, doc_start: xtrain._C.Tensor | None = None) -> typing.Any:
    """
    Fused (flash) attention on q [B, S, H, D], k and v [B, S, H_kv, D] (H a multiple of H_kv), output [B, S, H, D]; scale None means 1/sqrt(D); return_lse adds the row log-sum-exp [B, H, S]; doc_start (int32 [B, S] from document_starts, causal only): each query sees only the keys of its own document
    """
def gelu(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as GPT-2 and torch.nn.functional.gelu(x, approximate='tanh')
    """
def gelu_mlp(x: xtrain._C.Tensor, fc_weight: xtrain._C.Tensor, fc_bias: xtrain._C.Tensor, proj_weight: xtrain._C.Tensor, proj_bias: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    gelu_tanh(x @ fc_weight^T + fc_bias) @ proj_weight^T + proj_bias (GPT-2's MLP); on CUDA bias and GELU in the GEMMs' epilogues both ways (cuBLASLt), on the CPU the unfused ops, bitwise
    """
def greedy_next_(logits: xtrain._C.Tensor, state: xtrain._C.Tensor, ring: xtrain._C.Tensor, stop_token: typing.SupportsInt | typing.SupportsIndex | None = None) -> None:
    """
    Greedy decoding on the device: row b's most likely token of logits [B, V] (the first of equal maxima, NaN first) advances its state int64 [6, B] = (token, position, length, limit, done, count) when the row is not done and position + 1 < limit (done after stop_token); ring [R, B][count % R, b] gets the token taken or -1; count += 1. In place, not differentiable
    """
def head_layout(rows: typing.SupportsInt | typing.SupportsIndex, vocab: typing.SupportsInt | typing.SupportsIndex, dtype: typing.Any) -> tuple[int, int]:
    """
    How linear_cross_entropy lays out the head of `rows` rows and vocabulary `vocab` in dtype: (rows per chunk, the logits' row stride); rows per chunk >= rows means unchunked
    """
def kv_cache_write_(cache: xtrain._C.Tensor, x: xtrain._C.Tensor, positions: xtrain._C.Tensor) -> None:
    """
    In place: cache [B, L, H_kv, D][b, positions[b] + s] = x [B, S, H_kv, D][b, s]; positions int64 [B] (generation's KV cache; not differentiable)
    """
def layer_norm(x: xtrain._C.Tensor, weight: xtrain._C.Tensor, bias: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-05) -> xtrain._C.Tensor:
    """
    LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias (weight, bias [D], x's dtype or float32)
    """
def linear(x: xtrain._C.Tensor, weight: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    x @ weight^T, weight is [out, in]
    """
def linear_bias(x: xtrain._C.Tensor, weight: xtrain._C.Tensor, bias: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    x @ weight^T + bias (weight [out, in], bias [out], x's dtype); on CUDA the bias is added in the GEMM's epilogue (cuBLASLt), on the CPU it is linear then add, bitwise
    """
def linear_cross_entropy(x: xtrain._C.Tensor, w: xtrain._C.Tensor, targets: xtrain._C.Tensor, ignore_index: typing.SupportsInt | typing.SupportsIndex = -100, return_logits: bool = False, chunk_rows: typing.SupportsInt | typing.SupportsIndex = 0) -> tuple[xtrain._C.Tensor, xtrain._C.Tensor | None]:
    """
    cross_entropy(linear(x, w), targets) fused (x [N, K], w [V, K]), in row chunks of chunk_rows (0: chosen from the shapes): returns (loss, logits [N, V] copy when return_logits else None)
    """
def linear_fp8(x: xtrain._C.Tensor, weight: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    x @ weight^T through FP8: x and weight in E4M3, the backward's dy in E5M2, each scaled per tensor by a power of two from its amax; float32 accumulation, output in x's dtype (docs/fp8.md)
    """
def linear_fp8_multi(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor]) -> list[xtrain._C.Tensor]:
    """
    [linear_fp8(x, w) for w in weights] with x quantised once for all of them (one amax pass, one cast, one saved copy of its codes): the outputs and weight gradients are linear_fp8's bits, dx the weights' dgrad GEMMs accumulated in their order
    """
def linear_multi(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor]) -> list[xtrain._C.Tensor]:
    """
    [x @ w^T for w in weights] as views of one buffer, one batched GEMM per run of equal shapes
    """
def linear_multi_bias(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor], biases: collections.abc.Sequence[xtrain._C.Tensor]) -> list[xtrain._C.Tensor]:
    """
    [x @ w^T + b for w, b in zip(weights, biases)] as linear_multi's views; on CUDA the biases in the batched GEMM's epilogue (cuBLASLt), on the CPU linear_multi then add, bitwise
    """
def linear_rows(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor]) -> list[xtrain._C.Tensor]:
    """
    [x @ w^T for w in weights] for x [M, K] with 1 <= M <= 8, as views of one buffer laid out as linear_multi's: one matrix-vector kernel reading each weight row once (the decode step's linears); float32 accumulation, deterministic; not differentiable (raises when an input requires grad)
    """
def log(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    Natural logarithm
    """
def log_softmax(x: xtrain._C.Tensor, dim: typing.SupportsInt | typing.SupportsIndex = -1) -> xtrain._C.Tensor:
    """
    Log-softmax over the last dim (computed in float32 for bf16)
    """
def matmul(a: xtrain._C.Tensor, b: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    a @ b: 2-D, batched 3-D, or [..., K] @ [K, N]
    """
def mean(x: xtrain._C.Tensor, dim: typing.SupportsInt | typing.SupportsIndex | None = None, keepdim: bool = False) -> xtrain._C.Tensor:
    """
    Mean over all elements (dim=None) or the last dimension (dim=-1)
    """
def mlp_fp8(x: xtrain._C.Tensor, w_gate: xtrain._C.Tensor, w_up: xtrain._C.Tensor, w_down: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    linear_fp8(swiglu(*linear_fp8_multi(x, [w_gate, w_up])), w_down) as one op with the same bits: the SwiGLU kernels take the amax of what they write, so h, dgate and dup need no amax pass of their own
    """
def mul(a: xtrain._C.Tensor, b: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    a * b (numpy broadcasting)
    """
def mul_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    x * s
    """
def neg(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    -x
    """
def permute(x: xtrain._C.Tensor, dims: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> xtrain._C.Tensor:
    """
    Reorder dimensions (a copy)
    """
def pow_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    x ** s
    """
def qk_norm_rope(q: xtrain._C.Tensor, k: xtrain._C.Tensor, q_norm_weight: xtrain._C.Tensor, k_norm_weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, positions: xtrain._C.Tensor | None = None, llama3: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(4)"] | None = None) -> tuple[xtrain._C.Tensor, xtrain._C.Tensor]:
    """
    rope(rms_norm(x, weight, eps), theta) over D for q [B, S, H, D] and k [B, S, H_kv, D] in one kernel (positions as rope's: int64 [S] or [B, S], default 0..S-1; llama3 as rope's); returns (q, k), bitwise equal to rms_norm followed by rope
    """
def qk_norm_rope_attention(q: xtrain._C.Tensor, k: xtrain._C.Tensor, v: xtrain._C.Tensor, q_norm_weight: xtrain._C.Tensor, k_norm_weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, positions: xtrain._C.Tensor | None = None, llama3: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(4)"] | None = None, causal: bool = True, scale: typing.SupportsFloat | typing.SupportsIndex | None = None, doc_start: xtrain._C.Tensor | None = None) -> xtrain._C.Tensor:
    """
    flash_attention(*qk_norm_rope(q, k, ...), v, causal, scale, doc_start=doc_start), bitwise, keeping q and k as given for backward (not the normed, rotated pair, which backward recomputes); returns out [B, S, H, D]
    """
def rdiv_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    s / x
    """
def reshape(x: xtrain._C.Tensor, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> xtrain._C.Tensor:
    """
    Same data in a new shape (shares storage; one -1 is inferred)
    """
def rms_norm(x: xtrain._C.Tensor, weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06) -> xtrain._C.Tensor:
    """
    RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight (weight [D], x's dtype or float32)
    """
def rms_norm_linear_multi(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor], norm_weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, residual: xtrain._C.Tensor | None = None) -> tuple[xtrain._C.Tensor, list[xtrain._C.Tensor]]:
    """
    (h, ys): h = x + residual (x itself without residual), ys = linear_multi(rms_norm(h, norm_weight, eps), weights); bitwise add_rms_norm (rms_norm) then linear_multi, forward and backward, keeping h for backward but not the normed input, which backward recomputes
    """
def rms_norm_linear_rows(x: xtrain._C.Tensor, weights: collections.abc.Sequence[xtrain._C.Tensor], norm_weight: xtrain._C.Tensor, eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06, residual: xtrain._C.Tensor | None = None, swiglu: bool = False) -> tuple[xtrain._C.Tensor, list[xtrain._C.Tensor]]:
    """
    (h, ys): h = x + residual (x itself without residual), ys = linear_rows(rms_norm(h, norm_weight, eps), weights), or with swiglu=True (weights = [gate, up], one shape) [swiglu(gate, up)]; bitwise add_rms_norm (rms_norm), linear_rows and swiglu, in one kernel that recomputes the norm in every block (the decode step's norm + linear); x [M, K] with 1 <= M <= 8; not differentiable
    """
def rope(x: xtrain._C.Tensor, positions: xtrain._C.Tensor | None = None, theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, llama3: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(4)"] | None = None) -> xtrain._C.Tensor:
    """
    Rotary embedding (rotate-half) on x [B, S, H, D]; positions int64 [S] or [B, S] (each row its own), default 0..S-1; llama3: Llama 3's frequency scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), default none
    """
def rope_attention(q: xtrain._C.Tensor, k: xtrain._C.Tensor, v: xtrain._C.Tensor, theta: typing.SupportsFloat | typing.SupportsIndex = 10000.0, positions: xtrain._C.Tensor | None = None, llama3: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(4)"] | None = None, causal: bool = True, scale: typing.SupportsFloat | typing.SupportsIndex | None = None, doc_start: xtrain._C.Tensor | None = None) -> xtrain._C.Tensor:
    """
    flash_attention(rope(q, ...), rope(k, ...), v, causal, scale, doc_start=doc_start), bitwise, keeping q and k unrotated for backward (which rotates them again); returns out [B, S, H, D]
    """
def rsub_scalar(x: xtrain._C.Tensor, s: typing.SupportsFloat | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    s - x
    """
def silu(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    x * sigmoid(x)
    """
def softmax(x: xtrain._C.Tensor, dim: typing.SupportsInt | typing.SupportsIndex = -1) -> xtrain._C.Tensor:
    """
    Softmax over the last dim (computed in float32 for bf16)
    """
def sqrt(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    Square root
    """
def sub(a: xtrain._C.Tensor, b: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    a - b (numpy broadcasting)
    """
def sum(x: xtrain._C.Tensor, dim: typing.SupportsInt | typing.SupportsIndex | None = None, keepdim: bool = False) -> xtrain._C.Tensor:
    """
    Sum over all elements (dim=None) or the last dimension (dim=-1)
    """
def swiglu(gate: xtrain._C.Tensor, up: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    silu(gate) * up (fused)
    """
def swiglu_linear(gate: xtrain._C.Tensor, up: xtrain._C.Tensor, weight: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    linear(swiglu(gate, up), weight), bitwise, keeping gate, up and weight for backward (not the hidden swiglu(gate, up), which backward recomputes): the SwiGLU MLP's down projection
    """
def tanh(x: xtrain._C.Tensor) -> xtrain._C.Tensor:
    """
    Hyperbolic tangent (e.g. logit soft-capping: cap * tanh(logits / cap))
    """
def to(x: xtrain._C.Tensor, device: typing.Any = None, dtype: typing.Any = None) -> xtrain._C.Tensor:
    """
    Differentiable copy to another device and/or dtype (x itself when nothing changes)
    """
def transpose(x: xtrain._C.Tensor, dim0: typing.SupportsInt | typing.SupportsIndex, dim1: typing.SupportsInt | typing.SupportsIndex) -> xtrain._C.Tensor:
    """
    Swap two dimensions (a copy)
    """
def view(x: xtrain._C.Tensor, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> xtrain._C.Tensor:
    """
    Alias of reshape (shares storage)
    """
