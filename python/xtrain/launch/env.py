"""Which launcher started this process and where the process sits in the job, read from the
environment in one place. Everything else takes a LaunchEnv.

    env = detect()     # None: no launcher started this process
    env.launcher, env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port

Launchers, the first that matches wins:
- torchrun, or anything that sets its variables: RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID). torchrun's agent serves its own store at
  MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so xtrain's TCP rendezvous listens on
  MASTER_PORT + 1 under torchrun; a hand-made environment without that variable uses MASTER_PORT.
- mpirun: Open MPI's OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, or the PMI_RANK,
  PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS of MPICH and Intel MPI. MASTER_ADDR (default
  127.0.0.1 when every rank is on this node) and MASTER_PORT place the TCP rendezvous.
- srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the step's node list (its first host is
  the master address unless MASTER_ADDR is set); the port is MASTER_PORT, else one derived from
  the job id. A batch script itself (SLURM_PROCID without SLURM_STEP_NUM_TASKS) is not a launch:
  only srun starts the ranks.

A partial or inconsistent environment (RANK without WORLD_SIZE, a rank outside the world, a port
that is not a port) raises LaunchError, a ValueError naming the variables.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

LAUNCHERS = ("torchrun", "mpi", "slurm")
# srun without MASTER_PORT: the rendezvous port is SLURM_PORT_BASE + job id mod SLURM_PORT_SPAN,
# so the ranks of one job agree on it without being told, and two jobs on one node rarely meet.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 20000


class LaunchError(ValueError):
    """The launcher's environment is partial or inconsistent."""


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str                  # "torchrun", "mpi" or "slurm"
    rank: int
    world_size: int
    local_rank: int                # this process's index among the ranks of its node
    local_world_size: int | None   # ranks on this node, where the launcher says
    master_addr: str | None        # where rank 0's TCP rendezvous listens (None: not given)
    master_port: int | None
    job_id: str = ""               # the launcher's job identity ("" where it has none): two jobs
                                   # that share a port or a rendezvous file do not join each other

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def single_node(self) -> bool:
        """Every rank runs on this machine (as far as the launcher says)."""
        return self.local_world_size == self.world_size

    def default_rendezvous(self) -> str:
        """tcp, except under mpirun with mpi4py installed: mpi."""
        if self.launcher == "mpi" and importlib.util.find_spec("mpi4py") is not None:
            return "mpi"
        return "tcp"

    def describe(self) -> str:
        where = f"{self.master_addr}:{self.master_port}" if self.master_addr else "no master address"
        return (f"{self.launcher}: rank {self.rank} of {self.world_size}, local rank {self.local_rank}"
                f"{'' if self.local_world_size is None else f' of {self.local_world_size}'}, {where}")


