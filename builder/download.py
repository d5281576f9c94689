"""Pinned downloads: a wheel a profile takes from the index, through the one streamed-download loop every remote
read of a wheel goes through (builder/net.py `stream_into`, which hashes while it writes; the registry and index
wheel caches use it too). Nothing reaches its final name before its bytes were counted and hashed and matched
the pin."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from . import net, redact
from .errors import BuilderError, EnvironmentProblem
from .pypi import ca_bundle_file

if TYPE_CHECKING:
    import requests  # the caller's session; builder imports requests only where a request is made


def ca_bundle() -> str | bool:
    """What `requests` verifies TLS against: the bundle pip and `builder lock` use, else its default."""
    return ca_bundle_file() or True


class DownloadMismatch(BuilderError):
    """The bytes served are not the ones pinned."""


def fetch_pinned(session: requests.Session, url: str, dest: Path, sha256: str) -> Path:
    """GET `url` into `dest` (a file path) only if its sha256 is the pinned one; nothing is left behind otherwise."""
    from .net import NETWORK_ERRORS

    dest.parent.mkdir(parents=True, exist_ok=True)
    # this process's own part: another builder downloading the same pinned file at once (two builds, two test
    # workers) writes its own, and whichever lands last replaces the other with the same bytes
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        try:
            with session.get(url, stream=True, verify=ca_bundle()) as resp:
                if resp.status_code != 200:
                    raise (EnvironmentProblem if resp.status_code >= 500 else BuilderError)(
                        f"GET {redact.redact(url)} answered HTTP {resp.status_code}")
                digest, size = net.stream_into(resp, part, f"GET {url}")
        except NETWORK_ERRORS as exc:
            raise EnvironmentProblem(redact.redact(f"GET {url}: the index does not answer ({type(exc).__name__}: {exc})")) from None
        if digest != sha256:
            raise DownloadMismatch(f"{dest.name}: the index served {size} bytes with sha256 {digest[:16]}…, "
                                   f"matrix.lock pins {sha256[:16]}…; not used")
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest
