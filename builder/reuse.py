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

from . import labels, ledger
from .registry_api import ACCEPT, OCI_MANIFEST, Found, Unusable
from .registry_api import Client as RegistryClient
from .registry_api import RegistryPath

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


__all__ = ["ACCEPT", "OCI_MANIFEST", "Client", "Found", "RegistryPath", "Unusable", "merge_and_push",
           "record_tag"]