def detect(environ=None) -> LaunchEnv | None:
    """The launch this process belongs to, from `environ` (default os.environ); None when no
    launcher's variables are set."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        return _torchrun(env)
    if "LOCAL_RANK" in env and not any(k in env for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_STEP_NUM_TASKS")):
        raise LaunchError("LOCAL_RANK is set but RANK and WORLD_SIZE are not: a torchrun-style launch sets all "
                          "three (unset LOCAL_RANK to run one process)")
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        return _mpi(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", env.get("OMPI_MCA_ess_base_jobid", ""))
    if "PMI_RANK" in env or "PMI_SIZE" in env:
        return _mpi(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", env.get("PMI_ID", ""))
    if "SLURM_STEP_NUM_TASKS" in env:
        return _slurm(env)
    return None


# ---- launchers

def _torchrun(env) -> LaunchEnv:
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    _check_rank(rank, world, "RANK", "WORLD_SIZE")
    if "LOCAL_RANK" not in env:
        raise LaunchError(f"RANK={rank} and WORLD_SIZE={world} are set but LOCAL_RANK is not: set LOCAL_RANK "
                          f"(this process's GPU index on its machine), as torchrun does")
    local = _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else None
    _check_local(local, local_world, world, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    addr, port = _master(env)
    # torchrun's agent already listens on MASTER_PORT (its store, shared with the workers).
    if port is not None and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        port = _port_value(port + 1, f"MASTER_PORT + 1 (MASTER_PORT={port} is torchrun's own store)")
    return LaunchEnv("torchrun", rank, world, local, local_world, addr, port, env.get("TORCHELASTIC_RUN_ID", ""))


def _mpi(env, rank_key, size_key, local_key, local_size_key, job: str) -> LaunchEnv:
    rank, world = _int(env, rank_key), _int(env, size_key)
    _check_rank(rank, world, rank_key, size_key)
    local = _int(env, local_key) if local_key in env else None
    local_world = _int(env, local_size_key) if local_size_key in env else None
    if local is None:
        if world > 1 and local_world != 1:
            raise LaunchError(f"{rank_key} and {size_key} are set but {local_key} is not: the rank's GPU on its "
                              f"machine is unknown")
        local = 0
    _check_local(local, local_world, world, local_key, local_size_key)
    addr, port = _master(env)
    if addr is None and local_world == world:
        addr = "127.0.0.1"  # one machine: the rendezvous is local
    return LaunchEnv("mpi", rank, world, local, local_world, addr, port, job)


def _slurm(env) -> LaunchEnv:
    if "SLURM_PROCID" not in env:
        raise LaunchError("SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not: srun sets both")
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    _check_rank(rank, world, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
    if "SLURM_NTASKS" in env and _int(env, "SLURM_NTASKS") < world:
        raise LaunchError(f"SLURM_STEP_NUM_TASKS={world} exceeds SLURM_NTASKS={env['SLURM_NTASKS']}")
    if "SLURM_LOCALID" not in env:
        raise LaunchError("SLURM_PROCID is set but SLURM_LOCALID is not: srun sets both")
    local = _int(env, "SLURM_LOCALID")
    nodes = _int(env, "SLURM_STEP_NUM_NODES") if "SLURM_STEP_NUM_NODES" in env else None
    local_world = world if nodes == 1 else _tasks_on_node(env)
    _check_local(local, local_world, world, "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE")
    addr, port = _master(env)
    if addr is None:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise LaunchError("srun: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set, and MASTER_ADDR "
                              "is not: the address of rank 0 is unknown")
        addr = first_host(nodelist)
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if port is None and job:
        try:
            port = SLURM_PORT_BASE + int(job) % SLURM_PORT_SPAN
        except ValueError:
            raise LaunchError(f"SLURM_JOB_ID={job!r} is not a number; set MASTER_PORT") from None
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
    return LaunchEnv("slurm", rank, world, local, local_world, addr, port, f"{job}.{step}" if job else "")


# ---- helpers

def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: "gpu[003-005,9],cpu1" -> "gpu003" (each bracket
    contributes the start of its first range; ranges keep their zero padding)."""
    text = nodelist.strip()
    head, depth = [], 0
    for ch in text:  # the first top-level, comma-separated entry
        if ch == "," and depth == 0:
            break
        depth += ch == "["
        depth -= ch == "]"
        head.append(ch)
    entry = "".join(head)

    def first(m):
        return re.split(r"[,-]", m.group(1).strip(), maxsplit=1)[0].strip()

    host = re.sub(r"\[([^\]]*)\]", first, entry)
    if not host or any(c in host for c in "[], ") or depth != 0:
        raise LaunchError(f"cannot read the first host of the Slurm node list {nodelist!r}; set MASTER_ADDR")
    return host


def _tasks_on_node(env) -> int | None:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE"), env.get("SLURM_NODEID")
    if not spec or node is None:
        return None
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    try:
        return counts[int(node)]
    except (ValueError, IndexError):
        return None


def _master(env) -> tuple[str | None, int | None]:
    addr = env.get("MASTER_ADDR") or None
    port = env.get("MASTER_PORT")
    return (addr.strip() if addr else None), (None if port is None else _port(port))


def _port(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise LaunchError(f"MASTER_PORT={text!r} is not a port number (1-65535)") from None
    return _port_value(value, f"MASTER_PORT={text!r}")


def _port_value(value: int, what: str) -> int:
    if not 1 <= value <= 65535:
        raise LaunchError(f"{what} is not a port number (1-65535)")
    return value


def _int(env, key: str) -> int:
    text = env.get(key)
    if text is None:
        raise LaunchError(f"{key} is not set")
    try:
        return int(text.strip())
    except ValueError:
        raise LaunchError(f"{key}={text!r} is not an integer") from None


def _check_rank(rank: int, world: int, rank_key: str, world_key: str) -> None:
    if world < 1:
        raise LaunchError(f"{world_key}={world}: the world needs at least one process")
    if not 0 <= rank < world:
        raise LaunchError(f"{rank_key}={rank} is outside {world_key}={world} (ranks run 0..{world - 1})")


def _check_local(local: int, local_world: int | None, world: int, local_key: str, local_world_key: str) -> None:
    if local < 0:
        raise LaunchError(f"{local_key}={local} is negative")
    if local_world is not None:
        if not 1 <= local_world <= world:
            raise LaunchError(f"{local_world_key}={local_world} must be between 1 and the world size {world}")
        if local >= local_world:
            raise LaunchError(f"{local_key}={local} is outside {local_world_key}={local_world}")
    elif local >= world:
        raise LaunchError(f"{local_key}={local} is not below the world size {world}")
