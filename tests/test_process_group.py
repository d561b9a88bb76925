"""One process per GPU, on the CPU (no NCCL here): the launcher environment (xtrain.launch.env),
the rendezvous and its failure watch (xtrain.launch.rendezvous), and xtrain.launch.distributed.run_process with a
stand-in communicator, with real processes on 127.0.0.1 (tests/process_worker.py) where processes
matter (a rank that raises, exits, hangs; a port that cannot be used) and threads where they do
not. Ports come free from the OS. The NCCL side runs in tests/test_distributed.py on two GPUs.

Timeouts are generous for a loaded two-core machine but bounded: a process-group scenario ends
in a few seconds, or the test fails after WAIT_S."""

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from modelhelp import run_cli
from procgroup import WAIT_S, WORKER, Group, clean_environ, free_port, torchrun_env
from xtrain.launch import rendezvous
from xtrain.launch.distributed import pick_device
from xtrain.launch.env import LaunchEnv, LaunchError, detect, first_host
from xtrain.launch.rendezvous import EXIT_STOPPED, RankStopped, RendezvousError

STOP_S = 10                # after a rank fails, every other rank has ended within this


# ---------------------------------------------------------------- the environment

def test_no_launcher_is_none():
    assert detect({}) is None
    assert detect({"PATH": "/bin", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None
    # a Slurm batch script (srun has not started any task): not a launch
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}) is None


def test_torchrun():
    env = detect(torchrun_env(1, 4, 29500, TORCHELASTIC_RUN_ID="abc"))
    assert env == LaunchEnv("torchrun", 1, 4, 1, 4, "127.0.0.1", 29500, "abc")
    assert not env.is_main and env.single_node and env.default_rendezvous() == "tcp"
    # torchrun's agent serves its own store at MASTER_PORT: xtrain takes the next port
    assert detect(torchrun_env(0, 2, 29500, TORCHELASTIC_USE_AGENT_STORE="True")).master_port == 29501
    assert detect(torchrun_env(0, 2, 29500, TORCHELASTIC_USE_AGENT_STORE="False")).master_port == 29500


def test_slurm():
    base = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
            "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0"}
    env = detect(base)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("slurm", 5, 8, 1, 4)
    assert env.master_addr == "gpu007" and env.master_port == 20000 + 123456 % 20000
    assert env.job_id == "123456.0" and not env.single_node
    env = detect({**base, "MASTER_ADDR": "head", "MASTER_PORT": "4242"})
    assert (env.master_addr, env.master_port) == ("head", 4242)
    with pytest.raises(LaunchError, match="SLURM_LOCALID"):
        detect({k: v for k, v in base.items() if k != "SLURM_LOCALID"})
    with pytest.raises(LaunchError, match="SLURM_PROCID=5 is outside SLURM_STEP_NUM_TASKS=4"):
        detect({**base, "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"})


def test_mpi():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_PORT": "6000"}
    env = detect(ompi)
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("mpi", 3, 4, 3)
    assert (env.master_addr, env.master_port) == ("127.0.0.1", 6000)  # one machine: local
    env = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                  "MASTER_ADDR": "n0"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port) == (1, 2, 0, "n0", None)
    assert env.default_rendezvous() in ("tcp", "mpi")  # mpi where mpi4py is installed
    with pytest.raises(ValueError, match="needs MASTER_PORT"):
        rendezvous.join(env, "tcp")
    with pytest.raises(LaunchError, match="OMPI_COMM_WORLD_LOCAL_RANK"):
        detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


