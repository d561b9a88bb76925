"""The development tools' host-side parts (dev/README.md): dev/wgmma_flash.py reads the harness's
output into the result file's rows."""
import importlib.util
from pathlib import Path

DEV = Path(__file__).resolve().parents[1] / "dev"

SAMPLE = """\
check      D= 64: |new - old| max 0 (bitwise equal 1.0000 of elements), lse max 0; |new - float64| max 0.00252 over 8 rows
gpt2-d12   D= 64 mma.sync forward          0.288 ms   178.8 TFLOP/s
gpt2-d12   D= 64 wgmma forward             0.214 ms   240.8 TFLOP/s
gpt2-d12   D= 64 wgmma-overlap forward     0.200 ms   257.7 TFLOP/s
gpt2-d12   D= 64: dq |new - old| max 0 of max |dq| 0.652 (bitwise equal 1.0000 of elements); delta bitwise equal 1.0000
qwen3-1.7b D=128 mma.sync dq (+delta)      1.540 ms   267.8 TFLOP/s (its three products)
qwen3-1.7b D=128 wgmma dk/dv               1.271 ms   432.7 TFLOP/s (its four products)
every output bitwise the mma.sync kernels', the forwards close to float64
"""


def _module():
    spec = importlib.util.spec_from_file_location("wgmma_flash", DEV / "wgmma_flash.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wgmma_flash_output_is_parsed():
    got = _module().parse(SAMPLE)
    assert [(t["shape"], t["D"], t["form"], t["kernel"], t["ms"]) for t in got["timings"]] == [
        ("gpt2-d12", 64, "mma.sync", "forward", 0.288), ("gpt2-d12", 64, "wgmma", "forward", 0.214),
        ("gpt2-d12", 64, "wgmma-overlap", "forward", 0.200),
        ("qwen3-1.7b", 128, "mma.sync", "dq", 1.540), ("qwen3-1.7b", 128, "wgmma", "dk/dv", 1.271)]
    assert got["timings"][-1]["tflops_nominal"] == 432.7
    assert len(got["bit_checks"]) == 2 and got["verdict"].startswith("every output bitwise")
    failed = _module().parse(SAMPLE.replace("every output bitwise", "FAILED: an output differs"))
    assert failed["verdict"].startswith("FAILED")
