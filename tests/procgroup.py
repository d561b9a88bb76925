"""Launching worker processes (tests/process_worker.py) as one process group under a torchrun-style
environment on 127.0.0.1, for the CPU tests of one process per GPU (test_process_group.py,
test_process_training.py)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xtrain.launch import rendezvous

WORKER = Path(__file__).with_name("process_worker.py")
WAIT_S = 60                # no scenario may take longer than this (a hang fails the test here)
LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")


def torchrun_env(rank=0, world=2, port=29500, **extra):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return {**env, **{k: str(v) for k, v in extra.items()}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def clean_environ(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_KEYS and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    paths = [str(Path(rendezvous.__file__).parent.parent)] + env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update({"XTRAIN_RENDEZVOUS_TIMEOUT": "30", "OPENBLAS_NUM_THREADS": "1"})
    return {**env, **{k: str(v) for k, v in extra.items()}}


class Group:
    """`world` processes under a torchrun-style environment on 127.0.0.1: the worker with
    `scenario`, or `cmd` (e.g. [python, -m, xtrain, train, ...]). Output goes to files, so a chatty
    rank never blocks on a full pipe."""

    def __init__(self, world, scenario=None, port=None, per_rank=None, cmd=None, wait_s=WAIT_S, cwd=None, **extra):
        self.port = port or free_port()
        self.wait_s = wait_s
        self.t0 = time.monotonic()
        self.procs, self.files = [], []
        cmd = cmd or [sys.executable, str(WORKER), json.dumps(scenario)]
        for r in range(world):
            env = clean_environ(**{**torchrun_env(r, world, self.port), **extra, **(per_rank or {}).get(r, {})})
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            self.files.append((out, err))
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, cwd=cwd))
        self.ended = [None] * world

    def wait(self, skip=()):
        """Wait for every process but `skip`; returns [(returncode, stdout, stderr, seconds)]."""
        deadline = self.t0 + self.wait_s
        try:
            while any(self.ended[r] is None for r in range(len(self.procs)) if r not in skip):
                self.poll()
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks still running after {self.wait_s} s: "
                                         f"{[r for r, t in enumerate(self.ended) if t is None]}")
                time.sleep(0.02)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
        out = []
        for r, p in enumerate(self.procs):
            p.wait(10)
            texts = []
            for f in self.files[r]:
                f.seek(0)
                texts.append(f.read())
                f.close()
            out.append((p.returncode, texts[0], texts[1], self.ended[r]))
        return out

    def poll(self) -> None:
        for r, p in enumerate(self.procs):
            if self.ended[r] is None and p.poll() is not None:
                self.ended[r] = time.monotonic() - self.t0
