"""One error tree, caught once in the CLI. Every verb exits with the same codes:

  0  everything asked for succeeded
  1  a cell failed (compile, audit, image; smoke later) or a check found a problem (`lock --check`)
  2  bad input — refused before anything ran (UserError)
  3  the environment is missing or unreachable: no Docker daemon, no buildx, a tool not installed,
     a registry or index that does not answer (EnvironmentProblem)
  130, 143  interrupted by SIGINT / SIGTERM (128 + the signal, as shells report it): the running docker
     buildx child was stopped and waited for, and the closing table says what was interrupted (Interrupted)

Failed is exit 1 (or a child's code) once the results are printed. CommandError carries the argv, exit code
and output tail of an external command that failed.
"""

from __future__ import annotations

import shlex
import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3


class BuilderError(Exception):
    """Base of every error the CLI knows how to report."""

    exit_code = EXIT_FAILED


class UserError(BuilderError):
    """Bad input: a matrix key, a CLI value, a file that does not exist."""

    exit_code = EXIT_BAD_INPUT


class EnvironmentProblem(BuilderError):
    """Something the host must provide is missing or unreachable (Docker daemon, buildx, a registry)."""

    exit_code = EXIT_ENVIRONMENT


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached builder. A KeyboardInterrupt, so every `except Exception` lets it through;
    the runner records it as the interrupted step's result and the CLI exits 128 + the signal number."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(exc: BaseException) -> str:
    """SIGINT / SIGTERM for an interrupt (a plain KeyboardInterrupt is Ctrl-C: SIGINT)."""
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


class Failed(BuilderError):
    """A cell, a check or a proof failed and its results are already printed: the CLI exits with `exit_code`
    (1, or the code a child process returned), saying `error: <message>` only when there is a message."""

    def __init__(self, message: str = "", exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


class CommandError(BuilderError):
    """An external command (docker, skopeo, ...) failed."""

    exit_code = EXIT_FAILED

    def __init__(self, argv: list[str], returncode: int, output: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-20:])
        msg = f"command failed (exit {returncode}): {shlex.join(self.argv)}"
        if tail:
            msg += f"\n{tail}"
        super().__init__(msg)
