"""TinyTransformer: a decoder-only LM in the Hugging Face Qwen3 layout, written on xtrain.nn.

    ids (B, S) -> embed_tokens -> L x Block -> norm -> lm_head -> logits (B*S, V) -> cross_entropy
    (with targets, lm_head + cross_entropy run fused: ops.linear_cross_entropy)

    Block.forward(x):  x = x + self_attn(input_layernorm(x))
                       x = x + mlp(post_attention_layernorm(x))

This is the file to edit: each module's forward reads top to bottom, over its named weights, and
is what training runs. Generation's forward over a KV cache is xtrain.models.decode; selective
recompute is xtrain.models.recompute.

Decisions:
- The residual stream is (B*S, dim) from the embedding to the logits, so every linear is one GEMM
  over all tokens. Attention reads the projections as (B, S, H, D), a reshape of (B*S, H*D) that
  copies nothing: ops.qk_norm_rope (per-head q/k RMSNorm and RoPE in one kernel) and
  ops.flash_attention (causal, memory linear in S, deterministic backward) work in that layout,
  and the attention output reshapes back to (B*S, H*D) for o_proj. No permute in a training step.
- Fewer, larger launches behind the same calls and parameter names (Qwen3's, so export is
  unchanged): q/k/v and gate/up each run as one batched GEMM (ops.linear_multi; their weights sit
  at uniform distances in the store, and the outputs are views of one buffer). forward() runs the
  blocks over an nn.ResidualStream, which leaves each `x + delta` pending until the norm after it
  resolves it in one ops.add_rms_norm (bitwise the add then the norm, both ways): every residual
  add runs fused with the next norm, the last block's with the final norm.
- With config.lean_activations (the 0.6B-1.7B presets) what a block keeps for backward is the least
  its kernels need (docs/model.md, "Activation memory"): a block passes its norms to the projections as Normed(norm, x), and the add, the norm
  and the q/k/v (gate/up) GEMMs run as one ops.rms_norm_linear_multi, which keeps the norm's input
  and not its output; q/k norm, RoPE and attention run as ops.qk_norm_rope_attention (without q/k
  norm, RoPE and attention as ops.rope_attention), which keeps q and k as projected and not the
  normed, rotated pair; the down projection runs as
  ops.swiglu_linear, which keeps gate and up and not their product. Each backward recomputes what
  was not kept with the forward's kernel, so every value and gradient is bitwise the unfused ops'.
- The parameters live in a ParamStore (xtrain.store), built at the end of __init__: flat float32
  buffers for the weights, their gradients and (with the optimizer) the AdamW moments, each
  parameter a view.
- bf16 is mixed precision: parameters stay float32; the weights of every nn.Linear are used in
  bf16. forward() asks the store for those bf16 copies (one cast launch over the flat region when
  the weights changed; each copy carries the history of a cast from its float32 leaf, so its
  gradient comes back in float32, into the store's gradient slot) and binds them into the modules
  for the duration of the forward. With lean_activations the store casts on use instead: each
  block's weights are cast as the block runs (one launch) and bound for that block only, and the
  ops that keep a weight for backward keep its float32 source and cast it again there (Note
  [Casts saved as their source], csrc/ops/cast.cpp): no bf16 copy of the weights at the peak.
  Activations are bf16 from the embedding on; norm weights stay float32 (rms_norm takes float32
  weights with bf16 x); the bf16 logits go into cross_entropy, which computes in float32.
- Recompute (config.recompute, or block.recompute per block): forward() runs such a block through
  recompute.forward_recompute, which re-runs the attention half and the MLP up to the down
  projection in backward, bitwise the same results.
- With targets, the head is ops.linear_cross_entropy(norm(x), lm_head weight, targets): the same
  loss and gradients as linear + cross_entropy, but the logits sit in a buffer with a 16-byte
  aligned row stride (fast cuBLAS GEMMs for an odd vocabulary such as 50257) and backward writes
  dlogits over them in place. Above 1 GiB of logits (the published vocabularies at seq 4096) it
  runs in row chunks and never holds (B*S, V): the gradients are computed chunk by chunk in the
  forward and scaled in backward (Note [Row-chunked head], csrc/ops/cross_entropy.cpp). forward(ids,
  targets) therefore returns (None, loss); return_logits=True adds a detached (B*S, V) copy of the
  logits. Without targets the logits come from the lm_head and stay differentiable.
- FP8 (config.fp8, docs/fp8.md): the blocks' seven projections are Fp8Linear, whose product is
  ops.linear_fp8 (E4M3 operands, E5M2 gradients, per-tensor scales); the same parameters.
- Parameter names mirror Qwen3 (layers.N.self_attn.q_proj.weight, ...); export prefixes "model.".
- Options for pretrained checkpoints (TransformerConfig): n_kv_heads (grouped-query attention:
  k/v_proj narrower, flash_attention reads fewer kv heads), qk_norm off (Llama: no q/k_norm, q and
  k through ops.rope alone), tie_embeddings (no lm_head: the head reads embed_tokens.weight, one
  parameter whose gradient sums both uses; in bf16 a cast of it per forward, since the embedding
  lookup reads the float32 master), rope_scaling (Llama 3's scaled RoPE frequencies, RopeScaling).
  from_pretrained imports a Hugging Face Qwen3/Llama directory (xtrain.models.hf_import).
- Init as GPT-2/nanoGPT: N(0, 0.02) everywhere, residual projections (o_proj, down_proj) scaled by
  1/sqrt(2L), norms ones; drawn on the CPU from one seeded xtrain.Generator in construction order,
  then uploaded into the store in one copy, so the same seed gives the same weights on any device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

import xtrain
from xtrain import nn, ops
from xtrain.store import ParamStore

from .recompute import forward_recompute

IGNORE_INDEX = -100
INIT_STD = 0.02


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rescaling of RoPE's frequencies: Hugging Face's rope_scaling (or rope_parameters)
    with rope_type "llama3", as transformers' _compute_llama3_parameters applies it. A frequency
    whose wavelength 2 pi / f exceeds original_max_position_embeddings / low_freq_factor is divided
    by factor, one shorter than original_max_position_embeddings / high_freq_factor is kept, and
    those between are blended: (1 - s) f / factor + s f with s = (original_max_position_embeddings
    / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor). The kernels compute it
    (kernels/common.h rope_inv_freq); the model passes llama3() to the RoPE ops."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise ValueError(f"RopeScaling.rope_type must be 'llama3' (the only RoPE scaling xtrain implements), "
                             f"got {self.rope_type!r}")
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"RopeScaling.{name} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.factor < 1:
            raise ValueError(f"RopeScaling.factor must be >= 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"RopeScaling needs 0 < low_freq_factor < high_freq_factor, got "
                             f"{self.low_freq_factor} and {self.high_freq_factor}")
        v = self.original_max_position_embeddings
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 2**31 - 1:
            raise ValueError(f"RopeScaling.original_max_position_embeddings must be an integer in "
                             f"[1, {2**31 - 1}], got {v!r}")

    @classmethod
    def from_dict(cls, d) -> "RopeScaling":
        """A RopeScaling from its to_dict() record (Hugging Face's rope_scaling keys)."""
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"rope_scaling must be an object with rope_type 'llama3', got {d!r}")
        known = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(d) - known), sorted(known - set(d) - {"rope_type"})
        if unknown or missing:
            raise ValueError(f"rope_scaling: unknown keys {unknown}, missing keys {missing}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def llama3(self) -> tuple:
        """The RoPE ops' llama3 argument."""
        return (self.factor, self.low_freq_factor, self.high_freq_factor,
                float(self.original_max_position_embeddings))


@dataclass
class TransformerConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    head_dim: int
    ffn_dim: int
    max_seq: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # Llama 3's frequency scaling (Llama-3.2-1B); None: plain RoPE
    norm_eps: float = 1e-6
    n_kv_heads: int | None = None      # grouped-query attention; None: n_heads (plain multi-head)
    tie_embeddings: bool = False       # lm_head reads embed_tokens.weight (one parameter)
    qk_norm: bool = True               # per-head RMSNorm of q and k before RoPE (Qwen3; Llama: off)
    bf16: bool = False
    recompute: bool = False
    dropout: float = 0.0
    # Attention within documents (a run option, like recompute): a document ends at this token id
    # (the tokenizer's end-of-text) and the next begins after it; every query attends only to the
    # keys of its own document (ops.document_starts, flash_attention's doc_start). None: causal
    # attention over the whole sequence. Generation (the KV cache) attends over the whole prompt.
    doc_sep: int | None = None
    # RoPE positions restarting per document (needs doc_sep): each token's position is its distance
    # from the start of its own document in the packed row (ops.document_positions), as a prompt
    # starting at 0 in generation has it. Off: positions 0..S-1 along the row. Within documents
    # RoPE's scores depend on distances only, so this changes the angles' float32 rounding, not
    # the model (docs/attention.md, Note [RoPE positions per document]).
    doc_rope: bool = False
    # The blocks' linears (q/k/v/o, gate/up/down) in FP8 through ops.linear_fp8 (a run option, like
    # recompute; docs/fp8.md); the embedding and the head stay in the compute dtype.
    fp8: bool = False
    # The lean ops (docs/model.md, "Activation memory"): each block keeps 37% fewer bytes for
    # backward (the norms' outputs, the normed and rotated q/k, the SwiGLU product are recomputed
    # there with the forward's kernels, bitwise), for a few more elementwise passes in backward. On
    # in the 0.6B-1.7B presets, where memory bounds the batch; off in the small presets, whose
    # measured speed is the plain blocks' (a run option, like recompute).
    lean_activations: bool = False

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "max_seq"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {v!r}")
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"TransformerConfig.n_kv_heads ({self.n_kv_heads}) must divide n_heads "
                             f"({self.n_heads})")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("TransformerConfig.rope_theta and norm_eps must be positive")
        if self.doc_sep is not None and (not isinstance(self.doc_sep, int) or isinstance(self.doc_sep, bool)
                                         or not 0 <= self.doc_sep < self.vocab_size):
            raise ValueError(f"TransformerConfig.doc_sep must be None or a token id in [0, {self.vocab_size}), "
                             f"got {self.doc_sep!r}")
        if isinstance(self.rope_scaling, dict):  # a to_dict() record
            self.rope_scaling = RopeScaling.from_dict(self.rope_scaling)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"TransformerConfig.rope_scaling must be None or a RopeScaling, got {self.rope_scaling!r}")
        if not isinstance(self.doc_rope, bool):
            raise ValueError(f"TransformerConfig.doc_rope must be True or False, got {self.doc_rope!r}")
        if self.doc_rope and self.doc_sep is None:
            raise ValueError("TransformerConfig.doc_rope needs doc_sep: RoPE positions restart per document only "
                             "with attention within documents")
        for name in ("tie_embeddings", "qk_norm", "fp8", "lean_activations"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TransformerConfig.{name} must be True or False, got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TransformerConfig":
        """The config of a to_dict() record; keys added since (n_kv_heads, tie_embeddings, qk_norm,
        rope_scaling, doc_rope, fp8, lean_activations) take their defaults, which are the model the
        older record describes."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig fields {unknown}")
        return cls(**d)

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.bf16 else "float32"

    def core_params(self) -> int:
        """Parameters of the transformer blocks (no embedding, lm_head or final norm)."""
        return self.n_layers * sum(math.prod(s) for s in self.block_param_shapes().values())

    def block_param_shapes(self) -> dict:
        """name (relative to a block) -> shape of every parameter of one Block."""
        inner, kv, d = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.dim
        shapes = {"input_layernorm.weight": (d,),
                  "self_attn.q_proj.weight": (inner, d), "self_attn.k_proj.weight": (kv, d),
                  "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, inner)}
        if self.qk_norm:
            shapes.update({"self_attn.q_norm.weight": (self.head_dim,),
                           "self_attn.k_norm.weight": (self.head_dim,)})
        shapes.update({"post_attention_layernorm.weight": (d,),
                       "mlp.gate_proj.weight": (self.ffn_dim, d), "mlp.up_proj.weight": (self.ffn_dim, d),
                       "mlp.down_proj.weight": (d, self.ffn_dim)})
        return shapes

    def param_shapes(self) -> dict:
        """name -> shape of every parameter of TinyTransformer(self), in named_parameters() order,
        without building the model (checkpoint and export validation use it; a test keeps it equal
        to the model's). param_count() first when the config is untrusted: this dict has
        (9 or 11) * n_layers + (2 or 3) entries."""
        block = self.block_param_shapes()
        shapes = {"embed_tokens.weight": (self.vocab_size, self.dim)}
        for i in range(self.n_layers):
            shapes.update({f"layers.{i}.{n}": s for n, s in block.items()})
        shapes["norm.weight"] = (self.dim,)
        if not self.tie_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, self.dim)
        return shapes

    def param_count(self) -> int:
        """len(param_shapes()), without building it."""
        return (2 if self.tie_embeddings else 3) + len(self.block_param_shapes()) * self.n_layers

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token: 6 per weight of every GEMM (forward + backward) plus the
        attention matmuls (causal counted in full, as nanoGPT/PaLM do)."""
        n_matmul = self.n_layers * (2 * self.dim * (self.n_heads + self.n_kv_heads) * self.head_dim
                                    + 3 * self.dim * self.ffn_dim) + self.dim * self.vocab_size
        return 6.0 * n_matmul + 12.0 * self.n_layers * self.n_heads * self.head_dim * seq


# Architecture presets. max_seq only bounds --seq (RoPE has no learned positions and flash
# attention's memory is linear in S): it sizes no weight, so raising it leaves checkpoints loadable.
# The first four are xtrain's own shapes: their vocab_size comes from the tokenizer (config_for
# fills it in). The others are the published shapes of the models people fine-tune (their Hugging
# Face config.json: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# head_dim, intermediate_size, vocab_size, tie_word_embeddings, rope_theta, rms_norm_eps,
# max_position_embeddings): they carry the vocabulary they were built for, so a run from scratch
# has the published head and embedding; a tokenizer with fewer ids trains it with the rows past
# its vocabulary unused (as the published tokenizers leave their padding rows), one with more is
# an error. Llama-3.2-1B's published RoPE also rescales the low frequencies (rope_scaling
# "llama3": factor 32, low/high_freq_factor 1 and 4, original_max_position_embeddings 8192), and
# so does the preset (RopeScaling).
PRESETS = {
    "tiny": dict(dim=128, n_layers=4, n_heads=4, head_dim=32, ffn_dim=384, max_seq=2048),
    "dim384": dict(dim=384, n_layers=12, n_heads=12, head_dim=32, ffn_dim=1024, max_seq=8192),
    "dim768": dict(dim=768, n_layers=18, n_heads=24, head_dim=32, ffn_dim=2048, max_seq=8192),
    # ffn 2736, not 8/3 * 1024 = 2730: a multiple of 8, so the MLP GEMMs' bf16 rows are 16-byte
    # aligned and cuBLAS uses its Hopper kernels (at 2730 they ran in align2 kernels, 2.6x slower).
    "dim1024": dict(dim=1024, n_layers=18, n_heads=32, head_dim=32, ffn_dim=2736, max_seq=8192),
    "qwen3-0.6b": dict(vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       ffn_dim=3072, max_seq=40960, rope_theta=1e6, norm_eps=1e-6, tie_embeddings=True,
                       qk_norm=True, lean_activations=True),
    "qwen3-1.7b": dict(vocab_size=151936, dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       ffn_dim=6144, max_seq=40960, rope_theta=1e6, norm_eps=1e-6, tie_embeddings=True,
                       qk_norm=True, lean_activations=True),
    "llama3.2-1b": dict(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                        ffn_dim=8192, max_seq=131072, rope_theta=5e5, norm_eps=1e-5, tie_embeddings=True,
                        qk_norm=False, lean_activations=True,
                        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                 original_max_position_embeddings=8192)),
}


def config_for(preset: str, vocab_size: int, **overrides) -> TransformerConfig:
    """The preset's config for a tokenizer of vocab_size ids (its vocabulary, for a preset that
    has none of its own), with `overrides` (bf16, recompute, dropout, max_seq, or any field)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    shape = dict(PRESETS[preset])
    if "vocab_size" in shape:
        if vocab_size > shape["vocab_size"]:
            raise ValueError(f"preset {preset} has a vocabulary of {shape['vocab_size']} ids, fewer than the "
                             f"tokenizer's {vocab_size}: its ids past {shape['vocab_size'] - 1} could not be embedded")
    else:
        shape["vocab_size"] = vocab_size
    return TransformerConfig(**{**shape, **overrides})


# ---- the modules

class Fp8Linear(nn.Linear):
    """nn.Linear with its product in FP8 (ops.linear_fp8): the blocks' linears when config.fp8."""

    def forward(self, x):
        return ops.linear_fp8(x, self.weight)


class Normed:
    """norm(x), left for the projections after it: project() runs the norm (with the add pending on
    a residual stream x, if any) and their GEMMs as one ops.rms_norm_linear_multi, which keeps the
    norm's input for backward but not its output (backward recomputes it, bitwise). The values are
    those of norm(x) then the projections (Note [Normed input recomputed for the projections] in
    csrc/ops/matmul.cpp); value() is norm(x) itself, for the FP8 linears."""

    __slots__ = ("norm", "x")

    def __init__(self, norm: nn.RMSNorm, x):
        self.norm, self.x = norm, x

    @property
    def shape(self):
        return (self.x.base if isinstance(self.x, nn.ResidualStream) else self.x).shape

    def value(self):
        return self.norm(self.x)

    def project(self, weights: list) -> list:
        """[linear(norm(x), w) for w in weights] as one op; a stream x holds the add's sum after it,
        as after norm(x)."""
        x, norm = self.x, self.norm
        if not isinstance(x, nn.ResidualStream):
            return ops.rms_norm_linear_multi(x, weights, norm.weight, norm.eps)[1]
        x.base, ys = ops.rms_norm_linear_multi(x.base, weights, norm.weight, norm.eps, residual=x.pending)
        x.pending = None
        return ys


def project(x, linears):
    """[lin(x) for lin in linears]: one batched GEMM (ops.linear_multi; with the norm before it
    when x is Normed), or in FP8 one GEMM each on x quantised once (ops.linear_fp8_multi)."""
    if isinstance(linears[0], Fp8Linear):
        x = x.value() if isinstance(x, Normed) else x
        return ops.linear_fp8_multi(x, [lin.weight for lin in linears])
    weights = [lin.weight for lin in linears]
    return x.project(weights) if isinstance(x, Normed) else ops.linear_multi(x, weights)


class Attention(nn.Module):
    """Causal self-attention with RoPE, grouped-query when n_kv_heads < n_heads (query head h reads
    kv head h // (n_heads / n_kv_heads)), with per-head q/k RMSNorm (Qwen3) or without (Llama)."""

    def __init__(self, c: TransformerConfig, gen, residual_std: float):
        super().__init__()
        inner, kv_inner = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.eps, self.rope_theta = c.norm_eps, c.rope_theta
        self.rope_llama3 = c.rope_scaling.llama3() if c.rope_scaling is not None else None  # the ops' argument
        self.lean = c.lean_activations
        linear = Fp8Linear if c.fp8 else nn.Linear
        self.q_proj = linear(c.dim, inner, generator=gen, std=INIT_STD)
        self.k_proj = linear(c.dim, kv_inner, generator=gen, std=INIT_STD)
        self.v_proj = linear(c.dim, kv_inner, generator=gen, std=INIT_STD)
        self.o_proj = linear(inner, c.dim, generator=gen, std=residual_std)
        if c.qk_norm:
            self.q_norm = nn.RMSNorm(c.head_dim, c.norm_eps)
            self.k_norm = nn.RMSNorm(c.head_dim, c.norm_eps)
        self.qk_norm = c.qk_norm
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x, seq: int, cache=None, doc_start=None, positions=None):
        """x (B*S, dim), normed (or Normed: the norm runs with the projections) -> (B*S, dim). With
        a KV cache (generation's prefill), k (after norm and RoPE) and v are also stored in it.
        doc_start (int32 (B, S), from ops.document_starts): each query attends within its own
        document only. positions (int64 (B, S), ops.document_positions): RoPE's positions, None
        for 0..S-1."""
        B, H, Hkv, D = x.shape[0] // seq, self.n_heads, self.n_kv_heads, self.head_dim
        # q, k, v from batched GEMMs: views of one buffer, block after block (ops.linear_multi)
        q, k, v = project(x, [self.q_proj, self.k_proj, self.v_proj])
        q = q.reshape(B, seq, H, D)                                    # (B, S, H, D), no copy
        k = k.reshape(B, seq, Hkv, D)                                  # (B, S, Hkv, D)
        v = v.reshape(B, seq, Hkv, D)
        if self.lean and cache is None:
            # (q/k norm,) RoPE and attention: the same kernels as below, keeping q and k as they came
            # (backward recomputes the normed, rotated pair)
            if self.qk_norm:
                a = ops.qk_norm_rope_attention(q, k, v, self.q_norm.weight, self.k_norm.weight, self.eps,
                                               self.rope_theta, positions, self.rope_llama3, causal=True,
                                               scale=1.0 / math.sqrt(D), doc_start=doc_start)       # (B, S, H, D)
            else:
                a = ops.rope_attention(q, k, v, self.rope_theta, positions, self.rope_llama3, causal=True,
                                       scale=1.0 / math.sqrt(D), doc_start=doc_start)              # (B, S, H, D)
            return self.dropout(self.o_proj(a.reshape(B * seq, H * D)))                          # (B*S, dim)
        if self.qk_norm:
            q, k = ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, self.eps, self.rope_theta,
                                    positions, self.rope_llama3)
        else:
            q = ops.rope(q, positions, self.rope_theta, self.rope_llama3)
            k = ops.rope(k, positions, self.rope_theta, self.rope_llama3)
        if cache is not None:
            cache.write(k, v)
        a = ops.flash_attention(q, k, v, causal=True, scale=1.0 / math.sqrt(D), doc_start=doc_start)  # (B, S, H, D)
        return self.dropout(self.o_proj(a.reshape(B * seq, H * D)))            # (B*S, dim)


