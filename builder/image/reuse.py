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

Who vouches: someone with push rights to the repository can push a record too (as they can push the image), so an
unsigned record is the registry's word only. When CI gives publish a private key (BUILDER_LEDGER_SIGNING_KEY) the
record is a DSSE envelope signed with it (builder/image/signing.py), and where the matrix names the public key
([defaults] ledger_public_key) a record that is unsigned, signed by another key or whose signature does not verify
(an edited payload) is never adopted: said in one line, and the cell is built. Where the matrix names none, reuse
says once per run that it takes the registry's word, and how to sign. Only a signature-verified record may put a
pulled digest into this host's image ledger, and there it is recorded with who vouched (`vouched_by`), apart from
what builder built here.

Everything is read over the registry's HTTP API (requests, builder/net.py deadlines and caps), never by pulling;
credentials come from net.registry_credentials (BUILDER_REGISTRY_USER / _PASSWORD, else the docker login),
Basic or a bearer token as the registry's challenge asks.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import labels, ledger, signing
from ..registry_api import ACCEPT, OCI_MANIFEST, Found, Unusable
from ..registry_api import Client as RegistryClient
from ..registry_api import RegistryPath

RECORD_TAG = "builder-ledger-"  # + the 64-hex content key (79 characters: within a tag's 128)
RECORD_TYPE = signing.PAYLOAD_TYPE  # the manifest's artifact type; an unsigned record's layer
DSSE_TYPE = signing.DSSE_TYPE  # a signed record's layer: the DSSE envelope whose payload is the entry
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"


def record_tag(key: str) -> str:
    return RECORD_TAG + key


class Client(RegistryClient):
    """The registry API calls of a reuse, and builder's ledger record read and pushed."""

    def record(self, repository: str, key: str) -> tuple[ledger.Entry | None, str]:
        """builder's ledger record for `key` in REPOSITORY, signed or not and no signature checked: (entry, "") or
        (None, "") when there is none, or (None, why) when what is there is not a record builder would write."""
        got = self.read_record(repository, key, None)
        return got.entry, got.problem

    def read_record(self, repository: str, key: str, trusted) -> "Record":
        """The record for `key` in REPOSITORY. With `trusted` (the matrix's public key) only a record that key signed
        is adopted (Record.refused says why another is not); without, it is read on the registry's word."""
        where = f"{repository}:{record_tag(key)}"
        got = self.manifest(repository, record_tag(key), accept=OCI_MANIFEST)
        if got is None:
            return Record(None, "")
        doc = json.loads(got[0])
        layers = doc.get("layers")
        if doc.get("artifactType") != RECORD_TYPE or not isinstance(layers, list) or len(layers) != 1 \
                or not isinstance(layers[0], dict) or layers[0].get("mediaType") not in (RECORD_TYPE, DSSE_TYPE) \
                or not isinstance(layers[0].get("digest"), str) \
                or not re.fullmatch(r"sha256:[0-9a-f]{64}", layers[0]["digest"]):
            return Record(None, f"{where} is not a builder ledger record (artifact type, one {RECORD_TYPE} or "
                                f"{DSSE_TYPE} layer)")
        sealed = layers[0]["mediaType"] == DSSE_TYPE
        if trusted is not None and not sealed:
            return Record(None, f"{where} is unsigned", refused=True)
        try:
            raw = self.blob(repository, layers[0]["digest"], ledger.MAX_BYTES * 2)
        except Unusable as exc:
            return Record(None, str(exc))
        signed_by = ""
        if sealed:
            raw, problem, signed_by = signing.unseal(raw, where, trusted)
            if raw is None:
                return Record(None, problem, refused=trusted is not None)
        entry, problem = ledger.parse(raw, where, key)
        return Record(entry, problem, signed_by)

    def push_record(self, repository: str, entry: ledger.Entry, signer=None) -> str:
        """Push `entry` as REPOSITORY:builder-ledger-<key>, signed by `signer` when given (a DSSE envelope); the
        record's manifest digest, read back."""
        data = (json.dumps(entry.to_json(), indent=1, sort_keys=True) + "\n").encode()
        kind = RECORD_TYPE
        if signer is not None:
            data, kind = signing.seal(data, signer), DSSE_TYPE
        layer = self.upload(repository, data)
        self.upload(repository, EMPTY)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": RECORD_TYPE,
                    "config": {"mediaType": EMPTY_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(),
                               "size": len(EMPTY)},
                    "layers": [{"mediaType": kind, "digest": layer, "size": len(data)}],
                    "annotations": {labels.CONTENT_KEY: entry.key}}
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        resp = self.send("PUT", self.url(repository, "manifests", record_tag(entry.key)), repository, push=True,
                          data=body, headers={"Content-Type": OCI_MANIFEST})
        resp.close()
        if resp.status_code != 201:
            raise Unusable(f"{repository}:{record_tag(entry.key)}: pushing the record answered HTTP {resp.status_code}")
        back = self.read_record(repository, entry.key, signer.public_key if signer is not None else None)
        if back.entry is None or back.entry.images != entry.images:
            raise Unusable(f"{repository}:{record_tag(entry.key)}: the record does not read back as pushed"
                           + (f" ({back.problem})" if back.problem else ""))
        return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class Record:
    """A registry's ledger record as read: its entry (None: none there, or `problem`), and the key id whose
    signature verified ("" when none was checked: the registry's word). `refused`: there is a record, but the
    matrix's key did not sign it (unsigned, another key, a signature that does not verify)."""

    entry: ledger.Entry | None
    problem: str
    signed_by: str = ""
    refused: bool = False


