"""`builder wheels ls|verify|prune|push|pull`: the local wheelhouse and the remote wheel stores."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import matrix as matrix_mod
from .. import plan as plan_mod
from .. import resolve
from ..errors import Failed, UserError
from ..options import wheel_cache, wheelhouse_at
from . import flags
from .app import VerbGroup, main


@main.group(cls=VerbGroup)
def wheels():
    """The wheel cache: list, verify and prune the entries of the local wheelhouse; push them to and pull them
    from the remote stores (an OCI registry, a PEP 503 index: [defaults.cache] or --cache-remote).

    \b
    Example:
      builder wheels ls
      builder wheels verify --quarantine
      builder wheels prune --unused --profile all --dry-run
      builder wheels push --engine vllm --cache-remote registry
      builder wheels pull --profile all
    """


@wheels.command("ls")
@flags.matrix
@flags.wheelhouse
@flags.as_json
def wheels_ls(matrix_path, wheelhouse_dir, as_json):
    """Every entry: package, version, key, audited archs, size, where, when built.

    \b
    Example:
      builder wheels ls --json
    """
    from ..cache import inventory

    wh = wheelhouse_at(Path(matrix_path), wheelhouse_dir)
    found = inventory.entries(wh)
    if as_json:
        click.echo(json.dumps([e.to_json() for e in found], indent=2))
        return
    for e in found:
        archs = ",".join(map(str, e.archs)) or "?"
        click.echo(f"{e.package + '==' + e.version:<28} key {e.key[:16]}  sm {archs:<10} {e.bytes / 1e6:9.1f} MB  "
                   f"{e.built_at:<20}  {e.path}")
    click.echo(f"{len(found)} entries in {wh.root}")


@wheels.command("verify")
@flags.matrix
@flags.wheelhouse
@click.option("--quarantine", "move_aside", is_flag=True, help="Move bad entries to wheelhouse/.quarantine/.")
def wheels_verify(matrix_path, wheelhouse_dir, move_aside):
    """Check every entry: each file's sha256 and size against its manifest, then the audit again for the
    archs it was built for. Exit 1 naming the bad ones.

    \b
    Example:
      builder wheels verify
      builder wheels verify --quarantine
    """
    from ..cache import inventory

    wh = wheelhouse_at(Path(matrix_path), wheelhouse_dir)
    bad = 0
    found = inventory.entries(wh)
    for e in found:
        why = inventory.verify(wh, e)
        if not why:
            click.echo(f"ok   {e.package}=={e.version} {e.key[:16]}")
            continue
        bad += 1
        where = inventory.quarantine(wh, e, why) if move_aside else ""
        kept = " (left where it is: builder moves only its own entries)" if move_aside and not where else ""
        click.echo(f"BAD  {e.package}=={e.version} {e.key[:16]}: {why}" + (f" (moved to {where})" if where else kept))
    click.echo(f"{len(found) - bad} of {len(found)} entries verified")
    if bad:
        raise Failed()


@wheels.command("prune")
@flags.selection
@flags.wheelhouse
@click.option("--unused", is_flag=True, help="Remove entries whose key no selected cell uses (select with --profile all).")
@click.option("--older-than", type=flags.Number(0, 100_000, "a number of days"), default=None, help="Remove entries built more than this many days ago.")
@click.option("--leftovers", is_flag=True, help="Remove quarantined entries and temporary directories of dead builds.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def wheels_prune(m, sel, wheelhouse_dir, unused, older_than, leftovers, dry_run):
    """Remove entries no cell needs any more.

    \b
    Example:
      builder wheels prune --unused --profile all --dry-run
      builder wheels prune --older-than 30 --leftovers
    """
    from ..cache import inventory

    if not (unused or older_than is not None or leftovers):
        raise UserError("wheels prune: say what to remove: --unused, --older-than DAYS and/or --leftovers")
    if older_than is not None and not 0 <= older_than <= 100_000:  # NaN fails both comparisons
        raise UserError(f"--older-than: {older_than:g} is not a number of days from 0 to 100000")
    wh = wheelhouse_at(m.path, wheelhouse_dir)
    used = ({k for p in plan_mod.plan_cells(resolve.select(m, sel), None) for w in p.wheels
             for k in w.keys_in_use(p.cell)} if unused else None)
    doomed = [(e.path, why) for e, why in inventory.prunable(wh, used, older_than)]
    if leftovers:
        doomed += [(p, "quarantined or left by an interrupted store") for p in inventory.leftovers(wh)]
    for path, why in doomed:
        click.echo(f"{'would remove' if dry_run else 'remove'} {path}: {why}")
        if not dry_run:
            inventory.remove(path)
    click.echo(f"{len(doomed)} {'would be ' if dry_run else ''}removed")


_key_option = click.option("--key", "keys", multiple=True,
                           help="Move this entry (its key, 8+ leading hex characters, or PACKAGE:KEY) instead of the "
                                "selected cells' wheels; repeatable.")


def _sync_targets(m, sel, cache, keys):
    """What `wheels push` / `wheels pull` move: --key entries, else the selected cells' wheels."""
    from ..cache import sync
    from ..cache.tiered import TieredCache

    if not isinstance(cache, TieredCache):
        raise UserError("no remote wheel store: add remotes to [defaults.cache] in the matrix or pass --cache-remote "
                        "(e.g. --cache-remote registry or --cache-remote index:http://127.0.0.1:8080/simple)")
    if keys:
        known = sync.from_plans(plan_mod.plan_cells(resolve.select(m, matrix_mod.Selection(profiles=("all",))), None))
        return sync.from_keys(keys, cache, known)
    return sync.from_plans(plan_mod.plan_cells(resolve.select(m, sel), None))


