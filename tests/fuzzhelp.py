"""The parent side of the fuzz suite: a Worker process that runs cases (tests/fuzz_worker.py), the
hypothesis settings every fuzz test shares, and the checks on an outcome.

A case that crashes the worker natively comes back as {"crashed": returncode} and the worker is
restarted for the next one, so one crash fails its test with the case in the message and
pytest goes on.

Time: every fuzz test runs a fixed number of examples (FUZZ_EXAMPLES scales them), derandomized
so CI sees the same cases every run; XTRAIN_FUZZ_RANDOM=1 explores new ones (and prints the
failing example to reproduce). XTRAIN_FUZZ_LOG=FILE appends every case and its outcome to FILE.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

import xtrain

WORKER = Path(__file__).with_name("fuzz_worker.py")
SCALE = float(os.environ.get("XTRAIN_FUZZ_SCALE", "1"))
RANDOM = bool(os.environ.get("XTRAIN_FUZZ_RANDOM"))
LOG = os.environ.get("XTRAIN_FUZZ_LOG")
# The exceptions a bad argument may raise; anything else (AttributeError, KeyError, a pybind11
# cast error...) is a bug in how xtrain checks its inputs.
EXPECTED = ("ValueError", "TypeError", "IndexError", "OverflowError", "RuntimeError")


def fuzz_settings(examples: int):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=not RANDOM, print_blob=RANDOM,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


class Worker:
    """One fuzz worker process; run(case) -> outcome dict."""

    def __init__(self, timeout: float = 120.0):
        self.timeout = timeout
        self.proc = None

    def _start(self):
        env = dict(os.environ)
        paths = [str(Path(xtrain.__file__).parent.parent)]
        paths += [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(PYTHONPATH=os.pathsep.join(paths), OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
        env.pop("XTRAIN_DEBUG", None)
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, str(WORKER), str(write)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     pass_fds=(write,), text=True)
        os.close(write)
        self.answers = os.fdopen(read)

    def run(self, case: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        timer = _Alarm(self.timeout, self.proc)
        with timer:
            line = self.answers.readline()
        if line:
            outcome = json.loads(line)
        else:
            outcome = {"crashed": self.proc.wait(), "timed_out": timer.fired}
            self.proc = None
        if LOG:
            with open(LOG, "a") as f:
                f.write(json.dumps({"case": case, "outcome": outcome}) + "\n")
        return outcome

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc = None


class _Alarm:
    """Kill `proc` if the block takes longer than `seconds` (the parent then reads EOF)."""

    def __init__(self, seconds: float, proc):
        self.seconds, self.proc, self.fired = seconds, proc, False

    def _fire(self, *_):
        self.fired = True
        self.proc.kill()

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


def check_raised_cleanly(case: dict, outcome: dict, expected=EXPECTED) -> None:
    """The case succeeded, or raised one of `expected` with a message; never a crash."""
    assert "crashed" not in outcome, f"native crash (exit {outcome['crashed']}) on {case}"
    if outcome["ok"]:
        return
    assert any(b in expected for b in outcome["bases"]), \
        f"unexpected {outcome['type']}: {outcome['message']!r} on {case}"
    assert outcome["message"].strip(), f"{outcome['type']} without a message on {case}"
    assert "Unable to cast" not in outcome["message"], f"unclear message {outcome['message']!r} on {case}"


def check_cli_outcome(case: dict, outcome: dict) -> None:
    """xtrain exited 0, or printed one `xtrain: error:` (or out of memory) line: never a
    traceback, never an internal error, never a crash."""
    assert "crashed" not in outcome, f"native crash (exit {outcome['crashed']}) on {case}"
    assert outcome["ok"], f"cli.main raised {outcome['type']}: {outcome['message']!r} on {case}"
    err = outcome["stderr"]
    assert "Traceback" not in err and "internal error" not in err, f"{err!r} on {case}"
    if outcome["code"] != 0:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        assert last.startswith(("xtrain: error:", "xtrain: out of memory:")), f"{err!r} on {case}"


def snapshot(root: Path, skip=()) -> dict:
    """path -> (size, mtime_ns) of every file and symlink under root (symlinked directories are
    not followed), except those whose real location lies in one of the directories `skip`."""
    skip = [Path(s).resolve() for s in skip]
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath, name)
            real = p.parent.resolve() / p.name
            if any(real == s or s in real.parents for s in skip):
                continue
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out