@pytest.mark.parametrize("environ, match", [
    ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK is not"),
    ({"LOCAL_RANK": "0"}, "RANK and WORLD_SIZE are not"),
    (torchrun_env(2, 2), r"RANK=2 is outside WORLD_SIZE=2"),
    (torchrun_env(0, 0), "at least one process"),
    ({**torchrun_env(0, 2), "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({**torchrun_env(1, 2), "LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK=1 is outside LOCAL_WORLD_SIZE=1"),
    ({**torchrun_env(0, 2), "MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a port number"),
    ({**torchrun_env(0, 2), "MASTER_PORT": "0"}, "is not a port number"),
    ({**torchrun_env(0, 2), "MASTER_PORT": "70000"}, "is not a port number"),
    (torchrun_env(0, 2, 65535, TORCHELASTIC_USE_AGENT_STORE="True"), r"MASTER_PORT \+ 1"),
])
def test_partial_or_inconsistent_environments_are_clear_errors(environ, match):
    with pytest.raises(LaunchError, match=match):
        detect(environ)


@pytest.mark.parametrize("nodelist, host", [("gpu[003-005,9],cpu1", "gpu003"), ("node1,node2", "node1"),
                                            ("a[1-2]b[07-08]", "a1b07"), ("solo", "solo"),
                                            ("rack[2,4]-n[10-11]", "rack2-n10")])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_first_host_refuses_what_it_cannot_read():
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        first_host("gpu[1-2")


def test_pick_device():
    env = LaunchEnv("torchrun", 3, 8, 3, 8, "h", 1)
    assert pick_device(env, available=8) == 3
    assert pick_device(env, available=1) == 0  # the launcher gave this process its one GPU
    with pytest.raises(RuntimeError, match="local rank 3 .* sees 2 GPUs"):
        pick_device(env, available=2)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        pick_device(env, available=0)


# ---------------------------------------------------------------- processes

def _result(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout
    return json.loads(lines[-1][len("RESULT "):])


def test_three_processes_meet_exchange_and_finish():
    runs = Group(3, {"exchanges": 2}).wait()
    for rank, (code, stdout, stderr, _) in enumerate(runs):
        assert code == 0, stderr
        result = _result(stdout)
        want = [{"rank": r, "id": "id-from-rank-0"} for r in range(3)]  # rank 0's id reached every rank
        assert result["values"] == [want, want] and result["main"] == (rank == 0)
        assert len(result["hosts"]) == 3 and all(h.endswith(" cpu") for h in result["hosts"])


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failing_rank_stops_the_others_within_seconds(how):
    runs = Group(3, {"fail": {"rank": 1, "how": how, "after": 0.3}}).wait()
    code, _, stderr, t_fail = runs[1]
    if how == "raise":
        assert code == 1 and "rank 1: error: ValueError: rank 1 broke on purpose" in stderr, stderr
    else:
        assert code == 7
    why = "ValueError: rank 1 broke on purpose" if how == "raise" else "its process exited or was killed"
    for rank in (0, 2):  # rank 2 polls ctx.check(); rank 0 ... both name rank 1 and why
        code, _, stderr, t_end = runs[rank]
        assert code == EXIT_STOPPED, stderr
        assert f"xtrain: rank {rank}: stopped: rank 1 failed: " in stderr and why in stderr, stderr
        assert t_end - t_fail < STOP_S, (t_end, t_fail)


def test_rank_0_dying_stops_the_others():
    runs = Group(2, {"fail": {"rank": 0, "how": "exit", "after": 0.3}}).wait()
    assert runs[0][0] == 7
    code, _, stderr, t_end = runs[1]
    assert code == EXIT_STOPPED and "stopped: rank 0 failed: its process exited" in stderr, stderr
    assert t_end - runs[0][3] < STOP_S


def test_a_hung_rank_is_found_by_its_missing_heartbeat():
    group = Group(2, {"fail": {"rank": 1, "how": "stop", "after": 0.3}}, XTRAIN_HEARTBEAT_TIMEOUT=1.5)
    try:
        runs = group.wait(skip=(1,))
    finally:
        group.procs[1].kill()  # stopped (SIGSTOP): only SIGKILL ends it
        group.procs[1].wait(10)
    code, _, stderr, t_end = runs[0]
    assert code == EXIT_STOPPED and "stopped: rank 1 failed: no heartbeat from rank 1" in stderr, stderr
    assert t_end < WAIT_S


def test_a_port_in_use_is_a_clear_error_on_every_rank():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        runs = Group(2, {}, port=port, XTRAIN_RENDEZVOUS_TIMEOUT=1.5).wait()
    code, _, stderr, _ = runs[0]
    assert code == 1 and f"rank 0 cannot listen on port {port}" in stderr and "MASTER_PORT" in stderr, stderr
    code, _, stderr, _ = runs[1]
    # rank 1 reached the stranger listening there: not an xtrain rendezvous (or nothing at all)
    assert code == 1 and ("not as an xtrain rendezvous" in stderr or "cannot reach rank 0" in stderr), stderr


def test_nothing_listening_times_out_naming_the_address():
    port = free_port()
    runs = Group(2, {}, port=port, XTRAIN_RENDEZVOUS_TIMEOUT=1.5, per_rank={0: {"MASTER_PORT": free_port()}}).wait()
    code, _, stderr, t = runs[1]  # rank 0 listens elsewhere: rank 1 finds nobody at its MASTER_PORT
    assert code == 1 and f"cannot reach rank 0 at 127.0.0.1:{port}" in stderr, stderr
    assert "did not join within the rendezvous timeout" in runs[0][2], runs[0][2]


def test_the_cli_refuses_a_bad_master_port_and_a_partial_environment():
    r = run_cli("train", "--steps", "1", env=clean_environ(**{**torchrun_env(0, 2), "MASTER_PORT": "http"}))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == ("xtrain: error: launcher environment: MASTER_PORT='http' is not a port number "
                                "(1-65535)"), r.stderr
    r = run_cli("train", "--steps", "1", env=clean_environ(RANK="1", WORLD_SIZE="2"))
    assert r.returncode == 2 and "LOCAL_RANK" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.skipif(__import__("xtrain.launch.distributed").launch.distributed.is_available(), reason="NCCL and a GPU are available here")
def test_the_cli_under_a_launcher_without_nccl_says_so_with_its_rank():
    r = run_cli("train", "--steps", "1", env=clean_environ(**torchrun_env(1, 2, free_port())))
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = r.stderr.strip()
    assert line.startswith("xtrain: rank 1: error: torchrun started 2 processes:"), line
    assert "NCCL" in line or "CUDA" in line, line  # a CPU build, or a CUDA build on a machine without GPUs
    r = run_cli("train", "--steps", "1", "--devices", "2", env=clean_environ(**torchrun_env(1, 2, free_port())))
    assert r.returncode == 2


# ---------------------------------------------------------------- the rendezvous in threads

def _join_all(envs, method, payload=b"pay", **kw):
    """rendezvous.join for every env on its own thread; returns [(channel, payload) or exception]."""
    out = [None] * len(envs)

    def one(i, env):
        try:
            out[i] = rendezvous.join(env, method, payload=payload if env.rank == 0 else None, timeout=15, **kw)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, e)) for i, e in enumerate(envs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _envs(world, port, job=""):
    return [LaunchEnv("torchrun", r, world, r, world, "127.0.0.1", port, job) for r in range(world)]


def _close(results):
    for res in results:
        if isinstance(res, tuple):
            res[0].close()


def test_strangers_are_turned_away_and_the_ranks_still_meet(capfd):
    port = free_port()
    envs = _envs(2, port)
    box = {}
    rank0 = threading.Thread(target=lambda: box.setdefault("r", rendezvous.join(envs[0], "tcp", payload=b"p",
                                                                                 timeout=15, stop_timeout=0)))
    rank0.start()
    garbage = []
    deadline = time.monotonic() + 10
    while len(garbage) < 3 and time.monotonic() < deadline:  # rank 0 is listening once connects succeed
        try:
            garbage.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except OSError:
            time.sleep(0.05)
    garbage[0].sendall(b"GET / HTTP/1.1\r\n\r\n")                 # another protocol
    garbage[1].sendall(rendezvous.MAGIC + b"\x00\x63" + bytes(40))  # our magic, another version
    # garbage[2] says nothing at all
    channel, payload = rendezvous.join(envs[1], "tcp", timeout=15, stop_timeout=0)
    rank0.join(15)
    assert payload == b"p" and box["r"][1] == b"p"
    for s in garbage:
        s.close()
    channel.close()
    box["r"][0].close()
    err = capfd.readouterr().err
    assert "not an xtrain rank (wrong magic bytes)" in err and "protocol version 99" in err, err


def test_a_rank_of_another_world_or_job_is_refused():
    port = free_port()
    good = _envs(2, port, job="job-1")
    bad_world = LaunchEnv("torchrun", 1, 3, 1, 3, "127.0.0.1", port, "job-1")
    bad_job = LaunchEnv("torchrun", 1, 2, 1, 2, "127.0.0.1", port, "job-2")
    out = [None] * 3

    def run(i, env, delay):
        time.sleep(delay)
        try:
            out[i] = rendezvous.join(env, "tcp", payload=b"" if env.rank == 0 else None, timeout=15,
                                     stop_timeout=0)
        except BaseException as e:  # noqa: BLE001
            out[i] = e

    threads = [threading.Thread(target=run, args=a) for a in ((0, good[0], 0), (1, bad_world, 0.3),
                                                              (2, bad_job, 0.6))]
    for t in threads:
        t.start()
    threads[1].join(20)
    threads[2].join(20)
    assert isinstance(out[1], RendezvousError) and "world size 3, rank 0 has world size 2" in str(out[1])
    assert isinstance(out[2], RendezvousError) and "job 'job-2' is not rank 0's ('job-1')" in str(out[2])
    ok = rendezvous.join(good[1], "tcp", timeout=15, stop_timeout=0)  # the right rank still gets in
    threads[0].join(20)
    assert isinstance(out[0], tuple), out[0]
    ok[0].close()
    out[0][0].close()


def test_file_rendezvous_skips_a_stale_record_and_removes_its_own(tmp_path):
    path = tmp_path / "shared" / "rdzv.json"
    path.parent.mkdir()
    stale_port = free_port()
    path.write_text(json.dumps({"version": 1, "world_size": 3, "job": "", "nonce": "old", "host": "127.0.0.1",
                                "port": stale_port}))  # an earlier run's: nobody listens there
    results = _join_all(_envs(3, None), f"file:{path}", stop_timeout=0)
    try:
        assert all(isinstance(r, tuple) for r in results), results
        assert [r[1] for r in results] == [b"pay"] * 3
        assert not path.exists()  # rank 0 removes the record once every rank has joined
        values = _exchange_all([r[0] for r in results], "k", lambda rank: {"r": rank})
        assert values == [[{"r": 0}, {"r": 1}, {"r": 2}]] * 3
    finally:
        _close(results)


def _exchange_all(channels, key, value_of):
    out = [None] * len(channels)
    threads = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, c.exchange(key, value_of(i))))
               for i, c in enumerate(channels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def test_exchange_values_must_be_json_and_keys_must_agree():
    results = _join_all(_envs(2, free_port()), "tcp", stop_timeout=0)
    try:
        ch0, ch1 = results[0][0], results[1][0]
        with pytest.raises(TypeError, match="must be JSON"):
            ch0.exchange("k", object())
        out = [None, None]

        def call(i, ch, key):
            try:
                out[i] = ch.exchange(key, i)
            except BaseException as e:  # noqa: BLE001
                out[i] = e

        threads = [threading.Thread(target=call, args=(0, ch0, "a")), threading.Thread(target=call, args=(1, ch1, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert isinstance(out[0], RankStopped) and "rank 1 called exchange('b')" in str(out[0]), out
        assert isinstance(out[1], RendezvousError) and "exchange('b')" in str(out[1]), out  # rank 1 is the origin
    finally:
        _close(results)


def test_the_end_barrier_waits_for_every_rank_and_a_failure_callback_runs_once():
    results = _join_all(_envs(2, free_port()), "tcp", stop_timeout=0)
    ch0, ch1 = results[0][0], results[1][0]
    seen = []
    ch0.on_failure(lambda origin, reason: seen.append((origin, reason)))
    finished = threading.Event()
    t = threading.Thread(target=lambda: (ch0.finish(), finished.set()))
    t.start()
    time.sleep(0.3)
    assert not finished.is_set()  # rank 1 has not finished yet
    ch1.finish()
    t.join(10)
    assert finished.is_set() and seen == []


def test_a_rank_that_never_arrives_fails_the_exchange_after_its_timeout():
    """A rank alive (heartbeats) but stuck elsewhere: rank 0 gives up after wait_timeout, names it,
    and tells it too."""
    results = _join_all(_envs(2, free_port()), "tcp", stop_timeout=0)
    ch0, ch1 = results[0][0], results[1][0]
    try:
        ch0.wait_timeout = 0.5
        with pytest.raises(RankStopped, match=r"rank 1 did not reach exchange\('k'\) within 0.5 s"):
            ch0.exchange("k", 0)
        deadline = time.monotonic() + 10
        while ch1.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ch1.failure is not None and ch1.failure.origin == 1
    finally:
        _close(results)


@pytest.mark.skipif(shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpirun and mpi4py (apt-get install openmpi-bin; pip install mpi4py)")
@pytest.mark.parametrize("method", ["mpi", "tcp"])
def test_under_mpirun(method, tmp_path):
    """mpirun's environment (OMPI_COMM_WORLD_*): the ranks meet through an MPI broadcast of rank 0's
    address (the default with mpi4py) or at MASTER_ADDR:MASTER_PORT; a raising rank stops the
    others, which name it (mpirun may kill the raising rank before it prints)."""
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    if shutil.which("ssh") is None and shutil.which("rsh") is None:
        # Open MPI refuses to start without a remote shell even when every rank is local (a
        # container without ssh); the agent is never run for local ranks.
        env["OMPI_MCA_plm_rsh_agent"] = "false"
    probe = subprocess.run(["mpirun", "--oversubscribe", "-np", "1", sys.executable, "-c", "pass"], env=env,
                           capture_output=True, text=True, timeout=WAIT_S)
    if probe.returncode != 0:
        lines = [ln for ln in (probe.stderr + probe.stdout).splitlines() if ln.strip(" -")]
        pytest.skip(f"mpirun cannot start a local process here: {lines[0] if lines else probe.returncode}")
    extra = ["-x", f"MASTER_PORT={free_port()}"] if method == "tcp" else []
    mpirun = ["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OPENBLAS_NUM_THREADS", *extra,
              sys.executable, str(WORKER)]
    r = subprocess.run([*mpirun, json.dumps({"rendezvous": method, "out": str(tmp_path)})], env=env,
                       capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, (r.stdout, r.stderr)
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert all(res["values"][0][1] == {"rank": 1, "id": "id-from-rank-0"} for res in results)
    if method == "tcp":
        return  # the failure path is the rendezvous connection's, whichever way the ranks met
    r = subprocess.run([*mpirun, json.dumps({"rendezvous": method, "fail": {"rank": 1, "how": "raise", "after": 0.2}})],
                       env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode != 0
    assert "xtrain: rank 0: stopped: rank 1 failed: ValueError: rank 1 broke on purpose" in r.stderr, r.stderr