@wheels.command("push")
@flags.selection
@flags.wheelhouse
@flags.cache()
@_key_option
@click.option("--force", is_flag=True, help="Push even where a remote already holds a good copy.")
def wheels_push(m, sel, wheelhouse_dir, cache_flags, keys, force):
    """Push wheelhouse entries to every remote store that takes pushes: each file is verified against its
    manifest first, an entry a remote already holds is skipped, and where it went (e.g. the registry
    artifact's digest) is recorded in the local manifest. Exit 1 when a local entry is bad.

    \b
    Example:
      builder wheels push --cache-remote registry                # the default profile's wheels
      builder wheels push --key 3f1c2a9b --cache-remote index:http://127.0.0.1:8080/simple
    """
    from ..cache import sync

    cache = wheel_cache(m, wheelhouse_dir, cache_flags, lambda s: click.echo(s, err=True))
    targets = _sync_targets(m, sel, cache, keys)
    if not any(r.push_enabled for r in cache.remotes):
        raise UserError("wheels push: every selected remote store is pull-only (push = false)")
    pushed, failed = sync.push(cache, targets, force, click.echo)
    click.echo(f"{pushed} pushed, {failed} bad, of {len(targets)} entries")
    if failed:
        raise Failed()


@wheels.command("pull")
@flags.selection
@flags.wheelhouse
@flags.cache()
@_key_option
def wheels_pull(m, sel, wheelhouse_dir, cache_flags, keys):
    """Pull the selected cells' wheels (or --key entries) from the remote stores into the wheelhouse: every
    hash is verified against the manifest before an entry is written. A bad remote copy is reported and left
    where it is. Exit 1 when a remote copy was bad or a --key entry is in no remote.

    \b
    Example:
      builder wheels pull --engine vllm --cache-remote registry
      builder wheels pull --key cuda-ext:3f1c2a9b
    """
    from ..cache import sync

    cache = wheel_cache(m, wheelhouse_dir, cache_flags, lambda s: click.echo(s, err=True))
    targets = _sync_targets(m, sel, cache, keys)
    pulled, missing, bad = sync.pull(cache, targets, click.echo)
    click.echo(f"{pulled} pulled, {missing} in no remote, {bad} bad, of {len(targets)} entries")
    if bad or (keys and missing):
        raise Failed()