def merge_and_push(source: RegistryPath, repository: str, key: str, change, signer=None, trusted=None) -> str:
    """Read the record for `key` in REPOSITORY (a bad one, or with `trusted` one that key did not sign, is replaced),
    apply `change(entry)`, push it back, signed by `signer` when given. Returns a note on a replaced record ("" otherwise);
    raises Unusable when the registry would not take it."""
    if signer is not None:  # only what this very key signed is merged and signed again: never a forged line
        trusted = signer.public_key
    with Client(source) as client:
        got = client.read_record(repository, key, trusted)
        entry = got.entry or ledger.Entry(key)
        change(entry)
        client.push_record(repository, entry, signer)
    if not got.problem:
        return ""
    return (f"replaced a ledger record the matrix's key did not sign ({got.problem})" if got.refused else
            f"replaced an unusable ledger record ({got.problem})")


# -- the one decision: reuse this image, or build ------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """What an image under the cell's tag says of itself: where it was read ("image REF" in the local daemon,
    "registry: REF"), its digest, and the content key its label claims ("" when it has none)."""

    where: str
    digest: str
    key: str


HOST, SIGNED, UNSIGNED = "host", "signed", "unsigned"  # who vouches: this host's ledger, a verified signature, the registry's word


@dataclass(frozen=True)
class Voucher:
    """A ledger entry that may vouch for the claimed key's digests: this host's image ledger, or the record the
    registry keeps beside the image. `missing`: why there is nothing to vouch (an entry ignored, or none), as the
    end of a sentence; `name`: who vouches, for messages; `kind`: HOST, SIGNED (a signature by the matrix's key
    verified) or UNSIGNED (the registry's word: no key named)."""

    entry: ledger.Entry | None
    missing: str
    name: str
    published: bool = False  # the digest must also be recorded as published (publish leaves it in its registry)
    kind: str = HOST


@dataclass(frozen=True)
class Reuse:
    digest: str
    why: str
    vouched_by: str
    kind: str = HOST  # who vouches (Voucher.kind): only a HOST or SIGNED vouch may enter this host's ledger


@dataclass(frozen=True)
class Build:
    why: str  # one line, or "" when there is nothing to say (no image under the tag)


def judge(claim: Claim | None, key: str, voucher: Callable[[str], Voucher]) -> Reuse | Build:
    """Reuse the claimed image (its digest, why, who vouches) or build (why), for a local image and a registry's
    alike. The label alone proves nothing (any image built FROM this one inherits it): the image is this build's
    result when it claims this build's content key and a ledger entry for that key records its digest. `voucher(key)` reads the entry
    only when the claim gets that far."""
    if claim is None:
        return Build("")
    if not claim.key:
        return Build(f"{claim.where} ({claim.digest}) carries no content key (builder did not build it): building")
    if claim.key != key:
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
    name, recorded = v.name, f"its digest is one builder recorded for that key{_by(v)}"
    pulled = v.entry.images[claim.digest].get("vouched_by") if v.kind == HOST else None
    if pulled:  # a digest this host pulled, not built: say on whose word
        name = f"this host's image ledger, which took it on the word of {pulled}"
        recorded = f"its digest is one this host's image ledger took from the registry on the word of {pulled}"
    return Reuse(claim.digest, f"it carries this build's content key and {recorded}", name, v.kind)


def _by(v: Voucher, sep: str = " (") -> str:
    """Who vouches, when it is the registry's record: by its tag, and whose signature (or none) it carries."""
    if v.kind == HOST:
        return ""
    return f" ({v.name})" if sep == " (" else f"; {v.name}"


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


def registry_voucher(client: Client, repository: str, published: bool, trusted=None) -> Callable[[str], Voucher]:
    """The ledger record the registry keeps beside the image (REPOSITORY:builder-ledger-<key>): with `trusted` (the
    matrix's public key) only one that key signed; without, on the registry's word."""
    def read(key: str) -> Voucher:
        record = f"{repository}:{record_tag(key)}"
        got = client.read_record(repository, key, trusted)
        label = " (a label alone is inherited by any image built FROM it)"
        if got.refused:
            return Voucher(None, f"its ledger record {got.problem}: not adopted (only a record signed by the "
                                 f"matrix's {signing.MATRIX_KEY} is)",
                           f"ledger record {record}", kind=SIGNED)
        if got.problem:
            return Voucher(None, f"its ledger record is ignored ({got.problem}){label}", f"ledger record {record}")
        if trusted is not None:
            return Voucher(got.entry, f"there is no ledger record {record}{label}",
                           f"ledger record {record}, signed by key {signing.short(got.signed_by)}", published, SIGNED)
        return Voucher(got.entry, f"there is no ledger record {record}{label}",
                       f"the registry's unsigned record {record}", published, UNSIGNED)
    return read


_TRUST_SAID: set[str] = set()
_TRUST_LOCK = threading.Lock()


def trust_line(registry: str) -> str:
    """Once per run (per registry): that a reuse from `registry` took its unsigned word, and how to sign; "" after."""
    with _TRUST_LOCK:
        if registry in _TRUST_SAID:
            return ""
        _TRUST_SAID.add(registry)
    return (f"registry reuse takes the registry's word: the matrix names no {signing.MATRIX_KEY}, so a ledger record "
            f"in {registry} is not checked for a signature (anyone with push rights there can vouch for an image); "
            f"to require one, {signing.HOW_TO_SIGN}")


__all__ = ["ACCEPT", "HOST", "OCI_MANIFEST", "SIGNED", "UNSIGNED", "Build", "Claim", "Client", "Found", "Record",
           "RegistryPath", "Reuse", "Unusable", "Voucher", "judge", "local_voucher", "merge_and_push", "record_tag",
           "registry_voucher", "trust_line"]
