"""An unchanged cell from a registry: the image a registry serves under the cell's tag is this build's result
when it carries this build's content key AND its manifest digest is one builder recorded for that key — so a
fresh machine (an empty daemon, an empty wheelhouse: every CI runner) pulls it instead of building it.

The label alone proves nothing: any image built `FROM` the cell's image, or given a copied
content-key label, carries it. The digest cannot be copied. So the ledger entry that binds key and
digests (builder/ledger.py, the same JSON, read through the same checks) travels with the image, as a small
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
from dataclasses import dataclass, field

from . import grammar, labels, ledger
from .registry_api import ACCEPT, OCI_MANIFEST, Found, Unusable
from .registry_api import Client as RegistryClient
from .registry_api import endpoint
from .errors import UserError

RECORD_TAG = "builder-ledger-"  # + the 64-hex content key (79 characters: within a tag's 128)
RECORD_TYPE = "application/vnd.builder.image-ledger.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"


def record_tag(key: str) -> str:
    return RECORD_TAG + key


@dataclass(frozen=True)
class Source:
    """A registry path whose ENGINE repositories hold builder's images: REGISTRY/ENGINE:TAG."""

    registry: str  # HOST[:PORT]/PATH
    tls_verify: bool = True
    credentials: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    credentials_from: str = ""

    @property
    def host(self) -> str:
        return self.registry.split("/")[0]

    def repository(self, engine: str) -> str:
        return f"{self.registry}/{engine}"


def make_source(value: str, flag: str = "--reuse-from") -> Source:
    """A Source for HOST[:PORT]/PATH (checked as publish's --registry is), with the credentials the environment
    or docker login has for its host; plain HTTP only for a loopback registry."""
    registry = re.sub(r"^(docker|https?)://", "", value).rstrip("/")
    if not registry:
        raise UserError(f"{flag}: empty; give HOST[:PORT]/PATH (images are read from PATH/<engine>:<tag>)")
    if "@" in registry.split("/")[0]:
        raise UserError(f"{flag}: put no credentials in it; use BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD "
                        "or docker login")
    grammar.check(grammar.image_name, f"{registry}/x", flag)
    port = re.fullmatch(r"(?:\[[0-9a-fA-F:]+\]|[^:/]+)(?::([0-9]+))?", registry.split("/")[0])
    if port and port.group(1) and not 0 < int(port.group(1)) < 65536:
        raise UserError(f"{flag}: {registry!r}: port {port.group(1)} is out of range (1-65535)")
    if "/" not in registry:
        raise UserError(f"{flag}: {registry!r}: give HOST[:PORT]/PATH (images are read from PATH/<engine>:<tag>)")
    at = endpoint(registry.split("/")[0])
    return Source(registry, tls_verify=at.tls_verify, credentials=at.credentials, credentials_from=at.credentials_from)


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


def merge_and_push(source: Source, repository: str, key: str, change) -> str:
    """Read the record for `key` in REPOSITORY (a bad one is replaced), apply `change(entry)`, push it back.
    Returns a note on a replaced record ("" otherwise); raises Unusable when the registry would not take it."""
    with Client(source) as client:
        entry, problem = client.record(repository, key)
        entry = entry or ledger.Entry(key)
        change(entry)
        client.push_record(repository, entry)
    return f"replaced an unusable ledger record ({problem})" if problem else ""


__all__ = ["ACCEPT", "OCI_MANIFEST", "Client", "Found", "Source", "Unusable", "make_source", "merge_and_push",
           "record_tag"]
