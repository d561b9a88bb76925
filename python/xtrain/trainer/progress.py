"""What the training loop shows while it runs: a one-line bar on a terminal, plain lines elsewhere.

    progress = open_progress(total=800, initial=0, log_every=10, enabled=True)
    progress.step(StepLine(step=0, total=800, loss=6.1, lr=2e-5, ms=512.0, tok_s=4000.0, mem_mb=120.0))
    progress.write("step 200: val loss 2.1234")        # a message line (above the bar)
    progress.close()

- Bar: when stdout is a terminal that reports a width and progress is on. It is drawn from the
  first step on (never before the header lines the loop prints), redrawn at most every
  REDRAW_S seconds, and always fits the terminal's width less one column: the fields are laid
  out in a fixed order and, when the width is short, dropped by priority (the graphic first,
  then the time per step, the LR, the ETA, memory, MFU, the loss); the step count and tok/s are
  never dropped or cut.
- Lines: otherwise (output to a file or a pipe, --no-progress, a terminal of width 0): one plain
  line on stdout for the first step, every `log_every` steps and the last, like nanoGPT's
  `iter 100: loss 2.1, time 25ms, mfu 30%`. Nothing goes to stderr, and no carriage returns.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

# The bar is redrawn at most this often: a GPU step of 25 ms would otherwise redraw 40 times a second.
REDRAW_S = 0.1
# The bar's graphic: drawn only when at least MIN_GRAPHIC columns are left, at most MAX_GRAPHIC wide.
MIN_GRAPHIC = 10
MAX_GRAPHIC = 30
_BLOCKS = " ▏▎▍▌▋▊▉█"


@dataclass
class StepLine:
    """One logged step: `step` is its index (0-based), shown as the count of steps done."""
    step: int
    total: int
    loss: float
    lr: float
    ms: float
    tok_s: float
    mem_mb: float
    mfu: float | None = None           # GPU runs
    note: str = ""                     # e.g. "(warm-up: peak 2e-3 not reached)"

    def fields(self) -> list[tuple[str, str]]:
        """(name, text) in the order a line shows them."""
        out = [("loss", f"loss {self.loss:.4f}"), ("lr", f"lr {self.lr:.2e}{' ' + self.note if self.note else ''}"),
               ("ms", f"{self.ms:,.0f} ms"), ("tok_s", f"{self.tok_s:,.0f} tok/s")]
        if self.mfu is not None:
            out.append(("mfu", f"MFU {100 * self.mfu:.1f}%"))
        out.append(("mem", f"{self.mem_mb:,.0f} MB"))
        return out


def plain_line(s: StepLine) -> str:
    """`step 100/800: loss 2.1234, lr 1.00e-03, 512 ms, 4,000 tok/s, 120 MB`."""
    return f"step {s.step + 1}/{s.total}: " + ", ".join(text for _, text in s.fields())


def terminal_width(stream) -> int:
    """The columns of the terminal `stream` writes to; 0 when it is none or reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def open_progress(total: int, initial: int, log_every: int, enabled: bool = True, stream=None):
    """A Bar on a terminal that reports its width (when `enabled`), else Lines."""
    stream = stream if stream is not None else sys.stdout
    if enabled and stream.isatty() and terminal_width(stream) > 0:
        return Bar(total, initial, stream)
    return Lines(log_every, stream)


class Lines:
    """Plain lines: the first step, every `log_every` steps, the last."""

    def __init__(self, log_every: int, stream=None):
        self.log_every = log_every
        self.stream = stream if stream is not None else sys.stdout
        self.shown = 0

    def step(self, s: StepLine) -> None:
        done = s.step + 1
        if self.shown == 0 or done % self.log_every == 0 or done == s.total:
            self.write(plain_line(s))
            self.shown += 1

    def write(self, message: str) -> None:
        self.stream.write(message + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class Bar:
    """A one-line bar that fits the terminal (see the module doc). `width`: a function giving the
    terminal's columns (default: asked of `stream` at every redraw, so a resize is followed)."""

    def __init__(self, total: int, initial: int, stream=None, width=None):
        self.total, self.initial = total, initial
        self.stream = stream if stream is not None else sys.stdout
        self.width = width or (lambda: terminal_width(self.stream))
        self.last: StepLine | None = None
        self.drawn = 0                 # length of the line on screen (0: none)
        self.stale = False             # a step not drawn yet (the redraws are throttled)
        self.t_start = time.monotonic()
        self.t_drawn = 0.0
        self.avg_s = None              # moving average of the step time, for the ETA

    def step(self, s: StepLine) -> None:
        self.last = s
        self.avg_s = s.ms / 1000 if self.avg_s is None else 0.9 * self.avg_s + 0.1 * s.ms / 1000
        now = time.monotonic()
        self.stale = True
        if now - self.t_drawn >= REDRAW_S or s.step + 1 == s.total:
            self.t_drawn = now
            self._draw()

    def write(self, message: str) -> None:
        self._clear()
        self.stream.write(message + "\n")
        if self.last is not None:
            self._draw()
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            if self.stale:
                self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = 0

    def render(self, width: int) -> str:
        """The bar's line for a terminal `width` columns wide (at most width - 1 long, except the
        step count and tok/s, which are kept whatever the width)."""
        s = self.last
        done = s.step + 1
        count = f"train {done}/{s.total}"
        eta = "" if self.avg_s is None else f"ETA {_clock((s.total - done) * self.avg_s)}"
        named = dict(s.fields())
        order = ["loss", "tok_s", "mfu", "mem", "eta", "lr", "ms"]  # shown in this order
        drop = ["ms", "lr", "eta", "mem", "mfu", "loss"]             # dropped first to last
        texts = {**named, "eta": eta}
        keep = [k for k in order if texts.get(k)]
        room = max(width - 1, 0)

        def line(graphic: str = "") -> str:
            head = f"{count} {graphic}" if graphic else count
            return " | ".join([head] + [texts[k] for k in keep])

        for name in drop:
            if len(line()) <= room:
                break
            if name in keep:
                keep.remove(name)
        spare = room - len(line()) - 1
        if spare >= MIN_GRAPHIC:
            return line(_graphic(done / max(s.total, 1), min(spare, MAX_GRAPHIC)))
        return line()

    def _draw(self) -> None:
        width = self.width()
        text = self.render(width if width > 0 else 80)
        pad = max(self.drawn - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self.drawn, self.stale = len(text), False

    def _clear(self) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.drawn = 0


def _graphic(frac: float, width: int) -> str:
    """`[█████▌    ]` filled to `frac`, `width` columns in all."""
    inner = width - 2
    eighths = int(round(min(max(frac, 0.0), 1.0) * inner * 8))
    full, part = divmod(eighths, 8)
    cells = "█" * full + (_BLOCKS[part] if part and full < inner else "")
    return "[" + cells.ljust(inner) + "]"


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
