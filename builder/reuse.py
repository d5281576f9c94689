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

import requests

from . import grammar, labels, ledger, net
from .errors import UserError

RECORD_TAG = "builder-ledger-"  # + the 64-hex content key (79 characters: within a tag's 128)
RECORD_TYPE = "application/vnd.builder.image-ledger.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_BYTES = 4 << 20  # a manifest or an image config; the registry spec caps manifests at 4 MiB


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
    host = registry.split("/")[0]
    creds, origin = net.registry_credentials(host)
    return Source(registry, tls_verify=not net.is_loopback(host), credentials=creds, credentials_from=origin)


class Unusable(Exception):
    """What the registry holds cannot be used for a reuse (said in one line; the cell is built)."""


@dataclass(frozen=True)
class Found:
    """The image a registry serves under a tag, read without pulling it."""

    ref: str  # REPOSITORY:TAG
    digest: str  # sha256 of the manifest (or index) bytes the registry served: what a pull by digest gets
    index: bool
    labels: dict
    size: int = 0  # the bytes of its layers (what a pull may move)
    layers: int = 0


class Client:
    """The few registry API calls a reuse needs, each bounded by net's deadlines and caps. Not retried: a
    registry that does not answer costs the reuse (the cell is built), not the build."""

    def __init__(self, source: Source):
        self.source = source
        self.scheme = "https" if source.tls_verify else "http"
        self.session = net.with_timeouts(requests.Session())
        self._token: str | None = None

    def close(self) -> None:
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport ----------------------------------------------------------------------------------------
    def _send(self, method: str, url: str, repository: str, push: bool = False, **kw) -> requests.Response:
        """One request; a bearer challenge (a token registry, or a token that lacks the push scope) is answered
        once with a token for this repository's scope, then the request is sent again."""
        headers = dict(kw.pop("headers", {}))
        try:
            for attempt in (1, 2):
                sent = {**headers, **({"Authorization": f"Bearer {self._token}"} if self._token else {})}
                resp = self.session.request(method, url, headers=sent, stream=True,
                                            auth=None if self._token else self.source.credentials, **kw)
                challenge = resp.headers.get("WWW-Authenticate", "")
                if resp.status_code != 401 or attempt == 2 or not challenge.lower().startswith("bearer"):
                    break
                resp.close()
                self._token = self._bearer(challenge, repository, push)
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"the registry {self.source.host} did not answer ({_first_line(exc)})") from None
        if resp.status_code in (401, 403):
            resp.close()
            raise Unusable(f"the registry {self.source.host} refused "
                           + (f"the credentials from {self.source.credentials_from}" if self.source.credentials
                              else "an anonymous " + ("push" if push else "read")) + f" (HTTP {resp.status_code})")
        return resp

    def _bearer(self, challenge: str, repository: str, push: bool) -> str:
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise Unusable(f"the registry {self.source.host} asks for a token from no usable realm")
        path = repository.split("/", 1)[1]
        params["scope"] = f"repository:{path}:pull" + (",push" if push else "")
        try:
            resp = self.session.get(realm, params=params, auth=self.source.credentials, stream=True)
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"the registry's token service {realm} did not answer ({_first_line(exc)})") from None
        body = self._read(resp, f"a token from {realm}", 1 << 20)
        if resp.status_code != 200:
            raise Unusable(f"the registry's token service {realm} answered HTTP {resp.status_code}")
        try:
            data = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, RecursionError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise Unusable(f"the registry's token service {realm} answered no token")
        return token

    def _read(self, resp: requests.Response, what: str, limit: int) -> bytes:
        try:
            return net.read_document(resp, what, limit)
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"reading {what}: {_first_line(exc)}") from None
        except net.TooLarge:
            raise Unusable(f"{what} is larger than {limit} bytes") from None
        finally:
            resp.close()

    def _url(self, repository: str, kind: str, ref: str) -> str:
        host, _, path = repository.partition("/")
        return f"{self.scheme}://{host}/v2/{path}/{kind}/{ref}"

    # -- reading ------------------------------------------------------------------------------------------
    def manifest(self, repository: str, ref: str, accept: str = ACCEPT) -> tuple[bytes, str, str] | None:
        """(bytes, media type, digest) of the manifest REPOSITORY serves for REF (a tag or a digest), None when
        it has none. The digest is the sha256 of those very bytes; a registry that names another is refused."""
        resp = self._send("GET", self._url(repository, "manifests", ref), repository, headers={"Accept": accept})
        if resp.status_code == 404:
            resp.close()
            return None
        said = resp.headers.get("Docker-Content-Digest", "")
        kind = resp.headers.get("Content-Type", "").split(";")[0].strip()
        body = self._read(resp, f"the manifest of {repository}:{ref}", MANIFEST_BYTES)
        if resp.status_code != 200:
            raise Unusable(f"{repository}:{ref}: the registry answered HTTP {resp.status_code}")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if said and said != digest:
            raise Unusable(f"{repository}:{ref}: the registry names it {said}, its bytes hash to {digest}")
        if ref.startswith("sha256:") and ref != digest:
            raise Unusable(f"{repository}@{ref}: the registry served bytes that hash to {digest}")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError, UnicodeDecodeError):
            raise Unusable(f"{repository}:{ref}: its manifest is not JSON") from None
        if not isinstance(doc, dict):
            raise Unusable(f"{repository}:{ref}: its manifest is not a JSON object")
        return body, doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else kind, digest

    def blob(self, repository: str, digest: str, limit: int = MANIFEST_BYTES) -> bytes:
        resp = self._send("GET", self._url(repository, "blobs", digest), repository)
        body = self._read(resp, f"blob {digest[:19]}… of {repository}", limit)
        if resp.status_code != 200:
            raise Unusable(f"blob {digest[:19]}… of {repository}: the registry answered HTTP {resp.status_code}")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise Unusable(f"blob {digest[:19]}… of {repository}: the registry served bytes of another digest")
        return body

    def image(self, repository: str, tag: str) -> Found | None:
        """The image under REPOSITORY:TAG — its digest and its config's labels — or None when the tag is not
        there. An index (BuildKit's, with attestations) is read through its one platform image."""
        got = self.manifest(repository, tag)
        if got is None:
            return None
        body, kind, digest = got
        doc = json.loads(body)
        index = kind in INDEXES
        if index:
            images = [d for d in doc.get("manifests") or [] if isinstance(d, dict) and isinstance(d.get("digest"), str)
                      and (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"]
            if len(images) != 1:
                raise Unusable(f"{repository}:{tag} is an index of {len(images)} platform images, not one cell image")
            inner = self.manifest(repository, images[0]["digest"])
            if inner is None:
                raise Unusable(f"{repository}:{tag}: its index names {images[0]['digest']}, which is not there")
            doc = json.loads(inner[0])
        config = doc.get("config")
        if not isinstance(config, dict) or not isinstance(config.get("digest"), str) \
                or not re.fullmatch(r"sha256:[0-9a-f]{64}", config["digest"]):
            raise Unusable(f"{repository}:{tag} is not an image manifest (no config descriptor)")
        try:
            cfg = json.loads(self.blob(repository, config["digest"]))
        except (ValueError, RecursionError, UnicodeDecodeError):
            raise Unusable(f"{repository}:{tag}: its image config is not JSON") from None
        found = (cfg.get("config") or {}).get("Labels") if isinstance(cfg, dict) else None
        found = found if isinstance(found, dict) else {}
        sizes = [l.get("size") for l in doc.get("layers") or [] if isinstance(l, dict)]
        size = sum(n for n in sizes if isinstance(n, int) and n > 0)
        return Found(f"{repository}:{tag}", digest, index, {k: v for k, v in found.items() if isinstance(v, str)},
                     size, len(sizes))

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

    # -- writing ------------------------------------------------------------------------------------------
    def _upload(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        head = self._send("HEAD", self._url(repository, "blobs", digest), repository, push=True)
        head.close()
        if head.status_code == 200:
            return digest
        start = self._send("POST", self._url(repository, "blobs", "uploads/"), repository, push=True)
        start.close()
        location = start.headers.get("Location", "")
        if start.status_code != 202 or not location:
            raise Unusable(f"{repository}: starting a blob upload answered HTTP {start.status_code}")
        if location.startswith("/"):
            location = f"{self.scheme}://{self.source.host}{location}"
        put = self._send("PUT", location, repository, push=True, params={"digest": digest}, data=data,
                         headers={"Content-Type": "application/octet-stream"})
        put.close()
        if put.status_code != 201:
            raise Unusable(f"{repository}: uploading blob {digest[:19]}… answered HTTP {put.status_code}")
        return digest

    def push_record(self, repository: str, entry: ledger.Entry) -> str:
        """Push `entry` as REPOSITORY:builder-ledger-<key>; the record's manifest digest, read back."""
        data = (json.dumps(entry.to_json(), indent=1, sort_keys=True) + "\n").encode()
        layer = self._upload(repository, data)
        self._upload(repository, EMPTY)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": RECORD_TYPE,
                    "config": {"mediaType": EMPTY_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(),
                               "size": len(EMPTY)},
                    "layers": [{"mediaType": RECORD_TYPE, "digest": layer, "size": len(data)}],
                    "annotations": {labels.CONTENT_KEY: entry.key}}
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        resp = self._send("PUT", self._url(repository, "manifests", record_tag(entry.key)), repository, push=True,
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


def _first_line(exc: BaseException) -> str:
    text = net.redact(str(exc)).strip()
    return (text.splitlines()[0][:200] if text else type(exc).__name__)


__all__ = ["Client", "Found", "Source", "Unusable", "make_source", "merge_and_push",
           "record_tag"]
