"""`builder lock`: each engine's own published metadata into matrix.lock."""

from __future__ import annotations

import click

from .. import grammar, resolve
from .. import matrix as matrix_mod
from ..errors import BuilderError, UserError
from . import flags
from .app import main


@main.command()
@flags.selection
@flags.git_mirrors
@click.option("--index", "index_url", default=None, help="PEP 691 index to read (default: the matrix's defaults.index).")
@click.option("--check", is_flag=True, help="Do not write: exit 1 if matrix.lock is out of date.")
def lock(m, sel, index_url, check):
    """Read each engine's own published metadata (torch pin, companion pins, sdist sha256) into matrix.lock.

    Without selectors every profile is locked; --profile / --engine / --cuda refresh only those packages and
    keep the other entries. Locking is per package: --arch, --only and --skip do not apply.

    \b
    Example:
      builder lock                 # rewrite matrix.lock
      builder lock --engine vllm   # refresh the vLLM entries only
      builder lock --check         # CI: fail when matrix.toml changed without a new lock
    """
    from ..lock import run_lock
    from ..lockfile import LOCK_NAME, Lock, comparable

    if sel.archs or sel.only or sel.skip or sel.base_devel or sel.base_runtime:
        raise UserError("lock: --arch, --only, --skip and --base-* select cells; lock works per package "
                        "(use --profile, --engine or --cuda)")
    if index_url is not None:
        grammar.check(grammar.index_url, index_url, "--index")
    profiles = matrix_mod.selected_profiles(m, sel, default_all=True)
    old = Lock.load(resolve.lock_path(m))
    lock_path = old.path
    partial = bool(sel.profiles or sel.engines or sel.cuda)
    start = {**old.data, "packages": dict(old.data.get("packages", {}))} if partial else {"format": old.data.get("format", 1), "packages": {}}
    fresh = run_lock(m.raw, Lock(lock_path, start), index_url or m.defaults["index"],
                     echo=lambda s: click.echo(s, err=True), kn=m.knowledge,
                     profiles=tuple(p.name for p in profiles), engines=sel.engines)
    from ..lock import lock_base_images

    lock_base_images(fresh, [ref for p in profiles for ref in resolve.base_refs(m, p).values()],
                     echo=lambda s: click.echo(s, err=True))  # FROM name@sha256:... in every rendered Dockerfile
    if check:
        if comparable(fresh.data) != comparable(old.data):
            raise BuilderError(f"{LOCK_NAME} is out of date: run `builder lock`")
        click.echo(f"{LOCK_NAME} is up to date")
        return
    fresh.write()
    click.echo(f"wrote {lock_path}")
