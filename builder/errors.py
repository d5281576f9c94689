"""One error tree, caught once in the CLI.

UserError (and subclasses) → clear message, exit code 2, no traceback.
CommandError → an external command failed; carries argv, exit code and output tail.
"""

from __future__ import annotations

import shlex


class BuilderError(Exception):
    """Base of every error the CLI knows how to report."""

    exit_code = 1


class UserError(BuilderError):
    """Bad input: a matrix key, a CLI value, a file that does not exist."""

    exit_code = 2


class AuditFailure(BuilderError):
    """A binary misses an arch the user asked for."""

    exit_code = 1


class CommandError(BuilderError):
    """An external command (docker, skopeo, ...) failed."""

    exit_code = 1

    def __init__(self, argv: list[str], returncode: int, output: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-20:])
        msg = f"command failed (exit {returncode}): {shlex.join(self.argv)}"
        if tail:
            msg += f"\n{tail}"
        super().__init__(msg)
