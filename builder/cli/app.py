"""The `builder` group: the one place that catches errors and decides the exit code, and the signal handlers
every verb runs under. The verbs live in the modules beside this one and add themselves to `main`."""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
import traceback

import click

from .. import __version__, net, redact
from ..errors import EXIT_FAILED, BuilderError, Failed, Interrupted

EXIT_CODES_HELP = """\b
Exit codes (the same for every verb):
  0  all ok
  1  a cell failed (compile, audit, image) or a check failed
  2  bad input, refused before anything ran
  3  the environment is missing or unreachable (no Docker daemon, no buildx, registry or index down)
  130/143  interrupted by SIGINT/SIGTERM (the running docker child is stopped and waited for)"""


class BuilderCommand(click.Command):
    """Every verb's --help ends with the exit codes (a verb with codes of its own passes its epilog)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        super().__init__(*args, **kwargs)


class VerbGroup(click.Group):
    """A verb with verbs of its own (`builder wheels ls`): its commands get the exit codes too. It catches
    nothing: errors go up to `main`."""

    command_class = BuilderCommand

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        super().__init__(*args, **kwargs)


def _report(ctx, message: str, trace: bool = True) -> None:
    """The one error line (or few): no user:password@ of a URL, no secret, and bounded (redact.clip) whatever a
    value it quotes held; --debug adds the traceback, redacted and clipped alike."""
    if trace and ctx.obj and ctx.obj.get("debug"):  # the same exit code, with the traceback
        click.echo(redact.clip(redact.redact(traceback.format_exc()), lines=1000), err=True)
    if message:
        click.secho(f"error: {redact.clip(redact.redact(message))}", fg="red", err=True)


@contextlib.contextmanager
def _bounded_usage_errors():
    """click's own refusals (a value not among a Choice's, no such option or verb) quote what was given: redacted
    and clipped like builder's (`_report`)."""
    try:
        yield
    except click.ClickException as exc:
        exc.message = redact.clip(redact.redact(exc.message))
        raise


# The longest argument Linux passes to a program (MAX_ARG_STRLEN, 32 pages, less the terminating NUL): a longer one
# can only come from a caller in this process (click's CliRunner), and is refused before click reads it (click's
# "did you mean" alone takes seconds over megabytes).
MAX_ARG_CHARS = (128 << 10) - 1

# Which module of builder/cli declares each verb. A run imports only its verb's module: importing all of them
# costs ~0.8 s of CPU, which every refusal of bad input would pay before it could say a word.
VERB_MODULES = {
    "plan": "plan", "render": "plan", "matrix": "plan",
    "build": "build", "publish": "build",
    "wheels": "wheels", "audit": "audit", "lock": "lock", "smoke": "smoke", "serve": "serve",
    "verify-repro": "repro", "doctor": "doctor", "rehearse": "rehearse", "bench": "bench", "warm": "warm",
    "verify": "verify", "snapshot": "snapshot",
}


class BuilderGroup(VerbGroup):
    """The top group. Every error of every verb ends here: BuilderError is its message and its exit code (a
    failed cell raises errors.Failed once its table is printed: 1), an unforeseen filesystem fault is the path
    and the OS's words (1), an interrupt outside a build step is 128 + the signal; --debug keeps the traceback.

    Verbs are loaded when asked for (VERB_MODULES): `get_command` imports one module, `list_commands` (help,
    the reference, a mistyped verb's suggestions) all of them. Walk the verbs through these two, not `commands`."""

    def _load(self, modules) -> None:
        for module in modules:
            importlib.import_module(f"{__package__}.{module}")  # its decorators add its verbs to `main`

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands:
            # an unknown name loads them all: click's "No such command" then lists the real ones
            self._load([VERB_MODULES[cmd_name]] if cmd_name in VERB_MODULES else sorted(set(VERB_MODULES.values())))
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        self._load(sorted(set(VERB_MODULES.values())))
        return super().list_commands(ctx)

    def make_context(self, info_name, args, parent=None, **extra):
        with _bounded_usage_errors():
            for i, arg in enumerate(args):  # only a caller in this process can pass more than the kernel execs
                if len(arg) > MAX_ARG_CHARS:
                    raise click.UsageError(f"argument {i + 1} ({redact.describe(arg, 40)}) is {len(arg)} characters; no "
                                           f"argument of a command line is longer than {MAX_ARG_CHARS} (MAX_ARG_STRLEN)")
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        try:
            with SIGNALS, _bounded_usage_errors():
                return super().invoke(ctx)
        except BuilderError as exc:
            _report(ctx, str(exc), trace=not isinstance(exc, Failed))  # a failed cell's table says it all
            ctx.exit(exc.exit_code)
        except OSError as exc:  # a filesystem fault no check foresaw: the path and the OS's words, not a traceback
            paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
            _report(ctx, f"{paths + ': ' if paths else ''}{exc.strerror or exc}")
            ctx.exit(EXIT_FAILED)
        except KeyboardInterrupt as exc:  # outside a build step (a step's interrupt is in the closing table)
            signum = getattr(exc, "signum", signal.SIGINT)
            click.secho(f"error: interrupted by {signal.Signals(signum).name}", fg="red", err=True)
            ctx.exit(128 + signum)