class MLP(nn.Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, c: TransformerConfig, gen, residual_std: float):
        super().__init__()
        self.lean = c.lean_activations
        linear = Fp8Linear if c.fp8 else nn.Linear
        self.gate_proj = linear(c.dim, c.ffn_dim, generator=gen, std=INIT_STD)
        self.up_proj = linear(c.dim, c.ffn_dim, generator=gen, std=INIT_STD)
        self.down_proj = linear(c.ffn_dim, c.dim, generator=gen, std=residual_std)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        """x (B*S, dim), normed (or Normed) -> (B*S, dim). gate and up come from one batched GEMM
        (views of one buffer); with lean_activations down_proj(silu(gate) * up) runs as
        ops.swiglu_linear, which keeps gate and up for backward but not the (B*S, ffn) hidden (it
        recomputes it, bitwise). In FP8 the three linears and SwiGLU are one op, ops.mlp_fp8 (bitwise
        the composition; its SwiGLU kernels take the amaxes the casts need)."""
        if isinstance(self.down_proj, Fp8Linear):
            x = x.value() if isinstance(x, Normed) else x
            return self.dropout(ops.mlp_fp8(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight))
        gate, up = project(x, [self.gate_proj, self.up_proj])  # (B*S, ffn) each
        if not self.lean:
            return self.dropout(self.down_proj(ops.swiglu(gate, up)))
        return self.dropout(ops.swiglu_linear(gate, up, self.down_proj.weight))

    def hidden(self, x):
        """(B*S, dim) -> (B*S, ffn): everything before the down projection, silu(gate) * up in one
        kernel (selective recompute keeps this, the down projection's input)."""
        gate, up = project(x, [self.gate_proj, self.up_proj])  # (B*S, ffn) each
        return ops.swiglu(gate, up)


