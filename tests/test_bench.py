"""The benchmarks measure what they say: small CPU runs of the scripts in bench/ whose rows would
come out wrong, not just slow, if the script drove xtrain differently from `xtrain train` (a
recompute flag set where the blocks never read it measured the plain step as "recompute on")."""
import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(BENCH / script), "--device", "cpu", "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def test_recompute_bench_turns_recompute_on(tmp_path):
    result = _run("recompute.py", tmp_path, "--presets", "tiny", "--batch", "4", "--seq", "64", "--fp32",
                  "--steps", "1", "--warmup", "1", "--no-search", "--no-torch")
    rows = {r["recompute"]: r for r in result["same_batch"] if r["framework"] == "xtrain"}
    assert set(rows) == {False, True}
    # With the blocks' checkpoints the forward keeps far fewer activations: a lower peak.
    assert rows[True]["peak_allocated"] < 0.95 * rows[False]["peak_allocated"], rows
