"""An unchanged cell from a registry: the image a registry serves under the cell's tag is this build's result
when it carries this build's content key AND its manifest digest is one builder recorded for that key — so a
fresh machine (an empty daemon, an empty wheelhouse: every CI runner) pulls it instead of building it.

The label alone proves nothing: any image built `FROM` the cell's image, or given a copied
content-key label, carries it. The digest cannot be copied. So the ledger entry that binds key and
digests (builder/image/ledger.py, the same JSON, read through the same checks) travels with the image, as a small
OCI artifact in the image's own repository, under a tag named by the key:

    REGISTRY/ENGINE:<cell tag>                       the image (publish pushes it)
    REGISTRY/ENGINE:builder-ledger-<content key>     its ledger record: one layer, the ledger entry's JSON

Whoever can read the image can read its record, with the same credentials; nothing else needs to be shared
between runners. `builder publish` pushes the record (merged with the one already there) before it pushes the
image, and again with the pushed tag after. A reader checks: the tag's manifest bytes hash to the digest the
registry names, the image config's label is the key, the record's manifest and blob hash to their digests, the
record fits the ledger's shape and names that key, and the tag's digest is among the record's images. Anything
else — a moved tag, a derived image, a tampered or corrupt record — is said in one line, and the cell is built.
What this does not stop: someone with push rights to the repository can push a record too (as they can push the
image); the record binds digests, it does not sign them.

Everything is read over the registry's HTTP API (requests, builder/net.py deadlines and caps), never by pulling;
credentials come from net.registry_credentials (BUILDER_REGISTRY_USER / _PASSWORD, else the docker login),
Basic or a bearer token as the registry's challenge asks.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import pins
from . import labels, ledger
from ..registry_api import ACCEPT, OCI_MANIFEST, Found, Unusable
from ..registry_api import Client as RegistryClient
from ..registry_api import RegistryPath

RECORD_TAG = "builder-ledger-"  # + the 64-hex content key (79 characters: within a tag's 128)
RECORD_TYPE = "application/vnd.builder.image-ledger.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"


def record_tag(key: str) -> str:
    return RECORD_TAG + key


class Client(RegistryClient):
    """The registry API calls of a reuse, and builder's ledger record read and pushed."""

    def record(self, repository: str, key: str) -> tuple[ledger.Entry | None, str]:
        """builder's ledger record for `key` in REPOSITORY: (entry, "") or (None, "") when there is none, or
        (None, why) when what is there is not a record builder would write for that key."""
        where = f"{repository}:{record_tag(key)}"
        got = self.manifest(repository, record_tag(key), accept=OCI_MANIFEST)
        if got is None:
            return None, ""
        doc = json.loads(got[0])
        layers = doc.get("layers")
        if doc.get("artifactType") != RECORD_TYPE or not isinstance(layers, list) or len(layers) != 1 \
                or not isinstance(layers[0], dict) or layers[0].get("mediaType") != RECORD_TYPE \
                or not isinstance(layers[0].get("digest"), str) \
                or not re.fullmatch(r"sha256:[0-9a-f]{64}", layers[0]["digest"]):
            return None, f"{where} is not a builder ledger record (artifact type, one {RECORD_TYPE} layer)"
        try:
            raw = self.blob(repository, layers[0]["digest"], ledger.MAX_BYTES)
        except Unusable as exc:
            return None, str(exc)
        return ledger.parse(raw, where, key)

    def push_record(self, repository: str, entry: ledger.Entry) -> str:
        """Push `entry` as REPOSITORY:builder-ledger-<key>; the record's manifest digest, read back."""
        data = (json.dumps(entry.to_json(), indent=1, sort_keys=True) + "\n").encode()
        layer = self.upload(repository, data)
        self.upload(repository, EMPTY)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": RECORD_TYPE,
                    "config": {"mediaType": EMPTY_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(),
                               "size": len(EMPTY)},
                    "layers": [{"mediaType": RECORD_TYPE, "digest": layer, "size": len(data)}],
                    "annotations": {labels.CONTENT_KEY: entry.key}}
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        resp = self.send("PUT", self.url(repository, "manifests", record_tag(entry.key)), repository, push=True,
                          data=body, headers={"Content-Type": OCI_MANIFEST})
        resp.close()
        if resp.status_code != 201:
            raise Unusable(f"{repository}:{record_tag(entry.key)}: pushing the record answered HTTP {resp.status_code}")
        back, problem = self.record(repository, entry.key)
        if back is None or back.images != entry.images:
            raise Unusable(f"{repository}:{record_tag(entry.key)}: the record does not read back as pushed"
                           + (f" ({problem})" if problem else ""))
        return "sha256:" + hashlib.sha256(body).hexdigest()


def merge_and_push(source: RegistryPath, repository: str, key: str, change) -> str:
    """Read the record for `key` in REPOSITORY (a bad one is replaced), apply `change(entry)`, push it back.
    Returns a note on a replaced record ("" otherwise); raises Unusable when the registry would not take it."""
    with Client(source) as client:
        entry, problem = client.record(repository, key)
        entry = entry or ledger.Entry(key)
        change(entry)
        client.push_record(repository, entry)
    return f"replaced an unusable ledger record ({problem})" if problem else ""


