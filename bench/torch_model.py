"""The PyTorch peer of TinyTransformer for the benchmarks.

tests/torch_reference.py (helper D's) is the architecture written independently of xtrain and is
what the parity tests trust. Its job is numerics: float32 GEMMs on rounded inputs, math attention
with a mask built on the CPU, RoPE tables rebuilt each call. That is the right reference for
correctness and the wrong one for speed (it does not even run on CUDA as written). So this module
reuses its parameter container (names, layout, values: TorchTransformer), its RMSNorm and its layer
order, and swaps in the kernels a PyTorch user would run:

- linears through F.linear under torch.autocast(bfloat16) (float32 master weights cast on use,
  as xtrain does; float32 runs have autocast off),
- attention through F.scaled_dot_product_attention(is_causal=True) (flash in bf16),
- RoPE with cos/sin tables built once per (S, device),
- the same activation dtype policy as xtrain: the residual stream is bf16 from the embedding on,
  norms and RoPE compute in float32 and round once, cross-entropy in float32.

compile=MODE compiles the whole model, `torch.compile(model, mode=MODE)`, as nanoGPT does and as
the users we compete for run it (mode "default" or "max-autotune-no-cudagraphs"; the optimizer
is torch's fused AdamW, uncompiled, as in nanoGPT).
recompute=True runs each block as xtrain's selective recompute does: the attention part and the
MLP up to the down projection under torch.utils.checkpoint (non-reentrant), the down projection
outside with its input kept.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from common import TESTS_DIR

if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from torch_reference import LAYER_PARAMS, TorchTransformer, rms_norm  # noqa: E402


def rope(x, cos, sin):
    """Rotate-half RoPE on x (B, S, H, D) with tables (1, S, 1, D); float32 inside."""
    half = x.shape[-1] // 2
    xf = x.float()
    rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def attention_part(x, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, *, B: int, S: int, H: int,
                   D: int, eps: float):
    """x + attention(norm(x)) on the residual stream x (B*S, dim). Under autocast every linear
    returns bf16, so the stream stays in x's dtype without explicit casts."""
    h = rms_norm(x, attn_norm, eps)
    q = F.linear(h, wq).view(B, S, H, D)
    k = F.linear(h, wk).view(B, S, H, D)
    v = F.linear(h, wv).view(B, S, H, D)
    q = rope(rms_norm(q, q_norm, eps), cos, sin)
    k = rope(rms_norm(k, k_norm, eps), cos, sin)
    a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True)                       # (B, H, S, D)
    a = a.transpose(1, 2).reshape(B * S, H * D)
    return x + F.linear(a, wo)


def mlp_hidden(x, mlp_norm, w_gate, w_up, *, eps: float):
    h = rms_norm(x, mlp_norm, eps)
    return F.silu(F.linear(h, w_gate)) * F.linear(h, w_up)


def block(x, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, mlp_norm, w_gate, w_up, w_down,
          *, B: int, S: int, H: int, D: int, eps: float):
    """One block on the residual stream x (B*S, dim); parameters in LAYER_PARAMS order."""
    x = attention_part(x, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, B=B, S=S, H=H, D=D,
                       eps=eps)
    return x + F.linear(mlp_hidden(x, mlp_norm, w_gate, w_up, eps=eps), w_down)


def block_recompute(x, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, mlp_norm, w_gate, w_up,
                    w_down, *, B: int, S: int, H: int, D: int, eps: float):
    """block with xtrain's selective recompute: the attention part and the MLP up to the down
    projection under torch.utils.checkpoint, the down projection outside (its input is kept)."""
    ck = torch.utils.checkpoint.checkpoint
    x = ck(attention_part, x, cos, sin, attn_norm, wq, wk, wv, wo, q_norm, k_norm, use_reentrant=False,
           B=B, S=S, H=H, D=D, eps=eps)
    g = ck(mlp_hidden, x, mlp_norm, w_gate, w_up, use_reentrant=False, eps=eps)
    return x + F.linear(g, w_down)


def head(x, norm_w, lm_w, targets, *, eps: float):
    logits = F.linear(rms_norm(x, norm_w, eps), lm_w)                          # (B*S, V)
    loss = None if targets is None else F.cross_entropy(logits.float(), targets.reshape(-1))
    return logits, loss


class BenchTorchTransformer(TorchTransformer):
    def __init__(self, cfg, weights, dtype, device, recompute: bool = False):
        super().__init__(cfg, weights, dtype)
        self.to(device)
        self.index = {n: i for i, n in enumerate(self.names)}  # the parent's p() searches a list
        self.recompute = recompute
        self._rope = {}

    def p(self, name):
        return self.params[self.index[name]]

    def rope_tables(self, S, device):
        key = (S, str(device))
        if key not in self._rope:
            D, theta = self.cfg.head_dim, self.cfg.rope_theta
            inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
            ang = torch.outer(torch.arange(S, dtype=torch.float32, device=device), inv_freq)
            cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]          # (1, S, 1, D)
            sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
            self._rope[key] = (cos, sin)
        return self._rope[key]

    def forward(self, ids, targets=None):
        """ids (B, S) int64 -> (logits (B*S, V), mean cross-entropy or None)."""
        c = self.cfg
        B, S = ids.shape
        dev = ids.device
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.act == torch.bfloat16):
            x = F.embedding(ids.reshape(-1), self.p("embed_tokens.weight")).to(self.act)
            cos, sin = self.rope_tables(S, dev)
            kw = dict(B=B, S=S, H=c.n_heads, D=c.head_dim, eps=c.norm_eps)
            for i in range(c.n_layers):
                params = [self.p(f"layers.{i}.{n}") for n in LAYER_PARAMS]
                if self.recompute and torch.is_grad_enabled():
                    x = block_recompute(x, cos, sin, *params, **kw)
                else:
                    x = block(x, cos, sin, *params, **kw)
            return head(x, self.p("norm.weight"), self.p("lm_head.weight"), targets, eps=c.norm_eps)


def build(xt_model_or_weights, cfg, device, compile=None, recompute=False):
    """The peer of an xtrain model: same config, same weights (a dict name -> float32 array, or
    the xtrain model to read them from), on `device`. compile: None (eager) or a torch.compile
    mode for the whole model."""
    weights = xt_model_or_weights
    if not isinstance(weights, dict):
        weights = {n: p.numpy().copy() for n, p in xt_model_or_weights.named_parameters()}
    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    model = BenchTorchTransformer(cfg, weights, dtype, device, recompute=recompute)
    return model if compile is None else torch.compile(model, mode=compile, dynamic=False)


def adamw(model, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    """torch.optim.AdamW with xtrain's grouping (2-D weights decay, norm weights do not); fused on
    CUDA (one launch per group, like xtrain's adamw_step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, fused=fused)


def muon_and_adamw(matrices, rest, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) -> list:
    """xtrain's Muon split in PyTorch: torch.optim.Muon (adjust_lr_fn "match_rms_adamw", so one
    learning rate and weight decay serve both) over `matrices`, torch.optim.AdamW with xtrain's
    grouping (2-D weights decay, the rest not) over `rest`; fused AdamW on CUDA. Step both."""
    fused = rest[0].is_cuda if rest else False
    return [torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW([{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
                               {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
                              lr=lr, betas=betas, eps=eps, fused=fused)]
