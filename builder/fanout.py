"""Cells fanned out over several BuildKit builders: `--builder A,B` (each a buildx builder or a docker context).

Which builder builds a cell is decided by rendezvous hashing (highest random weight): every (cell id, builder)
pair gets a score, sha256 of both, and the cell goes to the builder with the highest one. So a cell sticks to one
builder from run to run (its BuildKit layer cache is there), whatever else is selected (`--only`, `--skip`) and in
whatever order the list is written; adding a builder moves only the cells the new one wins (about 1/N of them), and
removing one moves only the cells it had. What it does not promise is balance: with few cells, two may land on one
builder while another idles (`builder build --dry-run` says which builder gets which cell before anything runs).

Layer: below the verbs and the runner, beside docker.py; it knows cell ids and builder names, nothing of steps.
"""

from __future__ import annotations

import hashlib
import re

from . import docker, grammar, redact
from .errors import EnvironmentProblem, UserError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse(value: str | None) -> tuple[str, ...]:
    """The builders `--builder` names, in the order given: () for none (the current builder), one name, or a comma
    list. An empty item or a builder named twice is refused (exit 2), as is a name that is not one."""
    if value is None:
        return ()
    names = tuple(name.strip() for name in value.split(","))
    for name in names:
        if not name:
            raise UserError(f"--builder: {value!r} has an empty item; give NAME or NAME,NAME,... (no empty names)")
        check_name(name)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--builder: {', '.join(twice)} named twice; each builder once (a cell sticks to one)")
    return names


def check_name(name: str) -> None:
    grammar.check(grammar.path_argument, name, "--builder")
    if not _NAME.fullmatch(name):
        raise UserError(f"--builder: {redact.describe(name)} is not a builder name (letters, digits, '_', '.', '-')")


def _score(cell_id: str, builder: str) -> bytes:
    return hashlib.sha256(f"{cell_id}\0{builder}".encode()).digest()


def assign(cell_ids: list[str], builders: tuple[str, ...]) -> dict[str, str]:
    """cell id → the builder that builds it (rendezvous hashing: see the module's docstring)."""
    return {cell_id: max(builders, key=lambda b: _score(cell_id, b)) for cell_id in cell_ids}


def check_known(builders: tuple[str, ...], docker_cli: str = "docker") -> None:
    """Every builder exists, before anything runs: a docker context (`docker context inspect`) or a buildx builder
    (`docker buildx inspect`); else exit 2 naming it."""
    for name in builders:
        if docker.is_context(name, docker_cli):
            continue
        code, out, err = docker.probe([docker_cli, "buildx", "inspect", name], timeout=30)
        if code == 127:
            raise EnvironmentProblem(f"{docker_cli}: command not found: Docker is not installed or not on PATH")
        if code != 0:
            why = (err or out).strip().splitlines()
            raise UserError(f"--builder {name}: neither a docker context nor a buildx builder"
                            + (f" ({why[-1]})" if why else "") + "; see `docker context ls` and `docker buildx ls`")


def not_answering(builder: str, docker_cli: str = "docker") -> str:
    """Why `builder` does not answer now ("" when it does): its engine's `docker info` for a docker context, the
    builder's status for a buildx builder."""
    if docker.is_context(builder, docker_cli):
        code, out, err = docker.probe([docker_cli, "--context", builder, "info", "--format", "{{.ServerVersion}}"],
                                      timeout=30)
        lines = (err or out).strip().splitlines()
        return "" if code == 0 else (lines[-1] if lines else f"docker info exited {code}")
    code, out, err = docker.probe([docker_cli, "buildx", "inspect", builder], timeout=30)
    status = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Status:")), "")
    if code != 0:
        lines = (err or out).strip().splitlines()
        return lines[-1] if lines else f"docker buildx inspect exited {code}"
    return "" if status in ("running", "") else f"status {status}"
