"""Selective activation recompute for a transformer Block: the wrapper the model's forward runs a
block through when block.recompute is on.

    x = x + self_attn(input_layernorm(x))               under nn.checkpoint: re-run in backward
    g = mlp.hidden(post_attention_layernorm(x))          under nn.checkpoint: re-run in backward
    x = x + mlp.dropout(mlp.down_proj(g))                 kept: down_proj saves g (B*S, ffn)

Backward re-runs everything but the down projection and the last residual add, whose outputs
backward never reads; what a block keeps is its input and g. The same modules run the same ops in
the same order as Block.forward, so recompute on or off gives bitwise the same loss and gradients
(tests/test_model.py). The block's residual adds run as plain ops.add here: a checkpoint segment
takes a tensor, not a stream with an add pending, and add + rms_norm is bitwise the fused kernel.
"""

from __future__ import annotations

from xtrain import nn


def forward_recompute(block, x: nn.ResidualStream, seq: int, doc_start=None, positions=None) -> nn.ResidualStream:
    """block(x, seq, doc_start=doc_start, positions=positions) with selective recompute: the residual stream x (B*S, dim)
    -> the stream after the block (nothing pending); seq is S."""
    if not isinstance(x, nn.ResidualStream):
        raise TypeError(f"forward_recompute: x must be an nn.ResidualStream, got {type(x).__name__}")
    attn_norm, attn = block.input_layernorm, block.self_attn
    mlp_norm, mlp = block.post_attention_layernorm, block.mlp
    x = x.resolve()                                   # the add the block before left pending
    x = nn.checkpoint(lambda x: x + attn(attn_norm(x), seq, None, doc_start, positions), x, attn_norm, attn)
    g = nn.checkpoint(lambda x: mlp.hidden(mlp_norm(x)), x, mlp_norm, mlp.gate_proj, mlp.up_proj)
    return nn.ResidualStream(x + mlp.dropout(mlp.down_proj(g)))
