"""A PyTorch reference of TinyTransformer (python/xtrain/models/transformer.py), written from the
architecture description, not from xtrain's code: the model-level parity tests feed both the same
weights and compare logits, loss and every parameter gradient.

Precision follows xtrain's mixed-precision contract so a bf16 comparison measures implementation
differences, not the policy: every op reads its inputs in the activation dtype, computes in float32
and rounds its output once to the activation dtype; linear weights are float32 masters cast to the
activation dtype on use; norm weights stay float32; attention is one fused op (softmax(q k^T) v in
float32, output rounded once); cross-entropy runs in float32. In float32 every rounding is a no-op
and this is a plain float32 model.
"""

import math

import numpy as np

import torch

LAYER_PARAMS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def param_names(n_layers, qk_norm=True, tie_embeddings=False):
    """The parameter names of a model (a tied model has no lm_head.weight, one without q/k norm
    no q_norm/k_norm)."""
    layer = [n for n in LAYER_PARAMS if qk_norm or n not in ("self_attn.q_norm.weight", "self_attn.k_norm.weight")]
    names = ["embed_tokens.weight"]
    for i in range(n_layers):
        names += [f"layers.{i}.{n}" for n in layer]
    return names + ["norm.weight"] + ([] if tie_embeddings else ["lm_head.weight"])


def rms_norm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype)


def llama3_inv_freq(inv_freq, scaling):
    """Llama 3's rescaled frequencies (float32): wavelengths above original / low_freq_factor
    divided by factor, below original / high_freq_factor kept, blended between."""
    old = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    low, high = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    return torch.where(wavelen > low, inv_freq / scaling.factor, torch.where(wavelen < high, inv_freq, blended))


def rope(x, theta, scaling=None):
    """Rotate-half RoPE on x (B, S, H, D), positions 0..S-1; scaling: a RopeScaling or None."""
    B, S, H, D = x.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    ang = torch.outer(torch.arange(S, dtype=torch.float32), inv_freq)           # (S, D/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    xf = x.float()
    rot = torch.cat([-xf[..., D // 2:], xf[..., :D // 2]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def linear(x, w):
    return (x.float() @ w.to(x.dtype).float().t()).to(x.dtype)


def attention(q, k, v):
    """Causal softmax attention on (B, H, S, D) as a fused attention runs it: scores, softmax and
    the product with v in float32 from the activation-dtype q, k, v (F.scaled_dot_product_attention
    on float32 copies, scale 1/sqrt(D)), the output rounded once to the activation dtype. (A flash
    kernel on the GPU also rounds P to bf16 for its second product; tests/test_flash_attention.py
    bounds that op by op, this reference leaves it out.)"""
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    return out.to(q.dtype)


class TorchTransformer(torch.nn.Module):
    def __init__(self, cfg, weights, dtype=torch.float32):
        """cfg: an xtrain TransformerConfig (only its numbers are read); weights: name -> array."""
        super().__init__()
        self.cfg, self.act = cfg, dtype
        self.names = param_names(cfg.n_layers, getattr(cfg, "qk_norm", True), getattr(cfg, "tie_embeddings", False))
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.tensor(np.asarray(weights[n], dtype=np.float32)))
             for n in self.names])

    def p(self, name):
        return self.params[self.names.index(name)]

    def block(self, i, x, B, S):
        c, p = self.cfg, (lambda n: self.p(f"layers.{i}.{n}"))
        H, D = c.n_heads, c.head_dim
        Hkv = getattr(c, "n_kv_heads", None) or H
        h = rms_norm(x, p("input_layernorm.weight"), c.norm_eps)
        q = linear(h, p("self_attn.q_proj.weight")).view(B, S, H, D)
        k = linear(h, p("self_attn.k_proj.weight")).view(B, S, Hkv, D)
        v = linear(h, p("self_attn.v_proj.weight")).view(B, S, Hkv, D)
        if getattr(c, "qk_norm", True):
            q = rms_norm(q, p("self_attn.q_norm.weight"), c.norm_eps)
            k = rms_norm(k, p("self_attn.k_norm.weight"), c.norm_eps)
        q, k = rope(q, c.rope_theta, c.rope_scaling), rope(k, c.rope_theta, c.rope_scaling)
        # grouped-query attention: query head h reads kv head h // (H / Hkv)
        k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
        a = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, S, D)
        a = a.transpose(1, 2).reshape(B * S, H * D)
        x = (x.float() + linear(a, p("self_attn.o_proj.weight")).float()).to(self.act)
        h = rms_norm(x, p("post_attention_layernorm.weight"), c.norm_eps)
        g = linear(h, p("mlp.gate_proj.weight")).float()
        u = linear(h, p("mlp.up_proj.weight")).float()
        m = linear((torch.nn.functional.silu(g) * u).to(self.act), p("mlp.down_proj.weight"))
        return (x.float() + m.float()).to(self.act)

    def forward(self, ids, targets=None):
        """ids (B, S) int64 -> (logits (B*S, V), mean cross-entropy or None)."""
        B, S = ids.shape
        x = self.p("embed_tokens.weight")[ids.reshape(-1)].to(self.act)   # (B*S, dim)
        for i in range(self.cfg.n_layers):
            x = self.block(i, x, B, S)
        x = rms_norm(x, self.p("norm.weight"), self.cfg.norm_eps)
        head = "embed_tokens.weight" if getattr(self.cfg, "tie_embeddings", False) else "lm_head.weight"
        logits = linear(x, self.p(head))
        loss = None
        if targets is not None:
            loss = torch.nn.functional.cross_entropy(logits.float(), targets.reshape(-1),
                                                     ignore_index=-100)
        return logits, loss

    def grads(self):
        return {n: p.grad for n, p in zip(self.names, self.params)}
