"""Stopping a run cleanly: Ctrl-C (SIGINT) or SIGTERM asks the training loop to finish the step it
is on, save a checkpoint and say how to resume; a second signal aborts at once.

    stop = StopRequest()
    with stop.installed():             # a no-op off the main thread: Python signals reach only it
        while ...:
            train_step(run)
            if stop.is_set(): break    # with ranks: agreed at the same step by all (train.controls)

Decisions:
- Python runs signal handlers on the main thread only. A single-device run and each process of a
  process group (torchrun, srun, mpirun forward the signal to every process) install the handler
  in train(); the data-parallel launcher, whose ranks are threads, installs it on the calling
  thread around the launch and shares the one StopRequest with every rank.
- The handler only sets a flag (and says so on stderr with one os.write, safe in a handler); the
  loop reads it between steps. A second signal restores the default handlers and raises
  KeyboardInterrupt, which aborts wherever the run is (the last checkpoint stays).
- Leaving `installed()` restores the handlers that were there before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(KeyboardInterrupt):
    """The run stopped on a signal after saving its checkpoint (a KeyboardInterrupt: the command
    line exits as interrupted, with status 130)."""


class StopRequest:
    """A flag set by SIGINT/SIGTERM (or by request()), shared by every rank thread of a run."""

    def __init__(self):
        self._event = threading.Event()
        self.signal_name: str | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def request(self, why: str = "a request") -> None:
        self.signal_name = self.signal_name or why
        self._event.set()

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGINT and SIGTERM in this block (on the main thread; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        before = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._handle)
        try:
            yield self
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._event.is_set():
            for s in SIGNALS:
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
            raise KeyboardInterrupt(f"a second {name}")
        self.request(name)
        os.write(2, f"\nxtrain: {name}: finishing this step, then saving a checkpoint "
                    f"(press Ctrl-C again to abort at once)\n".encode())
