"""An interrupt whose handler ran inside a weakref callback (or a __del__, or the garbage collector) cannot
propagate there: Python prints "Exception ignored in ..." and drops it. A snapshot pull went on to exit 0 after
Ctrl-C that way (1 run in ~40: the signal landed in WeakSet._remove). builder/cli/app.py's signal handling sends
such an interrupt again, so the verb still stops: a moment later where the verb runs on, or as the verb ends.
Each case runs in a process of its own (a real SIGINT, a real weakref callback)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from builder.cli.app import SIGNALS
    from builder.errors import Interrupted

    class Thing:
        pass

    def callback(ref):  # the signal lands while this callback runs: its handler raises here, and Python drops it
        print("the callback began", flush=True)
        os.kill(os.getpid(), signal.{sig})
        for _ in range(10000):
            pass
        print("the callback went on", flush=True)  # never: the handler raised above

    caught = None
    try:
        with SIGNALS:
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing
            end = time.monotonic() + {work_s}
            while time.monotonic() < end:
                pass
            print("the verb ran to its end", flush=True)
    except Interrupted as exc:
        caught = exc.signum
    print("caught", caught, flush=True)
    print("hook restored", sys.unraisablehook is sys.__unraisablehook__, flush=True)
    print("handler restored", signal.getsignal(signal.{sig}) is {default}, flush=True)
""")


def _run(sig: str, work_s: float) -> subprocess.CompletedProcess:
    default = "signal.default_int_handler" if sig == "SIGINT" else "signal.SIG_DFL"
    return subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig, work_s=work_s, default=default)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("sig,code", [("SIGINT", 2), ("SIGTERM", 15)])
def test_an_interrupt_dropped_in_a_callback_stops_the_verb_while_it_runs_on(sig, code):
    proc = _run(sig, work_s=5.0)
    assert proc.returncode == 0, proc.stderr
    assert "the callback began" in proc.stdout and "the callback went on" not in proc.stdout  # raised in there,
    assert "the verb ran to its end" not in proc.stdout  # dropped, and raised again in the verb, which stopped
    assert f"caught {code}" in proc.stdout
    assert "hook restored True" in proc.stdout and "handler restored True" in proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr


def test_an_interrupt_dropped_just_before_the_verb_ends_is_raised_as_it_ends():
    proc = _run("SIGINT", work_s=0.0)  # ends before the signal could be sent again
    assert proc.returncode == 0, proc.stderr
    assert "the callback began" in proc.stdout and "the callback went on" not in proc.stdout
    assert "the verb ran to its end" in proc.stdout
    assert "caught 2" in proc.stdout
    assert "hook restored True" in proc.stdout and "handler restored True" in proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr
