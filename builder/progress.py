"""Progress of hours-long compiles: the build system's own counters, read from the streamed output, shown
as objects done / total, elapsed and an ETA — one updating line on a terminal, a short status line at a
bounded interval in a CI log (the full output is always in the cell's log file), log groups on GitHub
Actions — and estimates from earlier builds of the same package.

Counters understood:
- ninja's ``[N/M]`` (CMake builds: vLLM, sglang-kernel; torch extension builds with ninja: flash-attn),
  also inside BuildKit's plain lines (``#12 301.2 [17/345] Building CUDA object ...``);
- one nvcc command line per CUDA source (``nvcc ... file.cu``) when no total is printed (setuptools
  without ninja).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

MODES = ("auto", "tty", "plain", "quiet", "raw")
PLAIN_INTERVAL_S = 60.0

_NINJA = re.compile(r"\[(\d+)/(\d+)\]")
_NVCC_OBJECT = re.compile(r"(?:^|[\s/])nvcc\s.*\S\.cu(?:\s|$)")


def counters(line: str) -> tuple[int, int] | None:
    """(done, total) from a ninja status line, else None."""
    m = _NINJA.search(line)
    if m:
        done, total = int(m.group(1)), int(m.group(2))
        if 0 < done <= total:
            return done, total
    return None


def is_object_compile(line: str) -> bool:
    return bool(_NVCC_OBJECT.search(line))


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class Tracker:
    """One compile's counters; `feed` gets every output line."""

    label: str
    estimate_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    done: int = 0
    total: int = 0  # 0 while unknown
    objects_seen: int = 0  # nvcc compiles counted when no total is printed
    on_change: Callable[["Tracker"], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def feed(self, line: str) -> None:
        got = counters(line)
        if got:
            done, total = got
            # a new total is a new ninja run (vLLM builds several): start counting it afresh
            self.done = max(self.done, done) if total == self.total else done
            self.total = total
        elif is_object_compile(line):
            self.objects_seen += 1
        else:
            return
        if self.on_change:
            self.on_change(self)

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def objects(self) -> int:
        return self.done if self.total else self.objects_seen

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far; before any counter, what is left of the estimate."""
        if self.total and self.done:
            return self.elapsed / self.done * (self.total - self.done)
        if self.estimate_s is not None:
            return max(0.0, self.estimate_s - self.elapsed)
        return None

    def status(self) -> str:
        parts = [self.label]
        if self.total:
            parts.append(f"{self.done}/{self.total} objects ({100 * self.done // self.total}%)")
        elif self.objects_seen:
            parts.append(f"{self.objects_seen} objects")
        else:
            parts.append("configuring")
        parts.append(f"elapsed {duration(self.elapsed)}")
        eta = self.eta_s
        if eta is not None:
            parts.append(f"ETA {duration(eta)}" + ("" if self.total and self.done else " (estimate)"))
        return ", ".join(parts)


class Display:
    """Where progress goes: `tty` redraws one line, `plain` prints a status line at most every `interval`
    seconds, `quiet` shows none, `raw` streams the build output itself. On GitHub Actions each compile is a
    log group."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None, interval: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, env: dict | None = None):
        self.stream = stream or sys.stderr
        env = os.environ if env is None else env
        if mode == "auto":
            mode = "tty" if self.stream.isatty() and env.get("TERM") != "dumb" and not env.get("CI") else "plain"
        if mode not in MODES:
            raise ValueError(mode)
        self.mode = mode
        self.interval = interval
        self.clock = clock
        self.github = env.get("GITHUB_ACTIONS") == "true" and mode != "tty"
        self._last_print = 0.0
        self._line_open = False
        # cells of several builders run at once (builder/fanout.py): one writer at a time, so no line is cut by another
        self._lock = threading.RLock()

    @property
    def echoes_output(self) -> bool:
        return self.mode == "raw"

    def say(self, text: str) -> None:
        """A step line (never lost under a progress line)."""
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self.stream.flush()

    def track(self, label: str, estimate_s: float | None) -> Tracker:
        if self.github:
            self.say(f"::group::{label}")
        tracker = Tracker(label, estimate_s, clock=self.clock, on_change=self._changed)
        self._last_print = self.clock()
        return tracker

    def finish(self, tracker: Tracker) -> None:
        if self.mode in ("tty", "plain"):
            self.say(f"{tracker.status()} — done")
        if self.github:
            self.say("::endgroup::")

    def lane(self, prefix: str) -> "Lane":
        """This display as one builder's cells see it: every line and progress label starts with `prefix`."""
        return Lane(self, prefix)

    def _changed(self, tracker: Tracker) -> None:
        with self._lock:
            self._redraw(tracker)

    def _redraw(self, tracker: Tracker) -> None:
        if self.mode == "tty":
            self._clear()
            self.stream.write(tracker.status()[:200])
            self.stream.flush()
            self._line_open = True
        elif self.mode == "plain" and self.clock() - self._last_print >= self.interval:
            self._last_print = self.clock()
            self.say(tracker.status())

    def _clear(self) -> None:
        if self._line_open:
            self.stream.write("\r\x1b[2K")
            self._line_open = False


class Lane:
    """One builder's share of a Display (`Display.lane`): the same stream and lock, its own prefix."""

    def __init__(self, display: Display, prefix: str):
        self.display, self.prefix = display, prefix

    @property
    def echoes_output(self) -> bool:
        return self.display.echoes_output

    def say(self, text: str) -> None:
        self.display.say(self.prefix + text)

    def track(self, label: str, estimate_s: float | None) -> Tracker:
        return self.display.track(self.prefix + label, estimate_s)

    def finish(self, tracker: Tracker) -> None:
        self.display.finish(tracker)