# -- the one decision: reuse this image, or build ------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """What an image under the cell's tag says of itself: where it was read ("image REF" in the local daemon,
    "registry: REF"), its digest, and the content key its label claims ("" when it has none)."""

    where: str
    digest: str
    key: str


@dataclass(frozen=True)
class Voucher:
    """A ledger entry that may vouch for the claimed key's digests: this host's image ledger, or the record the
    registry keeps beside the image. `missing`: why there is nothing to vouch (an entry ignored, or none), as the
    end of a sentence; `name`: who vouches, for messages."""

    entry: ledger.Entry | None
    missing: str
    name: str
    published: bool = False  # the digest must also be recorded as published (publish leaves it in its registry)


@dataclass(frozen=True)
class Reuse:
    digest: str
    why: str
    vouched_by: str


@dataclass(frozen=True)
class Build:
    why: str  # one line, or "" when there is nothing to say (no image under the tag)


def judge(claim: Claim | None, key: str, first_key: str, pins_file: Path | None,
          voucher: Callable[[str], Voucher]) -> Reuse | Build:
    """Reuse the claimed image (its digest, why, who vouches) or build (why), for a local image and a registry's
    alike. The label alone proves nothing (any image built FROM this one inherits it): the image is this build's
    result when it claims this build's content key (or its first build's, whose runtime pins `pins_file` says were
    read from that very digest), and a ledger entry for that key records its digest. `voucher(key)` reads the entry
    only when the claim gets that far."""
    if claim is None:
        return Build("")
    if not claim.key:
        return Build(f"{claim.where} ({claim.digest}) carries no content key (builder did not build it): building")
    if claim.key not in (key, first_key):
        return Build(f"{claim.where} was built from other inputs (content key {claim.key[:16]}…, this build's "
                     f"{key[:16]}…): building")
    v = voucher(claim.key)
    if v.entry is None:
        return Build(f"{claim.where} carries content key {claim.key} but {v.missing}: building")
    vouched, why = ledger.vouches(v.entry, claim.digest)
    if not vouched:
        return Build(f"{claim.where} carries content key {claim.key} but {why}{_by(v)}: building")
    if v.published and claim.digest not in v.entry.published.values():
        return Build(f"{claim.where} ({claim.digest}) is recorded as built for content key {claim.key} but not as "
                     f"published (so its smoke is not known to have passed{_by(v, ';')}): building")
    if claim.key == key:
        return Reuse(claim.digest, f"it carries this build's content key and its digest is one builder recorded for "
                                   f"that key{_by(v)}", v.name)
    if not pins_read_from(pins_file, claim.digest, claim.key):
        return Build(f"{claim.where} carries the content key of this cell's first build, but "
                     f"{pins_file.name if pins_file else 'the pins file'} was not read from it ({claim.digest}) or its "
                     "pin lines changed since: building")
    return Reuse(claim.digest, f"its content key is this build's without the runtime pins, which {pins_file.name} says "
                               f"were read from this very image, and its digest is one builder recorded for that key"
                               f"{_by(v)}", v.name)


def _by(v: Voucher, sep: str = " (") -> str:
    """Who vouches, in the words the messages have always used: the registry's record by its tag."""
    if not v.name.startswith("ledger record "):
        return ""
    return f" ({v.name})" if sep == " (" else f"; {v.name}"


def pins_read_from(pins_file: Path | None, digest: str, key: str) -> bool:
    """Whether the runtime pins file was read from image `digest` of content key `key` (the cell's first build,
    which resolved the pins this build installs: its key was this build's without the pins file), lines
    unchanged."""
    return bool(pins_file and pins_file.is_file()) and pins.origin(pins_file.read_text()) == (digest, key)


def local_voucher(image_ledger: Path) -> Callable[[str], Voucher]:
    """This host's image ledger (<wheelhouse>/.images): what builder built here."""
    def read(key: str) -> Voucher:
        book = ledger.Ledger(image_ledger)
        entry, problem = book.read(key)
        if problem:
            return Voucher(None, f"its ledger entry is ignored ({problem})", "this host's image ledger")
        return Voucher(entry, f"builder recorded no image for it ({book.path(key)} does not exist)",
                       "this host's image ledger")
    return read


def registry_voucher(client: Client, repository: str, published: bool) -> Callable[[str], Voucher]:
    """The ledger record the registry keeps beside the image (REPOSITORY:builder-ledger-<key>)."""
    def read(key: str) -> Voucher:
        record = f"{repository}:{record_tag(key)}"
        entry, problem = client.record(repository, key)
        label = " (a label alone is inherited by any image built FROM it)"
        if problem:
            return Voucher(None, f"its ledger record is ignored ({problem}){label}", f"ledger record {record}")
        return Voucher(entry, f"there is no ledger record {record}{label}", f"ledger record {record}", published)
    return read


__all__ = ["ACCEPT", "OCI_MANIFEST", "Build", "Claim", "Client", "Found", "RegistryPath", "Reuse", "Unusable",
           "Voucher", "judge", "local_voucher", "merge_and_push", "record_tag", "registry_voucher"]
