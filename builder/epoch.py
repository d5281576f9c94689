"""SOURCE_DATE_EPOCH for every build, so two builds of the same sources give the same wheels (zip timestamps
included) and image timestamps. Taken, in this order, from:

1. the SOURCE_DATE_EPOCH environment variable (checked: ASCII digits);
2. `defaults.source_date_epoch` in matrix.toml;
3. the time of the last commit of the git repository that holds matrix.toml;
4. a fixed 315532800 (1980-01-01, the earliest time a zip entry can carry) when none of these exists.

`builder plan` prints which one applies. The epoch is not part of a wheel's cache key: it changes the
timestamps inside the zip, not what the wheel does, so a cached wheel stays valid when the repository moves on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import docker, grammar

FALLBACK = 315532800


@dataclass(frozen=True)
class Epoch:
    value: str
    origin: str

    def to_json(self) -> dict:
        return {"value": int(self.value), "from": self.origin}


def resolve(m) -> Epoch:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env is not None:
        n = grammar.check(grammar.source_date_epoch, env, "SOURCE_DATE_EPOCH (environment)")
        return Epoch(str(n), "the SOURCE_DATE_EPOCH environment variable")
    if m.defaults.get("source_date_epoch") is not None:
        return Epoch(str(m.defaults["source_date_epoch"]), f"defaults.source_date_epoch in {m.path.name}")
    repo_dir = m.path.resolve().parent
    stamp = docker.git_last_commit_time(repo_dir)
    if stamp:
        return Epoch(stamp, f"the last commit of the git repository at {repo_dir}")
    return Epoch(str(FALLBACK), f"a fixed default, 1980-01-01: no git repository holds {m.path.name}")