class Block(nn.Module):
    """One layer: attention, then the SwiGLU MLP, each on the normed stream and added to it."""

    def __init__(self, c: TransformerConfig, gen):
        super().__init__()
        residual_std = INIT_STD / math.sqrt(2 * c.n_layers)
        self.input_layernorm = nn.RMSNorm(c.dim, c.norm_eps)
        self.self_attn = Attention(c, gen, residual_std)
        self.post_attention_layernorm = nn.RMSNorm(c.dim, c.norm_eps)
        self.mlp = MLP(c, gen, residual_std)
        self.recompute = c.recompute  # TinyTransformer.forward runs the block through forward_recompute
        self.lean = c.lean_activations

    def forward(self, x, seq: int, cache=None, doc_start=None, positions=None):
        """The residual stream x (B*S, dim) -> (B*S, dim); seq is S. x is an nn.ResidualStream in
        the model's forward (each add then runs fused into the norm after it) or a plain tensor.
        cache: the block's KV cache (generation's prefill, under no_grad), filled on the way.
        doc_start, positions: attention within documents, RoPE's positions (Attention.forward)."""
        if not self.lean:
            x = x + self.self_attn(self.input_layernorm(x), seq, cache, doc_start, positions)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.self_attn(Normed(self.input_layernorm, x), seq, cache, doc_start, positions)
        x = x + self.mlp(Normed(self.post_attention_layernorm, x))
        return x


