"""How the processes of a process group find each other, and the connection that watches them.

    channel, payload = join(env, "tcp", payload=nccl_id if env.rank == 0 else None)
    channel.on_failure(lambda origin, reason: comm.abort(reason))
    values = channel.exchange("rank_rng", state)   # every rank's value, in rank order
    ...
    channel.finish()                                # end barrier; then channel.close()

Design (docs/distributed.md, "Process per GPU"):
- A star of TCP connections: rank 0 listens, every other rank connects to it once and keeps the
  connection for the whole run. How a rank learns where rank 0 listens is the rendezvous method:
    tcp            MASTER_ADDR:MASTER_PORT from the launcher (LaunchEnv), or tcp:HOST:PORT
    file:PATH      rank 0 listens on a port the OS picks and writes host, port and a nonce into
                   PATH (atomically: a temporary file, then a rename); the others poll PATH
    mpi            the same record, broadcast from rank 0 with mpi4py (a byte buffer, no pickle)
  rank 0's `payload` (the NCCL unique id) then reaches every rank over its connection.
- Joining is checked: a connecting rank sends MAGIC, the protocol VERSION, the world size, its
  rank and a token (the launcher's job id, and the nonce of a file or MPI record); rank 0 refuses
  a wrong world size, a rank outside it or taken twice, another job's token, and closes a
  connection that sends anything else (a stranger's garbage) without disturbing the others. The
  listening socket is closed once every rank has joined.
- Failure: both ends send a heartbeat every HEARTBEAT_INTERVAL s. A rank whose connection closes
  without saying goodbye (it died), or that is silent for heartbeat_timeout s (hung, or its
  machine gone), has failed; so has a rank that reports an exception (report_failure). Rank 0
  tells every rank which rank failed and why; each process then runs its failure callbacks once
  (the communicator's abort) and check() raises RankStopped naming the rank. A process still
  alive stop_timeout s after the failure exits on its own (EXIT_STOPPED), so nothing hangs.
- exchange(key, value): a collective over the connection: each rank sends its value (JSON) to rank
  0, which sends every rank the list in rank order. Values must be JSON: numbers, strings, lists,
  dicts (tuples come back as lists).

Standard library only (socket, selectors, threading, json); no xtrain import, so a process can
rendezvous before anything else is loaded.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from xtrain import settings

MAGIC = b"XTRAINRV"
VERSION = 1
# Exit status of a process that stopped because another rank failed (the failing rank exits with
# its own error's status, 1 or 2). Any non-zero status makes torchrun, srun and mpirun end the job.
EXIT_STOPPED = 3

DEFAULT_STOP_TIMEOUT = 30.0         # after a failure, a process still alive this long exits itself
DEFAULT_WAIT_TIMEOUT = 600.0        # exchange() and finish() wait this long for the slowest rank
HEARTBEAT_INTERVAL = 1.0            # at most; a fifth of the heartbeat timeout when that is shorter
HELLO_TIMEOUT = 10.0                # a connection must introduce itself within this, or be dropped
MAX_TOKEN = 1024
MAX_FRAME = 64 << 20                # no message of the protocol comes near it

_HELLO = struct.Struct("!8sHIIH")   # magic, version, world size, rank, token length (+ token)
_WELCOME = struct.Struct("!8sHBI")  # magic, version, status (0 ok, 1 refused), body length (+ body)
_FRAME = struct.Struct("!BI")       # kind, payload length (+ payload)
# Frame kinds after the handshake.
HEARTBEAT, BOOT, DATA, RESULT, FAIL, ABORT, BYE, DONE = range(1, 9)


class RendezvousError(RuntimeError):
    """The ranks could not meet: rank 0 unreachable or gone, a refused join, a timeout."""


class RankStopped(RuntimeError):
    """Raised in a rank when another rank failed and the run is stopping."""


@dataclass(frozen=True)
class Failure:
    origin: int        # the rank that failed first
    reason: str


# ---------------------------------------------------------------- joining

def join(env, method: str = "tcp", *, payload: bytes | None = None, timeout: float | None = None,
         heartbeat_timeout: float | None = None, stop_timeout: float | None = None) -> tuple["Channel", bytes]:
    """Meet the other ranks of `env` (a launch.env.LaunchEnv); returns this rank's Channel and
    rank 0's `payload`. `method`: tcp, tcp:HOST:PORT, file:PATH or mpi. Timeouts default to the
    XTRAIN_RENDEZVOUS_TIMEOUT / XTRAIN_HEARTBEAT_TIMEOUT settings (xtrain.settings: 600 s and
    30 s when unset)."""
    timeout = settings.get("XTRAIN_RENDEZVOUS_TIMEOUT") if timeout is None else float(timeout)
    hb = settings.get("XTRAIN_HEARTBEAT_TIMEOUT") if heartbeat_timeout is None \
        else float(heartbeat_timeout)
    stop = DEFAULT_STOP_TIMEOUT if stop_timeout is None else float(stop_timeout)
    kind, _, arg = method.partition(":")
    if kind not in ("tcp", "file", "mpi") or (kind == "file" and not arg) or (kind == "mpi" and arg):
        raise ValueError(f"rendezvous {method!r}: expected tcp, tcp:HOST:PORT, file:PATH or mpi")
    if env.rank == 0 and payload is None:
        payload = b""
    deadline = time.monotonic() + timeout
    if kind == "tcp":
        host, port = _tcp_address(env, arg, method)
        if env.rank == 0:
            listener = _listen(port, f"rank 0 cannot listen on port {port} (rendezvous {method})")
            conns = _accept_ranks(env, listener, env.job_id, deadline, f"port {port}")
            return Channel(env.rank, env.world_size, conns, hb, stop).started(payload), payload
        sock, boot = _connect(env, host, port, env.job_id, deadline, f"rendezvous {method}")
        return Channel(env.rank, env.world_size, {0: sock}, hb, stop).started(None), boot
    if kind == "file":
        return _join_by_record(env, payload, deadline, hb, stop, _FileRecord(Path(arg)))
    return _join_by_record(env, payload, deadline, hb, stop, _MpiRecord(env))


def _tcp_address(env, arg: str, method: str) -> tuple[str, int]:
    if arg:
        host, sep, port_text = arg.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            port = 0
        if not sep or not host or not 1 <= port <= 65535:
            raise ValueError(f"rendezvous {method!r}: expected tcp:HOST:PORT with a port in 1-65535")
        return host, port
    missing = [k for k, v in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port)) if v is None]
    if missing:
        raise ValueError(f"the tcp rendezvous needs {' and '.join(missing)} ({env.launcher} did not set "
                         f"{'it' if len(missing) == 1 else 'them'}): export them on every rank, or use "
                         f"--rendezvous file:PATH (a shared filesystem) or mpi (mpi4py)")
    return env.master_addr, env.master_port


def _join_by_record(env, payload, deadline, hb, stop, record) -> tuple["Channel", bytes]:
    """file: and mpi: rank 0 listens on a port the OS picks and publishes where, with a nonce."""
    if env.rank == 0:
        listener = _listen(0, "rank 0 cannot listen on a free port")
        nonce = secrets.token_hex(8)
        token = f"{env.job_id}|{nonce}"
        record.publish({"version": VERSION, "world_size": env.world_size, "job": env.job_id, "nonce": nonce,
                        "host": _advertised_host(env), "port": listener.getsockname()[1]})
        try:
            conns = _accept_ranks(env, listener, token, deadline, record.describe())
        finally:
            record.retract()
        return Channel(0, env.world_size, conns, hb, stop).started(payload), payload
    last = None
    while True:
        rec = record.read(deadline)
        if rec is not None:
            if rec.get("world_size") != env.world_size or rec.get("job") != env.job_id:
                last = (f"{record.describe()} is for another run (world size {rec.get('world_size')}, job "
                        f"{rec.get('job')!r}; this rank: {env.world_size}, {env.job_id!r})")
            else:
                window = deadline if record.retry is None else min(deadline, time.monotonic() + record.retry)
                try:
                    sock, boot = _connect(env, rec["host"], int(rec["port"]), f"{env.job_id}|{rec['nonce']}",
                                          deadline, record.describe(), connect_deadline=window)
                    return Channel(env.rank, env.world_size, {0: sock}, hb, stop).started(None), boot
                except RendezvousError as e:  # a stale record (rank 0 of an earlier run): read again
                    last = str(e)
            if record.retry is None:  # one record only: it did not work
                raise RendezvousError(last)
        if time.monotonic() > deadline:
            raise RendezvousError(f"rank {env.rank}: no rank 0 found through {record.describe()} within the "
                                  f"rendezvous timeout" + (f" (last: {last})" if last else ""))
        time.sleep(0.2)


def _advertised_host(env) -> str:
    """Where the other ranks reach rank 0: XTRAIN_RENDEZVOUS_HOST, else 127.0.0.1 when every rank
    is on this machine, else MASTER_ADDR, else this machine's name."""
    return (settings.get("XTRAIN_RENDEZVOUS_HOST") or ("127.0.0.1" if env.single_node else None)
            or env.master_addr or socket.getfqdn())