class _SignalHandlers:
    """While a verb runs, SIGINT and SIGTERM (what CI runners and `timeout` send) raise Interrupted: the
    running docker child is stopped (builder/docker.py), the closing table printed, and the exit code is
    128 + the signal (130, 143). The previous handlers come back afterwards."""

    REDELIVER_S = 0.05  # how long after it was dropped an interrupt is sent again (see _unraisable)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}
        self._previous_unraisable = None
        self._pending: int | None = None  # an interrupt dropped inside a callback, not raised since

    def _handle(self, signum, frame):
        self.received = signum
        self._pending = None
        raise Interrupted(signum)

    def _unraisable(self, unraisable):
        """Python runs a signal's handler wherever the main thread is, and an exception raised inside a weakref
        callback, a __del__ or the garbage collector cannot propagate: it is printed ("Exception ignored in
        ...") and dropped, and the verb went on to exit 0 as if no Ctrl-C came (a snapshot pull, 1 run in ~40:
        the interrupt landed in WeakSet._remove). Such an interrupt is sent to the main thread again a moment
        later, from a thread of its own, so its handler raises it where it can propagate. Not at once: a signal
        raised here runs its handler here, inside this hook, where the exception is dropped again. One still
        pending when the verb ends is raised there."""
        if isinstance(unraisable.exc_value, Interrupted) and self._previous:
            self._pending = unraisable.exc_value.signum
            timer = threading.Timer(self.REDELIVER_S, self._redeliver, [unraisable.exc_value.signum])
            timer.daemon = True
            timer.start()
            return
        (self._previous_unraisable or sys.__unraisablehook__)(unraisable)

    def _redeliver(self, signum: int) -> None:
        if self._previous and self._pending == signum:  # the verb still runs, and nothing raised it since
            signal.pthread_kill(threading.main_thread().ident, signum)

    def __enter__(self):
        self.received = self._pending = None
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            return self
        self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, exc_type, exc, tb):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._previous_unraisable is not None:
            sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None
        pending, self._pending = self._pending, None
        if pending is not None and exc_type is None:
            raise Interrupted(pending)
        return False


SIGNALS = _SignalHandlers()


@click.group(cls=BuilderGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="builder")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def main(ctx, debug):
    """Build vLLM / SGLang images whose GPU code is compiled from source for the archs you ask for,
    prove it, and publish them.

    \b
    Example:
      builder plan                          # every cell of the default profile
      builder render --profile all --out build/dockerfiles
      builder build --arch 80,90 --engine sglang

    With --debug every docker / skopeo / git command line is printed before it runs (except those of rehearse's
    own containers), and errors keep their traceback.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    net.check_environment()  # BUILDER_REMOTE_TIMEOUT=nan and the like: exit 2 before any verb works
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s", stream=sys.stderr)
        for handler in logging.getLogger().handlers:  # no user:password@ of a URL in a debug line either
            handler.addFilter(redact.RedactingFilter())