class TinyTransformer(nn.Module):
    def __init__(self, config: TransformerConfig, device: str = "cpu", seed: int = 0):
        super().__init__()
        self.config = config
        gen = xtrain.Generator(seed)
        # Built on the CPU, then moved into the store on `device` with one upload.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim, generator=gen, std=INIT_STD)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config, gen) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, config.norm_eps)
        if not config.tie_embeddings:  # tied: the head reads embed_tokens.weight (head_weight)
            self.lm_head = nn.Linear(config.dim, config.vocab_size, generator=gen, std=INIT_STD)
        # lean presets cast each layer's weights on use (the block's casts are saved as their float32
        # sources: no bf16 copy of the weights is held at the step's peak)
        self.store = ParamStore(self, device=device, compute_dtype=config.dtype, compute=nn.matmul_weights,
                                cast_on_use=config.lean_activations)
        self._block_casts = [self.store.compute_names(f"layers.{i}.") for i in range(config.n_layers)]
        self._head_casts = [n for n in self.store.compute_names() if not n.startswith("layers.")]
        self.tokenizer = None  # from_pretrained: the tokenizer that came with the weights

    @classmethod
    def from_pretrained(cls, path, device: str = "cpu", bf16: bool = False, dtype: str | None = None,
                        **overrides) -> "TinyTransformer":
        """A Hugging Face Qwen3 or Llama directory (config.json + model.safetensors, or shards with
        model.safetensors.index.json) as a TinyTransformer on `device`; `bf16` (or dtype="bfloat16")
        and `overrides` (recompute, dropout, max_seq) set the run options. The tokenizer beside the
        weights, if any, is `model.tokenizer`. See xtrain.models.hf_import."""
        from xtrain.models import hf_import  # knows the Hugging Face side only: no import cycle

        if dtype is not None:
            if dtype not in ("float32", "bfloat16"):
                raise ValueError(f"from_pretrained: dtype must be float32 or bfloat16 (mixed precision), got {dtype!r}")
            bf16 = dtype == "bfloat16"
        return hf_import.read_pretrained(path, TransformerConfig).build(cls, device, bf16=bool(bf16), **overrides)

    def head_weight(self):
        """The lm_head's weight as the forward uses it: lm_head.weight (its bf16 copy when bound),
        or with tied embeddings embed_tokens.weight, cast to the compute dtype (one cast per
        forward; its backward adds the head's float32 gradient to the embedding's)."""
        if not self.config.tie_embeddings:
            return self.lm_head.weight
        w = self.embed_tokens.weight
        if self.config.dtype == "float32":
            return w
        return ops.cast_many([w], self.config.dtype, recast_saved=self.store.cast_on_use)[0]

    def forward(self, ids, targets=None, return_logits=None):
        """ids int (B, S) -> (logits, loss).

        Without targets: (logits (B*S, V) in the compute dtype, differentiable; None).
        With targets (int (B, S), IGNORE_INDEX skipped): the head and the loss run fused
        (ops.linear_cross_entropy) and the result is (None, float32 loss), or (a detached
        (B*S, V) copy of the logits, loss) when return_logits is True."""
        c = self.config
        ids = self._as_ids(ids, "ids")
        B, S = ids.shape
        if S > c.max_seq:
            raise ValueError(f"sequence length {S} exceeds max_seq {c.max_seq}")
        if targets is not None:
            targets = self._as_ids(targets, "targets")
            if tuple(targets.shape) != (B, S):
                raise ValueError(f"targets shape {tuple(targets.shape)} != ids shape {(B, S)}")
        # bf16: the Linear weights in bf16 for this forward: one cast launch when they changed, or
        # (cast on use) each block's as the block runs
        store = self.store
        on_use = store.cast_on_use
        with store.bound(store.cast_weights(self._head_casts) if on_use else store.compute_weights()):
            x = self.embed_tokens(ids.reshape(B * S))                       # (B*S, dim) float32
            x = nn.ResidualStream(self.dropout(x.to(c.dtype)))  # each add fused into the next norm
            # attention within documents: where each token's document begins, once for every layer
            docs = ops.document_starts(ids, c.doc_sep) if c.doc_sep is not None else None
            pos = ops.document_positions(docs) if c.doc_rope else None  # RoPE restarting per document
            for i, block in enumerate(self.layers):
                with store.bound(store.cast_weights(self._block_casts[i]) if on_use else {}):
                    x = (forward_recompute(block, x, S, docs, pos) if block.recompute
                         else block(x, S, doc_start=docs, positions=pos))
            x = self.norm(x)
            head = self.head_weight()                                       # (V, dim)
            if targets is None:
                return ops.linear(x, head), None                            # (B*S, V)
            loss, logits = ops.linear_cross_entropy(x, head, targets.reshape(B * S),
                                                    ignore_index=IGNORE_INDEX,
                                                    return_logits=bool(return_logits))
        return logits, loss

    def _as_ids(self, ids, what: str):
        if not isinstance(ids, xtrain.Tensor):
            ids = xtrain.tensor(np.asarray(ids, dtype=np.int64), device=self.device)
        if len(ids.shape) != 2:
            raise ValueError(f"{what} must be (batch, seq), got shape {tuple(ids.shape)}")
        if ids.dtype not in ("int32", "int64"):
            raise TypeError(f"{what} must be int32 or int64, got {ids.dtype}")
        return ids

    @property
    def device(self) -> str:
        return self.store.device

    def generate(self, prompts, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, greedy: bool = False, seed: int = 0, generator=None,
                 stop_token: int | None = None, pad_token: int | None = None,
                 cuda_graphs: bool = True) -> np.ndarray:
        """Continue each prompt by up to max_new_tokens with a KV cache; returns int64 (B, T).

        See xtrain.models.generate.generate (and docs/generation.md) for the rules: prompts of
        different lengths, greedy / temperature / top-k / top-p, seeds, stop tokens, max_seq, and
        cuda_graphs (on CUDA the decode step is replayed as a CUDA graph; a no-op on the CPU)."""
        from .generate import generate
        return generate(self, prompts, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        greedy=greedy, seed=seed, generator=generator, stop_token=stop_token,
                        pad_token=pad_token, cuda_graphs=cuda_graphs)