class _FileRecord:
    retry = 0.5  # seconds to reach the address read before reading the file again (it may be stale)

    def __init__(self, path: Path):
        self.path = path

    def describe(self) -> str:
        return f"rendezvous file {self.path}"

    def publish(self, record: dict) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)  # atomic: a reader sees the old record or the new one
        except OSError as e:
            raise RendezvousError(f"rank 0 cannot write {self.describe()}: {e.strerror or e}") from None

    def retract(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass

    def read(self, deadline: float) -> dict | None:
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # not there yet, or from something else
        return record if isinstance(record, dict) and {"host", "port", "nonce"} <= set(record) else None


class _MpiRecord:
    """The record broadcast with mpi4py from rank 0 (as bytes: no pickle)."""
    retry = None  # one broadcast: the address it gives is rank 0's of this run

    def __init__(self, env):
        try:
            from mpi4py import MPI
        except ImportError:
            raise ValueError("rendezvous mpi needs mpi4py (pip install mpi4py); or use tcp or file:PATH") from None
        self.comm = MPI.COMM_WORLD
        if (self.comm.Get_rank(), self.comm.Get_size()) != (env.rank, env.world_size):
            raise RendezvousError(f"MPI's COMM_WORLD is rank {self.comm.Get_rank()} of {self.comm.Get_size()}, "
                                  f"the environment says rank {env.rank} of {env.world_size}")

    def describe(self) -> str:
        return "MPI broadcast"

    def publish(self, record: dict) -> None:
        self._bcast(json.dumps(record).encode())

    def retract(self) -> None:
        pass

    def read(self, deadline: float) -> dict | None:
        return json.loads(self._bcast(None).decode())

    def _bcast(self, data: bytes | None) -> bytes:
        import numpy as np

        n = np.array([len(data) if data is not None else 0], dtype=np.int64)
        self.comm.Bcast(n, root=0)
        buf = bytearray(data) if data is not None else bytearray(int(n[0]))
        self.comm.Bcast(buf, root=0)
        return bytes(buf)


def _listen(port: int, what: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        hint = {98: "another process holds it: choose another MASTER_PORT",
                13: "ports below 1024 need privileges: choose another MASTER_PORT"}.get(e.errno, "")
        raise RendezvousError(f"{what}: {e.strerror or e}" + (f" ({hint})" if hint else "")) from None
    sock.setblocking(False)
    return sock


def _hello(env, token: str) -> bytes:
    tok = token.encode()[:MAX_TOKEN]
    return _HELLO.pack(MAGIC, VERSION, env.world_size, env.rank, len(tok)) + tok


def _welcome(status: int, body: bytes) -> bytes:
    return _WELCOME.pack(MAGIC, VERSION, status, len(body)) + body


def _accept_ranks(env, listener: socket.socket, token: str, deadline: float, where: str) -> dict:
    """Rank 0: accept until every other rank has joined; returns {rank: socket}. Strangers and
    refused joins are dropped; a joined rank whose connection closes frees its place again."""
    world = env.world_size
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    pending: dict = {}     # socket -> [buffer, deadline, peer]
    joined: dict = {}      # rank -> socket
    try:
        while len(joined) < world - 1:
            now = time.monotonic()
            if now > deadline:
                missing = [r for r in range(1, world) if r not in joined]
                raise RendezvousError(f"rank 0: rank{'s' * (len(missing) > 1)} {_ranks(missing)} did not join "
                                      f"within the rendezvous timeout ({where})")
            for sock, (_, due, peer) in list(pending.items()):
                if now > due:
                    _warn(f"dropped a connection from {peer} that did not introduce itself within {HELLO_TIMEOUT:g} s")
                    _drop(sel, pending, sock)
            for key, _ in sel.select(timeout=0.2):
                sock = key.fileobj
                if sock is listener:
                    try:
                        conn, peer = listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, "pending")
                    pending[conn] = [bytearray(), time.monotonic() + HELLO_TIMEOUT, f"{peer[0]}:{peer[1]}"]
                elif key.data == "pending":
                    _read_hello(sel, pending, joined, sock, env, token)
                else:  # a joined rank's connection closed before everyone joined: its place is free again
                    rank = key.data
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(sock)
                        sock.close()
                        joined.pop(rank, None)
        out = {}
        for rank, sock in joined.items():
            sel.unregister(sock)
            sock.setblocking(True)
            out[rank] = sock
        joined.clear()
        return out
    finally:
        for sock in list(pending):
            _drop(sel, pending, sock)
        for sock in joined.values():
            try:
                sock.sendall(_frame(ABORT, {"origin": 0, "reason": "rank 0 gave up waiting for the other ranks"}))
            except OSError:
                pass
            sock.close()
        sel.close()
        listener.close()  # every rank has joined: nobody else may connect


def _read_hello(sel, pending, joined, sock, env, token) -> None:
    buf, _, peer = pending[sock]
    try:
        data = sock.recv(_HELLO.size + MAX_TOKEN - len(buf))
    except OSError:
        data = b""
    if not data:
        _drop(sel, pending, sock)
        return
    buf += data
    n = min(len(buf), len(MAGIC))
    if bytes(buf[:n]) != MAGIC[:n]:
        _warn(f"dropped a connection from {peer}: not an xtrain rank (wrong magic bytes)")
        _drop(sel, pending, sock)
        return
    if len(buf) < _HELLO.size:
        return
    magic, version, world, rank, n = _HELLO.unpack_from(buf)
    if len(buf) < _HELLO.size + n:
        return
    their_token = bytes(buf[_HELLO.size:_HELLO.size + n]).decode(errors="replace")
    reason = None
    if version != VERSION:
        reason = f"rendezvous protocol version {version}, rank 0 speaks version {VERSION} (mixed xtrain versions?)"
    elif world != env.world_size:
        reason = f"world size {world}, rank 0 has world size {env.world_size}"
    elif not 1 <= rank < env.world_size:
        reason = f"rank {rank} is not a rank that joins rank 0 (1..{env.world_size - 1})"
    elif rank in joined:
        reason = f"rank {rank} has already joined (two processes with the same rank?)"
    elif their_token != token:
        reason = f"job {their_token.split('|')[0]!r} is not rank 0's ({token.split('|')[0]!r}), or a stale record"
    if reason is not None:
        _warn(f"refused a join from {peer}: {reason}")
        try:
            sock.setblocking(True)
            sock.settimeout(2.0)
            sock.sendall(_welcome(1, reason.encode()))
        except OSError:
            pass
        _drop(sel, pending, sock)
        return
    del pending[sock]
    sel.modify(sock, selectors.EVENT_READ, rank)
    try:
        sock.setblocking(True)
        sock.settimeout(5.0)
        sock.sendall(_welcome(0, b""))
        sock.setblocking(False)
    except OSError:
        sel.unregister(sock)
        sock.close()
        return
    joined[rank] = sock


def _drop(sel, pending, sock) -> None:
    pending.pop(sock, None)
    try:
        sel.unregister(sock)
    except (KeyError, ValueError):
        pass
    sock.close()


def _connect(env, host: str, port: int, token: str, deadline: float, where: str,
             connect_deadline: float | None = None) -> tuple[socket.socket, bytes]:
    """A rank other than 0: connect to rank 0 (retrying until `connect_deadline`, default
    `deadline`), introduce itself and wait until every rank has joined (until `deadline`); returns
    the socket and rank 0's payload."""
    delay, last = 0.05, "no attempt"
    connect_deadline = deadline if connect_deadline is None else connect_deadline
    while True:
        remaining = connect_deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(f"rank {env.rank}: cannot reach rank 0 at {host}:{port} ({where}): {last}; is rank "
                                  f"0 running, and do all ranks use the same address and port?")
        try:
            sock = socket.create_connection((host, port), timeout=min(remaining, 5.0))
            break
        except socket.gaierror as e:
            last = f"cannot resolve {host!r} ({e.strerror or e})"
        except OSError as e:
            last = e.strerror or str(e)
        time.sleep(min(delay, max(0.0, connect_deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)
    stranger = RendezvousError(f"rank {env.rank}: {host}:{port} ({where}) answered, but not as an xtrain "
                               f"rendezvous: another service on that port?")
    try:
        sock.settimeout(max(0.1, min(HELLO_TIMEOUT, deadline - time.monotonic())))
        try:
            sock.sendall(_hello(env, token))
            head = _recv_exact(sock, _WELCOME.size)
        except (OSError, ConnectionError):
            raise stranger from None
        if head is None or len(head) < _WELCOME.size:
            raise stranger
        magic, version, status, n = _WELCOME.unpack(head)
        if magic != MAGIC or n > MAX_FRAME:
            raise stranger
        body = (_recv_exact(sock, n) or b"").decode(errors="replace")
        if status != 0:
            raise RendezvousError(f"rank {env.rank}: rank 0 at {host}:{port} refused to let it join: {body}")
        # Joined; rank 0 sends its payload once every rank has.
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            kind, payload = _read_frame(sock)
        except socket.timeout:
            raise RendezvousError(f"rank {env.rank}: joined rank 0 at {host}:{port}, but not every rank joined "
                                  f"within the rendezvous timeout") from None
        except (OSError, ConnectionError) as e:
            raise RendezvousError(f"rank {env.rank}: rank 0 at {host}:{port} closed the connection while the "
                                  f"ranks were joining ({e})") from None
        if kind == ABORT:
            raise RendezvousError(f"rank {env.rank}: {json.loads(payload)['reason']}")
        if kind != BOOT:
            raise RendezvousError(f"rank {env.rank}: unexpected message {kind} from rank 0 while joining")
        sock.settimeout(None)
        return sock, payload
    except BaseException:
        sock.close()
        raise


def _recv_exact(sock, n: int) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(n - len(out))
        if not data:
            return None if not out else bytes(out)
        out += data
    return bytes(out)


def _read_frame(sock) -> tuple[int, bytes]:
    head = _recv_exact(sock, _FRAME.size)
    if head is None or len(head) < _FRAME.size:
        raise ConnectionError("connection closed")
    kind, n = _FRAME.unpack(head)
    if n > MAX_FRAME:
        raise ConnectionError(f"a message of {n} bytes")
    body = _recv_exact(sock, n) if n else b""
    if n and (body is None or len(body) < n):
        raise ConnectionError("connection closed")
    return kind, body


def _frame(kind: int, obj=None, raw: bytes | None = None) -> bytes:
    body = raw if raw is not None else (b"" if obj is None else json.dumps(obj).encode())
    return _FRAME.pack(kind, len(body)) + body


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks))


def _warn(msg: str) -> None:
    print(f"xtrain: rendezvous: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the channel

class Channel:
    """One rank's end of the star (rank 0: a connection to every rank; the others: one to rank
    0). A monitor thread reads every incoming message, sends the heartbeats and notices failures;
    exchange() and finish() are called from the rank's main thread."""

    def __init__(self, rank: int, world_size: int, conns: dict, heartbeat_timeout: float, stop_timeout: float):
        self.rank, self.world_size = rank, world_size
        self.heartbeat_timeout, self.stop_timeout = float(heartbeat_timeout), float(stop_timeout)
        self.interval = min(HEARTBEAT_INTERVAL, self.heartbeat_timeout / 5)
        # exchange() and finish() give up on a rank that is alive (it sends heartbeats) but does
        # not arrive within this (a rank stuck in its own code, or ranks calling different things).
        self.wait_timeout = DEFAULT_WAIT_TIMEOUT
        self._conns = conns                      # peer rank -> socket
        self._send_locks = {r: threading.Lock() for r in conns}
        self._buffers = {r: bytearray() for r in conns}
        self._seen = {r: time.monotonic() for r in conns}
        self._cond = threading.Condition()
        self._failure: Failure | None = None
        self._callbacks: list = []
        self._seq = 0
        self._rounds: dict = {}                  # rank 0: seq -> {rank: (key, value)}
        self._results: dict = {}                 # seq -> values
        self._byes: set = set()                  # rank 0: ranks that finished
        self._done = False                       # rank 0 said the run is over / this rank finished
        self._closing = False
        self._gone: set = set()                  # peers whose connection has closed
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def started(self, payload: bytes | None) -> "Channel":
        if self.rank == 0:
            for r in list(self._conns):
                self._send(r, _frame(BOOT, raw=payload))
        for sock in self._conns.values():
            sock.setblocking(False)
        self._thread = threading.Thread(target=self._monitor, name=f"xtrain-rendezvous-{self.rank}", daemon=True)
        self._thread.start()
        return self

    # ---- failure

    @property
    def failure(self) -> Failure | None:
        return self._failure

    def on_failure(self, callback) -> None:
        """callback(origin, reason), once, from the monitor thread (or at once if a rank already
        failed). It must not block: the communicator's abort."""
        with self._cond:
            self._callbacks.append(callback)
            failure = self._failure
        if failure is not None:
            _call(callback, failure)

    def check(self) -> None:
        """Raise RankStopped when another rank has failed."""
        f = self._failure
        if f is not None and f.origin != self.rank:
            raise RankStopped(f"rank {self.rank} stopped because rank {f.origin} failed: {f.reason}")

    def report_failure(self, reason: str) -> None:
        """This rank failed (an exception): tell rank 0, which tells the others."""
        if self.rank != 0 and 0 in self._conns:
            try:
                self._send(0, _frame(FAIL, {"reason": reason}))
            except OSError:
                pass
        self._fail(self.rank, reason)

    def _fail(self, origin: int, reason: str) -> None:
        with self._cond:
            if self._failure is not None:
                return
            self._failure = Failure(origin, reason)
            callbacks = list(self._callbacks)
            self._cond.notify_all()
        if self.rank == 0:  # every rank still connected learns who failed (the origin too, if rank 0 found it)
            for r in list(self._conns):
                if r not in self._gone:
                    try:
                        self._send(r, _frame(ABORT, {"origin": origin, "reason": reason}))
                    except OSError:
                        pass
        for cb in callbacks:
            _call(cb, self._failure)
        if self.stop_timeout > 0:
            t = threading.Timer(self.stop_timeout, self._stuck)
            t.daemon = True
            t.start()

    def _stuck(self) -> None:
        f = self._failure
        who = "this rank" if f.origin == self.rank else f"rank {f.origin}"
        print(f"xtrain: rank {self.rank}: still running {self.stop_timeout:g} s after {who} failed ({f.reason}); "
              f"exiting", file=sys.stderr, flush=True)
        os._exit(1 if f.origin == self.rank else EXIT_STOPPED)

    # ---- collectives over the connection

    def exchange(self, key: str, value, timeout: float | None = None) -> list:
        """Every rank's `value` for `key` in rank order, once every rank has called it (a
        collective: every rank calls exchange in the same order). timeout: how long to wait for
        the slowest rank (default wait_timeout; math.inf where a rank may legitimately take
        long, its heartbeat proving it alive)."""
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"exchange({key!r}): the value must be JSON (numbers, strings, lists, dicts): {e}") from None
        seq, self._seq = self._seq, self._seq + 1
        if self.world_size == 1:
            return [json.loads(json.dumps(value))]
        if self.rank == 0:
            self._contribute(seq, key, 0, value)
        else:
            self.check()
            try:
                self._send(0, _frame(DATA, {"seq": seq, "key": key, "value": value}))
            except OSError as e:
                self._fail(0, f"the connection to rank 0 broke ({e})")
        self._wait(lambda: seq in self._results, f"exchange({key!r})",
                   lambda: sorted(set(range(self.world_size)) - set(self._rounds.get(seq, {}))), timeout)
        with self._cond:
            return self._results.pop(seq)

    def _wait(self, ready, what: str, missing, timeout: float | None = None) -> None:
        """Wait (main thread) until ready(); raise when a rank failed, fail the run after `timeout`
        (default wait_timeout). missing(): rank 0's list of the ranks it still waits for."""
        timeout = self.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            while not ready():
                self._raise_if_failed()
                if time.monotonic() > deadline:
                    late = missing() if self.rank == 0 else [0]
                    origin = late[0] if late else 0
                    reason = (f"rank{'s' * (len(late) > 1)} {_ranks(late)} did not reach {what} within "
                              f"{timeout:g} s" if self.rank == 0 else f"{what} did not complete within {timeout:g} s")
                    self._cond.release()
                    try:
                        self._fail(origin, reason)
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(0.5)

    def _contribute(self, seq: int, key: str, rank: int, value) -> None:
        """Rank 0: `rank`'s value of round `seq`; the last one completes the round (every rank
        must have called exchange with rank 0's key)."""
        with self._cond:
            got = self._rounds.setdefault(seq, {})
            got[rank] = (key, value)
            complete = len(got) == self.world_size
            if complete:
                del self._rounds[seq]
        if not complete:
            return
        want = got[0][0]
        wrong = [r for r in range(self.world_size) if got[r][0] != want]
        if wrong:
            r = wrong[0]
            self._fail(r, f"rank {r} called exchange({got[r][0]!r}) where rank 0's call #{seq} is exchange({want!r})")
            return
        out = [got[r][1] for r in range(self.world_size)]
        msg = _frame(RESULT, {"seq": seq, "values": out})
        for r in list(self._conns):
            try:
                self._send(r, msg)
            except OSError:
                pass  # the monitor sees the broken connection
        with self._cond:
            self._results[seq] = json.loads(json.dumps(out))
            self._cond.notify_all()

    def finish(self) -> None:
        """End barrier: returns once every rank has finished; raises RankStopped (or the failure)
        if a rank failed first. The connections are then closed."""
        if self.world_size == 1:
            return
        if self.rank == 0:
            self._wait(lambda: len(self._byes) >= self.world_size - 1, "the end of the run",
                       lambda: sorted(set(range(1, self.world_size)) - self._byes))
            with self._cond:
                self._done = True
            for r in list(self._conns):
                try:
                    self._send(r, _frame(DONE))
                except OSError:
                    pass
        else:
            self.check()
            try:
                self._send(0, _frame(BYE))
            except OSError as e:
                self._fail(0, f"the connection to rank 0 broke ({e})")
            self._wait(lambda: self._done, "the end of the run", lambda: [0])
        self.close()

    def _raise_if_failed(self) -> None:
        f = self._failure
        if f is None:
            return
        if f.origin == self.rank:
            raise RendezvousError(f"rank {self.rank} failed: {f.reason}")
        raise RankStopped(f"rank {self.rank} stopped because rank {f.origin} failed: {f.reason}")

    def close(self) -> None:
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for sock in self._conns.values():
            _close_gracefully(sock)
        self._wake_r.close()
        self._wake_w.close()

    # ---- the monitor thread

    def _send(self, rank: int, data: bytes) -> None:
        sock = self._conns[rank]
        with self._send_locks[rank]:
            _send_all(sock, data, timeout=max(5.0, self.heartbeat_timeout))

    def _monitor(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        for r, sock in self._conns.items():
            sel.register(sock, selectors.EVENT_READ, r)
        next_beat = time.monotonic()
        try:
            while not self._closing:
                now = time.monotonic()
                if now >= next_beat:
                    for r in list(self._conns):
                        if r in self._gone:
                            continue
                        try:
                            self._send(r, _frame(HEARTBEAT))
                        except OSError as e:
                            self._lost(sel, r, f"sending to it failed ({e.strerror or e})")
                    next_beat = now + self.interval
                    if self._failure is None:
                        for r, seen in list(self._seen.items()):
                            if r not in self._gone and now - seen > self.heartbeat_timeout:
                                self._fail(r, f"no heartbeat from rank {r} for {now - seen:.0f} s (hung, or its "
                                              f"machine is unreachable)")
                for key, _ in sel.select(timeout=max(0.0, next_beat - time.monotonic())):
                    if key.data is None:
                        continue  # woken up to close
                    self._read(sel, key.data, key.fileobj)
        finally:
            sel.close()

    def _read(self, sel, rank: int, sock) -> None:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except ConnectionResetError:
            self._lost(sel, rank, None)  # a process killed with unread input resets its connections
            return
        except OSError as e:
            self._lost(sel, rank, f"its connection failed ({e.strerror or e})")
            return
        if not data:
            self._lost(sel, rank, None)
            return
        self._seen[rank] = time.monotonic()
        buf = self._buffers[rank]
        buf += data
        while len(buf) >= _FRAME.size:
            kind, n = _FRAME.unpack_from(buf)
            if n > MAX_FRAME:
                self._lost(sel, rank, f"it sent a message of {n} bytes")
                return
            if len(buf) < _FRAME.size + n:
                break
            body = bytes(buf[_FRAME.size:_FRAME.size + n])
            del buf[:_FRAME.size + n]
            try:
                self._handle(rank, kind, body)
            except (ValueError, KeyError, TypeError) as e:
                self._lost(sel, rank, f"it sent a malformed message ({type(e).__name__}: {e})")
                return

    def _handle(self, rank: int, kind: int, body: bytes) -> None:
        if kind == HEARTBEAT:
            return
        msg = json.loads(body) if body else {}
        if kind == DATA and self.rank == 0:
            self._contribute(msg["seq"], msg["key"], rank, msg["value"])
        elif kind == RESULT:
            with self._cond:
                self._results[msg["seq"]] = msg["values"]
                self._cond.notify_all()
        elif kind == FAIL and self.rank == 0:
            self._fail(rank, msg["reason"])
        elif kind == ABORT:
            self._fail(int(msg["origin"]), msg["reason"])
        elif kind == BYE and self.rank == 0:
            with self._cond:
                self._byes.add(rank)
                self._cond.notify_all()
        elif kind == DONE:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _lost(self, sel, rank: int, why: str | None) -> None:
        """The connection to `rank` closed (why None) or failed."""
        self._gone.add(rank)
        try:
            sel.unregister(self._conns[rank])
        except (KeyError, ValueError):
            pass
        finished = rank in self._byes if self.rank == 0 else self._done
        if finished or self._closing:
            return
        if why is None:
            why = "its process exited or was killed (its connection closed without a goodbye)"
        self._fail(rank, why)


def _send_all(sock, data: bytes, timeout: float) -> None:
    """sendall on a non-blocking socket, waiting for room up to `timeout` s in all."""
    view, deadline = memoryview(data), time.monotonic() + timeout
    while view:
        try:
            n = sock.send(view)
            view = view[n:]
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not send for {timeout:g} s (the peer reads nothing)") from None
            sel = selectors.DefaultSelector()
            try:
                sel.register(sock, selectors.EVENT_WRITE)
                sel.select(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            finally:
                sel.close()


def _close_gracefully(sock) -> None:
    """Close after sending what is queued: a socket closed with unread input sends a reset, and
    the peer may then lose the last message (an ABORT with its reason) before reading it."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(False)
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _call(callback, failure: Failure) -> None:
    try:
        callback(failure.origin, failure.reason)
    except Exception as e:  # noqa: BLE001 - a failing callback must not stop the others
        _warn(f"a failure callback raised {type(e).__name__}: {e}")
