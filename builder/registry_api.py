"""The registry's HTTP API, the few calls builder makes without docker: a manifest (its bytes hashed to the
digest the registry names), a blob (hashed to its digest), an image's config and labels through its manifest or
its index, and a blob or manifest pushed. Every call is bounded by builder/net.py's deadlines and caps; a
registry that asks for it gets Basic credentials or, after a bearer challenge, a token for the repository's
pull (or pull+push) scope. Used by the build (builder/image/reuse.py: an unchanged cell from the registry) and the
deployer's side (builder/deploy/subject.py: an image read without pulling it)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import net, redact

if TYPE_CHECKING:
    import requests

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_BYTES = 4 << 20  # a manifest or an image config; the registry spec caps manifests at 4 MiB


@dataclass(frozen=True)
class Endpoint:
    """A registry host and how to reach it: TLS or not, and the credentials given for that host."""

    host: str
    tls_verify: bool = True
    credentials: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    credentials_from: str = ""


def endpoint(host: str, given: bool = False) -> Endpoint:
    """The host with the credentials the environment or docker login has for it; plain HTTP only on loopback.
    `given`: the command was given this registry as its own (net.env_credentials_apply)."""
    creds, origin = net.registry_credentials(host, given)
    return Endpoint(host, tls_verify=not net.is_loopback(host), credentials=creds, credentials_from=origin)


@dataclass(frozen=True)
class RegistryPath:
    """HOST[:PORT]/PATH, where builder's images live (PATH/<engine>:<tag>): publish's --registry, build's
    --reuse-from, the matrix's defaults.registry. Parsed here only; it carries the one Endpoint of its host, so a
    Client takes it as it takes an Endpoint."""

    path: str  # HOST[:PORT]/PATH, no scheme, no trailing slash
    endpoint: Endpoint
    # credentials not read yet (a registry builder asks on its own, by default): `with_credentials` reads them when
    # the registry is first asked, so that an unreadable docker login costs that read, not the whole command
    deferred: bool | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, value: str, flag: str, role: str = "images go to PATH/<engine>:<tag>",
              given: bool | str = True, credentials: bool = True) -> RegistryPath:
        """`value` checked (an optional docker:// or http(s):// prefix dropped), with its host's endpoint; UserError
        naming `flag` otherwise. `given`: the registry is the command's own (BUILDER_REGISTRY_USER / _PASSWORD may
        apply to it: net.env_credentials_apply); a host (str): its own only when it is that host."""
        from .errors import UserError
        from .redact import describe
        from .imageref import ImageRef

        path = re.sub(r"^(docker|https?)://", "", value).rstrip("/")
        if not path:
            raise UserError(f"{flag}: empty; give HOST[:PORT]/PATH ({role})")
        if "@" in path.split("/")[0]:
            raise UserError(f"{flag}: put no credentials in it; use BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD "
                            "or docker login")
        if "/" not in path:
            raise UserError(f"{flag}: {describe(path)}: give HOST[:PORT]/PATH ({role})")
        ref = ImageRef.parse(f"{path}/x", flag)
        if not ref.registry:
            raise UserError(f"{flag}: {describe(path)}: {describe(path.split('/')[0])} is not a registry host (HOST[:PORT]/PATH, e.g. "
                            f"127.0.0.1:5000/builder; {role})")
        port = re.fullmatch(r"(?:\[[0-9a-fA-F:]+\]|[^:/]+)(?::([0-9]+))?", ref.registry)
        if port and port.group(1) and not 0 < int(port.group(1)) < 65536:
            raise UserError(f"{flag}: {describe(path)}: port {port.group(1)} is out of range (1-65535)")
        own = net.same_host(ref.registry, given) if isinstance(given, str) else given
        if not credentials:
            return cls(path, Endpoint(ref.registry, tls_verify=not net.is_loopback(ref.registry)), deferred=own)
        return cls(path, endpoint(ref.registry, own))

    def with_credentials(self) -> RegistryPath:
        """This path with its host's credentials read (a deferred one), itself otherwise; raises what reading them
        raises (an unreadable docker login)."""
        if self.deferred is None:
            return self
        return RegistryPath(self.path, endpoint(self.host, self.deferred))

    # a Client reads these four as it reads an Endpoint's
    @property
    def host(self) -> str:
        return self.endpoint.host

    @property
    def tls_verify(self) -> bool:
        return self.endpoint.tls_verify

    @property
    def credentials(self) -> tuple[str, str] | None:
        return self.endpoint.credentials

    @property
    def credentials_from(self) -> str:
        return self.endpoint.credentials_from

    def repository(self, engine: str) -> str:
        return f"{self.path}/{engine}"


class Unusable(Exception):
    """What the registry holds cannot be used for a reuse (said in one line; the cell is built), or read by a
    deployer; `cause` says which kind of failure it is (CAUSES), the message says it in words."""

    def __init__(self, message: str, cause: str = "shape"):
        super().__init__(message)
        self.cause = cause


CAUSES = {  # Unusable.cause → what it means, for a deployer's one line
    "credentials": "access refused (credentials)",
    "timeout": "the registry did not answer in time",
    "unreachable": "the registry cannot be reached",
    "redirects": "the registry redirects in a loop",
    "http": "the registry answered an HTTP error",
    "server": "the registry failed (HTTP 5xx)",
    "digest": "the registry's bytes do not match their digest",
    "too-large": "the registry's answer is too large",
    "not-json": "the registry's answer is not JSON",
    "shape": "the registry's answer has the wrong shape",
}


def _network_cause(exc: BaseException) -> str:
    import requests

    if isinstance(exc, requests.TooManyRedirects):
        return "redirects"
    if isinstance(exc, (net.TooSlow, requests.Timeout)):
        return "timeout"
    return "unreachable" if isinstance(exc, requests.ConnectionError) else "timeout"


def _status_cause(code: int) -> str:
    return "server" if code >= 500 else "credentials" if code in (401, 403) else "http"


def _noun(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _field(doc: dict, key: str, kind: type, what: str, required: bool = True):
    """doc[key] when it is of `kind` (absent: None, or refused when `required`); refused in one line naming the
    field and what it is instead."""
    if key not in doc or (doc[key] is None and not required):
        if required:
            raise Unusable(f"{what}: no {key}", "shape")
        return None
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        want = {dict: "an object", list: "a list", str: "a string", int: "a number"}[kind]
        raise Unusable(f"{what}: {key} is {_noun(value)}, not {want}", "shape")
    return value


@dataclass(frozen=True)
class Found:
    """The image a registry serves under a tag, read without pulling it."""

    ref: str  # REPOSITORY:TAG
    digest: str  # sha256 of the manifest (or index) bytes the registry served: what a pull by digest gets
    index: bool
    labels: dict
    size: int = 0  # the bytes of its layers (what a pull may move)
    layers: int = 0
    config: dict = field(default_factory=dict, repr=False, compare=False)  # the whole image config
    platform_digest: str = ""  # the platform image's manifest (the digest itself when it is no index)
    layer_digests: tuple[str, ...] = ()


class Client:
    """The registry API calls, each bounded by net's deadlines and caps. Not retried: a registry that does not
    answer costs what asked (a reuse: the cell is built; a deployer's read: the next place to look)."""

    def __init__(self, source: Endpoint | RegistryPath):
        import requests  # here, not at the top: a run refused before its first request does not pay for it

        self.source = source
        self.scheme = "https" if source.tls_verify else "http"
        self.session = net.without_netrc(net.with_timeouts(requests.Session()))
        self._token: str | None = None
        self._basic = False  # the host answered a Basic challenge: its credentials go with every later request
        self._token_with_credentials = False

    def close(self) -> None:
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport ----------------------------------------------------------------------------------------
    def send(self, method: str, url: str, repository: str, push: bool = False, **kw) -> requests.Response:
        """One request. Nothing is sent before the registry asks: the first request goes anonymously; a Basic
        challenge (401) is answered once with this host's credentials (and later requests carry them, the host
        having asked), a bearer challenge (a token registry, or a token that lacks the push scope) once with a
        token for this repository's scope (`_bearer`), then the request is sent again."""
        headers = dict(kw.pop("headers", {}))
        try:
            for attempt in (1, 2):
                sent = {**headers, **({"Authorization": f"Bearer {self._token}"} if self._token else {})}
                resp = self.session.request(method, url, headers=sent, stream=True,
                                            auth=self.source.credentials if self._basic and not self._token else None,
                                            **kw)
                challenge = resp.headers.get("WWW-Authenticate", "")
                scheme = challenge.split(" ", 1)[0].lower()
                if resp.status_code != 401 or attempt == 2:
                    break
                if scheme == "bearer":
                    resp.close()
                    self._token = self._bearer(challenge, repository, push)
                elif scheme == "basic" and self.source.credentials and not self._basic and not self._token:
                    resp.close()
                    self._basic = True
                else:
                    break
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"the registry {self.source.host} did not answer ({first_line(exc)})", _network_cause(exc)) \
                from None
        if resp.status_code in (401, 403):
            resp.close()
            sent_creds = self.source.credentials and (self._basic or self._token_with_credentials)
            raise Unusable(f"the registry {self.source.host} refused "
                           + (f"the credentials from {self.source.credentials_from}" if sent_creds
                              else "an anonymous " + ("push" if push else "read")) + f" (HTTP {resp.status_code})",
                           "credentials")
        return resp

    def _bearer(self, challenge: str, repository: str, push: bool) -> str:
        """A token from the challenge's realm. The host's credentials go with the token request only to a realm on
        this very host, or on another host over https; a realm on another host over plain http gets an anonymous
        token request (the credentials would cross the network in the clear to someone else)."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise Unusable(f"the registry {self.source.host} asks for a token from no usable realm", "shape")
        path = repository.split("/", 1)[1]
        params["scope"] = f"repository:{path}:pull" + (",push" if push else "")
        creds = None if realm_trusted(challenge, self.source.host) else self.source.credentials
        self._token_with_credentials = creds is not None
        try:
            resp = self.session.get(realm, params=params, auth=creds, stream=True, allow_redirects=False)
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"the registry's token service {realm} did not answer ({first_line(exc)})",
                           _network_cause(exc)) from None
        body = self.read(resp, f"a token from {realm}", 1 << 20)
        if resp.status_code in (401, 403):
            raise Unusable(f"the registry's token service {realm} refused "
                           + (f"the credentials from {self.source.credentials_from}" if creds else "an anonymous token request")
                           + f" (HTTP {resp.status_code})", "credentials")
        if resp.status_code != 200:
            raise Unusable(f"the registry's token service {realm} answered HTTP {resp.status_code}", _status_cause(resp.status_code))
        try:
            data = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, RecursionError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise Unusable(f"the registry's token service {realm} answered no token", "shape")
        return token

    def read(self, resp: requests.Response, what: str, limit: int) -> bytes:
        try:
            return net.read_document(resp, what, limit)
        except (*net.NETWORK_ERRORS, net.TooSlow) as exc:
            raise Unusable(f"reading {what}: {first_line(exc)}", _network_cause(exc)) from None
        except net.TooLarge:
            raise Unusable(f"{what} is larger than {limit} bytes", "too-large") from None
        finally:
            resp.close()

    def url(self, repository: str, kind: str, ref: str) -> str:
        host, _, path = repository.partition("/")
        return f"{self.scheme}://{host}/v2/{path}/{kind}/{ref}"

    # -- reading ------------------------------------------------------------------------------------------
    def manifest(self, repository: str, ref: str, accept: str = ACCEPT) -> tuple[bytes, str, str] | None:
        """(bytes, media type, digest) of the manifest REPOSITORY serves for REF (a tag or a digest), None when
        it has none. The digest is the sha256 of those very bytes; a registry that names another is refused."""
        resp = self.send("GET", self.url(repository, "manifests", ref), repository, headers={"Accept": accept})
        if resp.status_code == 404:
            resp.close()
            return None
        said = resp.headers.get("Docker-Content-Digest", "")
        kind = resp.headers.get("Content-Type", "").split(";")[0].strip()
        body = self.read(resp, f"the manifest of {repository}:{ref}", MANIFEST_BYTES)
        if resp.status_code != 200:
            raise Unusable(f"{repository}:{ref}: the registry answered HTTP {resp.status_code}",
                           _status_cause(resp.status_code))
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if said and said != digest:
            raise Unusable(f"{repository}:{ref}: the registry names it {said[:80]}, its bytes hash to {digest}", "digest")
        if ref.startswith("sha256:") and ref != digest:
            raise Unusable(f"{repository}@{ref}: the registry served bytes that hash to {digest}", "digest")
        doc = _json_object(body, f"{repository}:{ref}: its manifest")
        media = doc.get("mediaType")
        return body, media if isinstance(media, str) else kind, digest

    def digest(self, repository: str, ref: str) -> str | None:
        """The digest REPOSITORY serves for REF (a tag or a digest): the sha256 of its manifest's exact bytes;
        None when it has none."""
        got = self.manifest(repository, ref)
        return None if got is None else got[2]

    def blob(self, repository: str, digest: str, limit: int = MANIFEST_BYTES) -> bytes:
        resp = self.send("GET", self.url(repository, "blobs", digest), repository)
        body = self.read(resp, f"blob {digest[:19]}… of {repository}", limit)
        if resp.status_code != 200:
            raise Unusable(f"blob {digest[:19]}… of {repository}: the registry answered HTTP {resp.status_code}",
                           _status_cause(resp.status_code))
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise Unusable(f"blob {digest[:19]}… of {repository}: the registry served bytes of another digest", "digest")
        return body

    def open_blob(self, repository: str, digest: str) -> requests.Response:
        """A blob's response, to be read as a stream (and closed) by the caller: a snapshot's GBs."""
        resp = self.send("GET", self.url(repository, "blobs", digest), repository)
        if resp.status_code != 200:
            resp.close()
            raise Unusable(f"{repository}: blob {digest[:19]}… answered HTTP {resp.status_code}",
                           _status_cause(resp.status_code))
        return resp

    def image(self, repository: str, tag: str, platform: str | None = None) -> Found | None:
        """The image under REPOSITORY:TAG — its digest and its config's labels — or None when the tag is not
        there. An index (BuildKit's, with attestations) is read through its one platform image; with `platform`
        (e.g. "linux/amd64") an index of several is read through that one (else its first). Whatever the registry
        answers that is not an image of this shape is Unusable, in one line naming the field (never another
        exception: a reuse then builds, a deployer is told why)."""
        try:
            return self._image(repository, tag, platform)
        except Unusable:
            raise
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as exc:
            raise Unusable(f"{repository}:{tag}: the registry's answer has an unexpected shape ({first_line(exc)})",
                           "shape") from None

    def _image(self, repository: str, tag: str, platform: str | None) -> Found | None:
        got = self.manifest(repository, tag)
        if got is None:
            return None
        body, kind, digest = got
        doc = _json_object(body, f"{repository}:{tag}: its manifest")
        index = kind in INDEXES or ("manifests" in doc and "config" not in doc)
        if index:
            what = f"{repository}:{tag}: index"
            listed = _descriptors(doc, what, ("annotations", "platform"))
            images = [d for d in listed
                      if (d.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest"]
            if len(images) > 1 and platform:
                images = [pick(images, platform)]
            if len(images) != 1:
                raise Unusable(f"{repository}:{tag} is an index of {len(images)} platform images, not one cell image",
                               "shape")
            inner = self.manifest(repository, images[0]["digest"])
            if inner is None:
                raise Unusable(f"{repository}:{tag}: its index names {images[0]['digest']}, which is not there", "http")
            doc = _json_object(inner[0], f"{repository}@{images[0]['digest']}: its manifest")
        what = f"{repository}:{tag}: manifest"
        if "config" not in doc:
            raise Unusable(f"{repository}:{tag} is not an image manifest (no config descriptor)", "shape")
        config = _field(doc, "config", dict, what)
        config_digest = _digest_field(config, f"{what}: config")
        layers = _field(doc, "layers", list, what, required=False) or []
        for i, layer in enumerate(layers):
            if not isinstance(layer, dict):
                raise Unusable(f"{what}: layers[{i}] is {_noun(layer)}, not an object", "shape")
        cfg = _json_object(self.blob(repository, config_digest), f"{repository}:{tag}: its image config")
        what = f"{repository}:{tag}: image config"
        inner_cfg = _field(cfg, "config", dict, what, required=False) or {}
        found = _field(inner_cfg, "Labels", dict, f"{what}: config", required=False) or {}
        sizes = [layer.get("size") for layer in layers]
        size = sum(n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0)
        return Found(f"{repository}:{tag}", digest, index, {k: v for k, v in found.items() if isinstance(v, str)},
                     size, len(sizes), cfg, images[0]["digest"] if index else digest,
                     tuple(str(layer.get("digest", "")) for layer in layers))

    # -- writing ------------------------------------------------------------------------------------------
    def upload(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        return self._upload(repository, digest, data)

    def upload_file(self, repository: str, path: Path, digest: str, size: int) -> str:
        """A blob from a file, streamed (a GB-sized one is never in memory); `digest` and `size` its own."""
        with path.open("rb") as f:
            return self._upload(repository, digest, f, {"Content-Length": str(size)})

    def _upload(self, repository: str, digest: str, data, headers: dict | None = None) -> str:
        head = self.send("HEAD", self.url(repository, "blobs", digest), repository, push=True)
        head.close()
        if head.status_code == 200:
            return digest
        start = self.send("POST", self.url(repository, "blobs", "uploads/"), repository, push=True)
        start.close()
        location = start.headers.get("Location", "")
        if start.status_code != 202 or not location:
            raise Unusable(f"{repository}: starting a blob upload answered HTTP {start.status_code}")
        if location.startswith("/"):
            location = f"{self.scheme}://{self.source.host}{location}"
        put = self.send("PUT", location, repository, push=True, params={"digest": digest}, data=data,
                         headers={"Content-Type": "application/octet-stream", **(headers or {})})
        put.close()
        if put.status_code != 201:
            raise Unusable(f"{repository}: uploading blob {digest[:19]}… answered HTTP {put.status_code}")
        return digest


    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> dict[str, str]:
        """PUT a manifest (or index) under REF (a tag, or its own digest); the registry's answer headers. The registry
        must name the digest of these very bytes."""
        resp = self.send("PUT", self.url(repository, "manifests", ref), repository, push=True, data=body,
                         headers={"Content-Type": media_type})
        resp.close()
        if resp.status_code != 201:
            raise Unusable(f"{repository}:{ref}: pushing a manifest answered HTTP {resp.status_code}",
                           _status_cause(resp.status_code))
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        said = resp.headers.get("Docker-Content-Digest", "")
        if said and said != digest:
            raise Unusable(f"{repository}:{ref}: the registry names the pushed manifest {said[:80]}, not {digest}",
                           "digest")
        return dict(resp.headers)

    def referrers(self, repository: str, digest: str) -> tuple[list[dict], str]:
        """The manifests that name `digest` as their subject, and how they were found: ("api") the registry's
        referrers API (OCI distribution 1.1), or ("tag") the referrers tag schema, REPOSITORY:sha256-<hex>, an index
        clients keep where the registry has no API (distribution 2.8 answers the API with 404)."""
        resp = self.send("GET", self.url(repository, "referrers", digest), repository, headers={"Accept": OCI_INDEX})
        kind = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if resp.status_code == 200 and kind == OCI_INDEX:
            doc = _json_object(self.read(resp, f"the referrers of {repository}@{digest}", MANIFEST_BYTES),
                               f"{repository}: referrers of {digest}")
            return _descriptors(doc, f"{repository}: referrers of {digest}"), "api"
        resp.close()
        got = self.manifest(repository, referrers_tag(digest), accept=OCI_INDEX)
        if got is None:
            return [], "tag"
        doc = _json_object(got[0], f"{repository}:{referrers_tag(digest)}")
        return _descriptors(doc, f"{repository}:{referrers_tag(digest)}"), "tag"


def referrers_tag(digest: str) -> str:
    """The referrers tag schema's tag for `digest` (OCI distribution 1.1): sha256:<hex> -> sha256-<hex>."""
    return digest.replace(":", "-", 1)


def _descriptors(doc: dict, what: str, objects: tuple[str, ...] = ("annotations",)) -> list[dict]:
    """The `manifests` of an index, each an object with a digest (and `objects`, where present, objects)."""
    listed = _field(doc, "manifests", list, what)
    for i, d in enumerate(listed):
        if not isinstance(d, dict):
            raise Unusable(f"{what}: manifests[{i}] is {_noun(d)}, not an object", "shape")
        _digest_field(d, f"{what}: manifests[{i}]")
        for key in objects:
            _field(d, key, dict, f"{what}: manifests[{i}]", required=False)
    return listed


def _json_object(body: bytes, what: str) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise Unusable(f"{what} is not JSON", "not-json") from None
    if not isinstance(doc, dict):
        raise Unusable(f"{what} is {_noun(doc)}, not a JSON object", "shape")
    return doc


def _digest_field(descriptor: dict, what: str) -> str:
    value = _field(descriptor, "digest", str, what)
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        raise Unusable(f"{what}: digest is not sha256:<64 hex digits>", "shape")
    return value


def realm_trusted(challenge: str, host: str) -> str:
    """"" when a bearer challenge's token realm may see `host`'s credentials (a realm on that very host, or any
    over https); else the realm (another host over plain http: never handed them)."""
    realm = dict(re.findall(r'(\w+)="([^"]*)"', challenge)).get("realm", "")
    if realm.startswith("https://") or net.same_host(urlsplit(realm).netloc.rpartition("@")[2], host):
        return ""
    return redact.redact(realm)[:200] or "no realm"


def pick(images: list[dict], platform: str) -> dict:
    """The descriptor of `platform` ("os/architecture") among an index's images, else the first."""
    want = platform.split("/")
    for d in images:
        p = d.get("platform") if isinstance(d.get("platform"), dict) else {}
        if [p.get("os"), p.get("architecture")] == want[:2]:
            return d
    return images[0]


def first_line(exc: BaseException) -> str:
    text = redact.redact(str(exc)).strip()
    return (text.splitlines()[0][:200] if text else type(exc).__name__)
