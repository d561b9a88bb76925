"""What a training step keeps for backward, counted by the CPU allocator (bench/activation_memory.py):
a smoke run of the script, and xtrain's bytes per token per layer at qwen3-1.7b's and llama3.2-1b's dims pinned, so a
change that keeps one more tensor (or a copy of one) fails here with the number it moved to."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# qwen3-1.7b's dims in bf16 (dim 2048, 16 heads / 8 kv heads of 128, ffn 6144), the preset's lean
# ops: the block's table in docs/model.md, "Activation memory". Recompute keeps the block's input, the residual
# after attention and the MLP's hidden (the down projection's input).
QWEN3_1_7B_BYTES_PER_TOKEN_PER_LAYER = 45_128
QWEN3_1_7B_RECOMPUTE_BYTES_PER_TOKEN_PER_LAYER = 20_480
# The plain blocks (lean_activations off) keep the norms' outputs, the normed and rotated q/k with
# their rstd rows and the SwiGLU product besides: what the torch.compile peer keeps.
QWEN3_1_7B_PLAIN_BYTES_PER_TOKEN_PER_LAYER = 71_848
# llama3.2-1b (dim 2048, 32 heads / 8 kv heads of 64, ffn 8192, no q/k norm), lean: ops.rope_attention
# keeps q and k unrotated (the three ops rope, rope, flash_attention kept the rotated pair besides,
# 5,120 bytes more).
LLAMA3_2_1B_BYTES_PER_TOKEN_PER_LAYER = 51_336


def _script():
    sys.path.insert(0, str(BENCH))
    try:
        import activation_memory
        return activation_memory
    finally:
        sys.path.remove(str(BENCH))


def test_the_script_runs_and_its_tables_agree_with_the_allocator(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(BENCH / "activation_memory.py"), "--preset", "tiny", "--layers", "1",
                           "3", "--seq", "32", "--vocab", "256", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"activation_memory.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    (path,) = tmp_path.glob("activation_memory-tiny-*.json")
    result = json.loads(path.read_text())
    xt = result["xtrain"]
    assert xt["table_matches_measurement"], (xt["block_table_total"], xt["plain"])
    assert xt["static_measured"] == xt["static_formula_at_measured_size"]
    assert 0 < xt["recompute"]["kept_per_token_per_layer"] < xt["plain"]["kept_per_token_per_layer"]
    for name in ("compiled", "eager"):
        peer = result["peer"][name]
        assert peer["kept_per_token_per_layer"] == sum(r["bytes_per_token"] for r in peer["block_table"])
        assert peer["weight_cast_bytes_per_layer"] > 0
    # eager keeps the norms' and RoPE's float32 products, which compile does not
    assert result["peer"]["eager"]["kept_per_token_per_layer"] > result["peer"]["compiled"]["kept_per_token_per_layer"]
    ext = result["extrapolation"]
    assert ext["xtrain_plain"]["estimate"] > ext["xtrain_recompute"]["estimate"] > ext["xtrain_plain"]["static"]


@pytest.mark.parametrize("preset,lean,recompute,expected", [
    ("qwen3-1.7b", True, False, QWEN3_1_7B_BYTES_PER_TOKEN_PER_LAYER),
    ("qwen3-1.7b", True, True, QWEN3_1_7B_RECOMPUTE_BYTES_PER_TOKEN_PER_LAYER),
    ("qwen3-1.7b", False, False, QWEN3_1_7B_PLAIN_BYTES_PER_TOKEN_PER_LAYER),
    ("llama3.2-1b", True, False, LLAMA3_2_1B_BYTES_PER_TOKEN_PER_LAYER)])
def test_xtrain_keeps_the_pinned_bytes_per_token_per_layer(device, preset, lean, recompute, expected):
    """The same count on every device: what the tape keeps is the ops' choice, not the backend's.
    The presets' lean ops, and the plain blocks (lean_activations off: the small presets' form)."""
    am = _script()
    seq = 16
    runs = [am.measure_xtrain(am.small_config(preset, L, 64, seq, recompute=recompute, lean_activations=lean),
                              seq, seed=0, device=device) for L in (1, 2)]
    per_token_per_layer = (runs[1]["kept_bytes"] - runs[0]["kept_bytes"]) / seq
    assert per_token_per_layer == expected
    if not recompute:
        table = am.xtrain_block_table(am.small_config(preset, 1, 64, seq, lean_activations=lean))
        assert sum(r["bytes_per_token"] for r in table) == expected
