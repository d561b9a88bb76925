"""The published shapes' presets (qwen3-0.6b, qwen3-1.7b, llama3.2-1b): their numbers against the
published configs, the vocabulary rule of config_for, and the model at those heads (head dim 128
and 64, grouped-query attention, tied embeddings, q/k norm on and off) shrunk to test sizes:
against the PyTorch reference, bitwise run to run, recompute bitwise. The kernels at these head
dims are tested op by op in test_flash_attention.py and test_generate.py (their shape lists name
these heads)."""

import numpy as np
import pytest
import torch

from modelhelp import batch, bits_equal, grads_numpy, make_model
from torch_reference import TorchTransformer
from xtrain.models import ALL_PRESETS, PRESETS, TransformerConfig, config_for
from xtrain.trainer.train import PRESET_LR

BIG = ("qwen3-0.6b", "qwen3-1.7b", "llama3.2-1b")

# The published config.json values, field by field (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
# tie_word_embeddings, rope_theta, rms_norm_eps, max_position_embeddings; qk norm: Qwen3's layers).
PUBLISHED = {
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936, True, 1e6, 1e-6, 40960, True),
    "qwen3-1.7b": (2048, 28, 16, 8, 128, 6144, 151936, True, 1e6, 1e-6, 40960, True),
    "llama3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, True, 5e5, 1e-5, 131072, False),
}


@pytest.mark.parametrize("name", BIG)
def test_presets_are_the_published_configs(name):
    c = config_for(name, 1000)
    got = (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size, c.tie_embeddings,
           c.rope_theta, c.norm_eps, c.max_seq, c.qk_norm)
    assert got == PUBLISHED[name]
    assert name in PRESET_LR  # `xtrain train --preset NAME` has its peak learning rate
    # every GEMM dimension a multiple of 8 (16-byte bf16 rows): cuBLAS's aligned kernels
    assert all(d % 8 == 0 for d in (c.dim, c.ffn_dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim))


def test_parameter_counts_are_the_published_ones():
    """Totals from the shapes alone (nothing is built): Llama-3.2-1B's 1,235,814,400; Qwen3's
    model cards' non-embedding 0.44B and 1.4B (tied: the embedding counts once)."""
    def total(name):
        return sum(int(np.prod(s)) for s in config_for(name, 1).param_shapes().values())
    assert total("llama3.2-1b") == 1_235_814_400
    assert round(config_for("qwen3-0.6b", 1).core_params() / 1e7) == 44
    assert round(config_for("qwen3-1.7b", 1).core_params() / 1e8) == 14
    assert total("qwen3-0.6b") == 151936 * 1024 + config_for("qwen3-0.6b", 1).core_params() + 1024
    assert "lm_head.weight" not in config_for("qwen3-1.7b", 1).param_shapes()


def test_preset_vocabulary_rule():
    """A published preset keeps its vocabulary for a smaller tokenizer and refuses a larger one;
    xtrain's own presets take the tokenizer's."""
    assert config_for("qwen3-0.6b", 4096).vocab_size == 151936
    assert config_for("llama3.2-1b", 128256).vocab_size == 128256
    with pytest.raises(ValueError, match="vocabulary of 128256 ids, fewer than the tokenizer's 151936"):
        config_for("llama3.2-1b", 151936)
    assert config_for("dim768", 4096).vocab_size == 4096
    assert set(PRESET_LR) == set(ALL_PRESETS)  # every architecture's preset has its peak LR


def shrunk(name, **overrides):
    """The preset's heads (head dim, query/kv head ratio, q/k norm, tied head, theta, eps) at a test
    size: 2 layers, 4 query heads, dim 64, vocabulary 96."""
    c = config_for(name, 96)
    ratio = c.n_heads // c.n_kv_heads
    return TransformerConfig(**{**c.to_dict(), **dict(vocab_size=96, dim=64, n_layers=2, n_heads=4,
                                                        n_kv_heads=4 // ratio, ffn_dim=96, max_seq=64),
                                **overrides})


def run(name, dtype, S, recompute=False, seed=1, device="cpu"):
    cfg = shrunk(name, bf16=dtype == "bfloat16", recompute=recompute)
    model = make_model(cfg, device, weights_seed=seed)
    ids, targets = batch(cfg, 2, S)
    logits, loss = model(ids, targets, return_logits=True)
    loss.backward()
    return model, logits.numpy(), loss.numpy(), grads_numpy(model)


TOL = {"float32": (2e-5, 2e-5, 1e-5), "bfloat16": (6e-2, 6e-2, 3e-2)}  # logits rtol, atol; grads' rel L2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", BIG)
def test_shrunk_presets_match_torch_reference(name, dtype):
    S = 40  # past one 32-row tile of the CPU attention
    model, logits, loss, grads = run(name, dtype, S)
    weights = {n: p.numpy() for n, p in model.named_parameters()}
    # float32 against a float64 reference: torch's own float32 CPU path moved these logits by up to
    # 8e-4 with its thread settings (OPENBLAS_NUM_THREADS=1 against the default), xtrain's by nothing
    ref = TorchTransformer(model.config, weights, {"float32": torch.float64, "bfloat16": torch.bfloat16}[dtype])
    ids, targets = batch(model.config, 2, S)
    ref_logits, ref_loss = ref(torch.from_numpy(ids), torch.from_numpy(targets))
    ref_loss.backward()
    rtol, atol, l2 = TOL[dtype]
    np.testing.assert_allclose(np.asarray(logits, np.float64), ref_logits.detach().double().numpy(), rtol=rtol,
                               atol=atol)
    np.testing.assert_allclose(float(loss), ref_loss.item(), rtol=rtol / 10, atol=atol / 10)
    for n, g in ref.grads().items():
        want = g.double().numpy()
        err = np.linalg.norm(grads[n] - want) / max(np.linalg.norm(want), 1e-30)
        assert err < l2, (n, err)


@pytest.mark.parametrize("name", BIG)
def test_shrunk_presets_bitwise_run_to_run_and_under_recompute(device, name):
    """On CUDA bf16 at head dim 128 / 64: the tensor-core attention kernels."""
    _, logits, loss, grads = run(name, "bfloat16", 24, device=device)
    _, logits2, loss2, grads2 = run(name, "bfloat16", 24, device=device)
    _, logits3, loss3, grads3 = run(name, "bfloat16", 24, recompute=True, device=device)
    for other in ((logits2, loss2, grads2), (logits3, loss3, grads3)):
        assert bits_equal(logits, other[0]) and bits_equal(loss, other[1])
        for n in grads:
            assert bits_equal(grads[n], other[2][n]), n
