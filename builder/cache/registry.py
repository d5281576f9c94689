"""The images' own OCI registry as a wheel store: one artifact per cache key, pushed and read with the `oras`
SDK.

    <registry>/<repo>/<package>:<key>      e.g. 127.0.0.1:5000/builder/wheels/cuda-ext:3f1c…(64 hex)

The artifact's layers are the wheels (titled with their file names) and builder-wheel.json (the manifest:
every file's sha256 and size, the key inputs, the audit, who built it). Its annotations repeat what a person
browsing the registry wants without downloading anything: package, version, key, audited archs, the key
inputs and the audit (JSON). `oras pull` gets the same files builder gets.

- lookup: the OCI manifest and the small builder-wheel.json blob; the entry is usable only if the manifest
  passes `manifest_problem` (files with hashes, an audit that passed for the archs asked) and every wheel
  layer's digest and size are the ones it records — a wheel pushed over the tag without its manifest shows up
  here, before anything is downloaded.
- fetch: streams each wheel blob to a temporary name while hashing it, and renames it into place only when
  its sha256 and size match: a truncated, bit-flipped or swapped blob is CacheCorrupt, and a registry that
  goes away mid-download leaves no file behind.
- store: pushes the wheels and the manifest; returns the artifact's digest (the caller records it in the
  local manifest).

Requests are made once (oras-py's own retry loop sleeps for minutes on a refused connection) with timeouts
(BUILDER_REMOTE_TIMEOUT); a registry that does not answer is EnvironmentProblem (exit 3). Authentication:
see net.registry_credentials (Basic or token, chosen from the registry's own challenge).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import CacheCorrupt, CacheHit, manifest_problem
from .config import RemoteSpec, down
from .. import net
from ..registry_api import realm_trusted
from ..net import is_loopback, registry_credentials, stream_into, with_timeouts
from ..errors import EnvironmentProblem

MANIFEST_LAYER = "builder-wheel.json"
WHEEL_MEDIA_TYPE = "application/vnd.builder.wheel.v1+zip"
MANIFEST_MEDIA_TYPE = "application/vnd.builder.manifest.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TITLE = "org.opencontainers.image.title"  # oras.defaults.annotation_title: a layer's file name
SERVED_OTHER_BYTES = "the registry serves other bytes under the blob digest"
# keys of a local manifest that say where a copy lives; they do not travel with the artifact
LOCAL_ONLY_KEYS = ("remotes", "pulled", "registry", "index")


if TYPE_CHECKING:
    import requests


# oras and requests are imported when the first request is made: ~0.25 s of CPU that a run refused before it
# reaches the remote (a broken docker config, a bad flag) should not pay.
@functools.cache
def _client_class():
    import oras.provider

    class _Client(oras.provider.Registry):
        """oras-py's client, each request made once: its retry decorator sleeps 2 + 3^n seconds per attempt, so a
        registry that is down would take minutes to report."""

        do_request = oras.provider.Registry.do_request.__wrapped__

    return _Client


def split_url(url: str) -> tuple[str, str]:
    host, _, repo = url.partition("/")
    return host, repo


class RegistryStore:
    kind = "registry"

    def __init__(self, spec: RemoteSpec, name: str = "registry"):
        self.spec = spec
        self.name = name
        self.host, self.repo = split_url(spec.url)
        self.insecure = spec.insecure if spec.insecure is not None else is_loopback(self.host)
        self.push_enabled = spec.push
        self.label = f"registry {spec.url}"
        self._oras = None  # the oras client, made on the first request

    # -- connection ---------------------------------------------------------------------------------------
    @property
    def scheme(self) -> str:
        return "http" if self.insecure else "https"

    def ref(self, package: str, key: str) -> str:
        return f"{self.spec.url}/{package}:{key}"

    def client(self):
        """An oras client that is logged in the way the registry asks (probed once: GET /v2/)."""
        if self._oras is not None:
            return self._oras
        # a broken docker login is refused before any request; the cache remote is a registry the command was given
        creds, source = registry_credentials(self.host, given=True)
        import requests

        probe = with_timeouts(requests.Session())
        try:
            resp = probe.get(f"{self.scheme}://{self.host}/v2/", stream=True)
            body = net.read_document(resp, f"cache remote {self.label}: GET /v2/", limit=1 << 20)
        except net.NETWORK_ERRORS as exc:
            raise down(self.label, exc) from None
        finally:
            probe.close()
        if resp.status_code in (200, 401) and not net.speaks_registry_api(resp.headers, body):
            raise EnvironmentProblem(f"cache remote {self.label}: GET /v2/ answered HTTP {resp.status_code} without "
                                     "the registry API's header or JSON: is this an OCI registry?")
        challenge = resp.headers.get("WWW-Authenticate", "")
        backend = "token" if challenge.lower().startswith("bearer") else "basic"
        if resp.status_code not in (200, 401):
            raise EnvironmentProblem(f"cache remote {self.label}: GET /v2/ answered HTTP {resp.status_code}: "
                                     "is this an OCI registry?")
        if resp.status_code == 401 and creds is None:
            raise EnvironmentProblem(
                f"cache remote {self.label} asks for credentials: `docker login {self.host}` or set "
                "BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD")
        client = _client_class()(hostname=self.host, insecure=self.insecure, auth_backend=backend)
        with_timeouts(client.session)
        client.auth.load_configs = lambda *a, **k: None  # credentials come from net.registry_credentials only
        if resp.status_code == 401 and backend == "token" and realm_trusted(challenge, self.host):
            creds = None  # a token realm on another host over plain http: never handed the password
        if creds is not None and resp.status_code == 401:  # only to a registry that asked for them
            client.auth.set_basic_auth(*creds)
            if backend == "basic":
                # send them with every request: oras would first send each one without, and a registry answers
                # a large blob upload's 401 by closing the connection mid-body ("Connection aborted")
                client.session.auth = creds
        if resp.status_code == 401:
            check = self._request(client, f"{self.scheme}://{self.host}/v2/", "GET")
            if check.status_code in (401, 403):
                raise EnvironmentProblem(f"cache remote {self.label} refuses the credentials from {source} "
                                         f"(HTTP {check.status_code})")
        self._oras = client
        return client

    def _request(self, client, url: str, method: str, **kw) -> requests.Response:
        try:
            return client.do_request(url, method, **kw)
        except net.NETWORK_ERRORS as exc:
            raise down(self.label, exc) from None
        except ValueError as exc:  # oras: "Cannot respond to request for authentication."
            raise EnvironmentProblem(f"cache remote {self.label}: {exc}") from None

    def _container(self, package: str, key: str):
        return self.client().get_container(self.ref(package, key))

    def _blob_url(self, package: str, key: str, digest: str) -> str:
        return f"{self.scheme}://{self._container(package, key).get_blob_url(digest)}"

    # -- the protocol -------------------------------------------------------------------------------------
    def lookup(self, package: str, key: str, archs: tuple[int, ...]) -> CacheHit | None:
        client = self.client()
        container = self._container(package, key)
        resp = self._request(client, f"{self.scheme}://{container.manifest_url()}", "GET",
                             headers={"Accept": OCI_MANIFEST}, stream=True)
        if resp.status_code == 404:
            resp.close()
            return None
        self._check(resp, f"reading {self.ref(package, key)}")
        raw = self._read(resp, f"cache remote {self.label}: the manifest of {self.ref(package, key)}")
        try:
            oci = json.loads(raw)
        except (ValueError, RecursionError):
            return self._bad(package, key, "", "its OCI manifest is not JSON")
        if not isinstance(oci, dict) or not isinstance(oci.get("layers", []), list):
            return self._bad(package, key, "", "its OCI manifest is not an image manifest")
        digest = resp.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(raw).hexdigest()
        layers = {(l.get("annotations") or {}).get(TITLE): l for l in oci.get("layers", [])
                  if isinstance(l, dict) and isinstance(l.get("annotations") or {}, dict)}
        meta_layer = layers.get(MANIFEST_LAYER)
        if meta_layer is None or not isinstance(meta_layer.get("digest"), str):
            return self._bad(package, key, digest, f"the artifact has no {MANIFEST_LAYER} layer (not pushed by builder?)")
        size = meta_layer.get("size")
        blob = self._request(client, self._blob_url(package, key, meta_layer["digest"]), "GET", stream=True)
        self._check(blob, f"reading {MANIFEST_LAYER} of {self.ref(package, key)}")
        content = self._read(blob, f"cache remote {self.label}: {MANIFEST_LAYER} of {self.ref(package, key)}",
                             size if isinstance(size, int) and 0 <= size <= net.document_limit() else None)
        if "sha256:" + hashlib.sha256(content).hexdigest() != meta_layer["digest"]:
            return self._bad(package, key, digest, f"its {MANIFEST_LAYER} blob does not match its digest")
        try:
            meta = json.loads(content)
        except (ValueError, RecursionError):
            return self._bad(package, key, digest, f"its {MANIFEST_LAYER} is not JSON")
        problem = manifest_problem(meta, archs)
        if not problem and (meta.get("key") != key or meta.get("package") != package):
            problem = f"its manifest is for {meta.get('package')} key {str(meta.get('key'))[:16]}, not this key"
        names: tuple[str, ...] = ()
        if not problem:
            names = tuple(meta["wheels"])
            for name in names:
                layer, rec = layers.get(name), meta["files"][name]
                if layer is None:
                    problem = f"the artifact has no layer for {name}"
                elif layer.get("digest") != "sha256:" + rec["sha256"] or layer.get("size") != rec["bytes"]:
                    problem = (f"the artifact's layer for {name} ({layer.get('digest', '?')[:23]}…, {layer.get('size')} bytes) "
                               f"is not the file its manifest records (sha256:{rec['sha256'][:16]}…, {rec['bytes']} bytes)")
                if problem:
                    break
        entry = {**meta, "registry": {"ref": self.ref(package, key), "digest": digest,
                                      "layers": {n: layers[n]["digest"] for n in names}}}
        return CacheHit(self.name, package, key, f"{self.ref(package, key)}@{digest}", names if not problem else (),
                        entry, problem, remote=True)

    def _read(self, resp: requests.Response, what: str, limit: int | None = None) -> bytes:
        try:
            return net.read_document(resp, what, limit)
        except net.NETWORK_ERRORS as exc:
            raise down(self.label, exc) from None
        finally:
            resp.close()

    def _bad(self, package: str, key: str, digest: str, problem: str) -> CacheHit:
        where = f"{self.ref(package, key)}@{digest}" if digest else self.ref(package, key)
        return CacheHit(self.name, package, key, where, (), {}, problem, remote=True)

    def _check(self, resp: requests.Response, doing: str) -> None:
        if resp.status_code in (401, 403):
            raise EnvironmentProblem(f"cache remote {self.label} refused {doing} (HTTP {resp.status_code}): check "
                                     "the credentials (docker login or BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD)")
        if resp.status_code >= 500:
            raise EnvironmentProblem(f"cache remote {self.label} failed {doing} (HTTP {resp.status_code})")
        if resp.status_code != 200:
            raise EnvironmentProblem(f"cache remote {self.label}: {doing} answered HTTP {resp.status_code}")

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]:
        """Download each wheel into dest, hashing while it streams; a file is renamed into place only once its
        sha256 and size match the manifest."""
        dest.mkdir(parents=True, exist_ok=True)
        client = self.client()
        out: list[Path] = []
        try:
            for name in hit.wheels:
                rec = hit.manifest["files"][name]
                digest = hit.manifest["registry"]["layers"][name]
                part = dest / f".{name}.part"
                resp = self._request(client, self._blob_url(hit.package, hit.key, digest), "GET", stream=True)
                try:
                    self._check(resp, f"downloading {name}")
                    sha, size = stream_into(resp, part, f"cache remote {self.label}: {name}", rec["bytes"])
                except net.NETWORK_ERRORS as exc:
                    raise down(self.label, exc, f"(stopped during the download of {name})") from None
                finally:
                    resp.close()
                if size != rec["bytes"] or sha != rec["sha256"]:
                    # the layer's digest was checked against the manifest at lookup: the registry serves other bytes
                    # under that digest (its storage or the transfer is corrupt)
                    raise CacheCorrupt(f"{self.label}: {hit.package} {hit.key[:16]}: {name} downloaded as {size} bytes "
                                       f"sha256 {sha[:16]}…, the manifest says {rec['bytes']} bytes "
                                       f"sha256 {rec['sha256'][:16]}…: {SERVED_OTHER_BYTES} {digest}")
                os.replace(part, dest / name)
                out.append(dest / name)
        except BaseException:
            for f in [*out, *dest.glob(".*.part")]:
                f.unlink(missing_ok=True)
            raise
        return out

    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit:
        """Push the wheels and their manifest as the artifact <repo>/<package>:<key>."""
        client = self.client()
        meta = {k: v for k, v in manifest.items() if k not in LOCAL_ONLY_KEYS}
        audit = meta.get("audit") or {}
        annotations = {
            "io.builder.package": package,
            "io.builder.version": str(meta.get("version", "")),
            "io.builder.key": key,
            "io.builder.archs": ",".join(map(str, audit.get("archs", []))),
            "io.builder.audit": json.dumps(audit, sort_keys=True, separators=(",", ":")),
            "io.builder.key-inputs": json.dumps(meta.get("key_inputs", {}), sort_keys=True, separators=(",", ":")),
            "io.builder.wheels": ",".join(meta.get("wheels", [])),
        }
        built = (meta.get("built_by") or {}).get("at") if isinstance(meta.get("built_by"), dict) else None
        if built:
            annotations["org.opencontainers.image.created"] = str(built)
        stage = Path(tempfile.mkdtemp(prefix="builder-push-"))
        try:
            (stage / MANIFEST_LAYER).write_text(json.dumps(meta, indent=2, sort_keys=True))
            files = []
            for w in wheels:
                os.symlink(Path(w).resolve(), stage / w.name)
                files.append(f"{stage / w.name}:{WHEEL_MEDIA_TYPE}")
            files.append(f"{stage / MANIFEST_LAYER}:{MANIFEST_MEDIA_TYPE}")
            try:
                resp = client.push(target=self.ref(package, key), files=files, disable_path_validation=True,
                                   manifest_annotations=annotations, quiet=True)
            except net.NETWORK_ERRORS as exc:
                raise down(self.label, exc, f"(stopped while pushing {package})") from None
            except (net.TooSlow, net.TooLarge) as exc:
                raise type(exc)(f"cache remote {self.label}: pushing {self.ref(package, key)}: {exc}") from None
            except ValueError as exc:  # oras: a non-2xx answer
                raise EnvironmentProblem(f"cache remote {self.label}: pushing {self.ref(package, key)}: {exc}") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        # a push proves nothing until the artifact reads back: the manifest, builder-wheel.json and every layer
        # as recorded (a server answering 200 to anything would otherwise count as a registry that keeps wheels)
        archs = tuple(a for a in (audit.get("archs") or ()) if isinstance(a, int)) if isinstance(audit, dict) else ()
        back = self.lookup(package, key, archs)
        if back is None or not back.usable:
            raise EnvironmentProblem(f"cache remote {self.label} accepted the push of {self.ref(package, key)}, but reading it back "
                                     f"{'found nothing' if back is None else 'gave: ' + back.problem}; not recorded as pushed")
        digest = back.manifest["registry"]["digest"]
        said = resp.headers.get("Docker-Content-Digest", "")
        if said and said != digest:
            raise EnvironmentProblem(f"cache remote {self.label}: the push of {self.ref(package, key)} answered {said}, "
                                     f"the registry serves {digest}; not recorded as pushed")
        return CacheHit(self.name, package, key, f"{self.ref(package, key)}@{digest}",
                        tuple(w.name for w in wheels), {**meta, "registry": {"ref": self.ref(package, key), "digest": digest}},
                        remote=True)

    def discard(self, hit: CacheHit, why: str) -> str:
        if SERVED_OTHER_BYTES in why:  # a push cannot fix it: the registry keeps a blob it already has
            return (f"left in {self.label} (builder never deletes remote data); a push cannot replace a blob the "
                    "registry already has: delete that blob (or the repository) on the registry and run its garbage "
                    "collection, then `builder wheels push`")
        return (f"left in {self.label} (builder never deletes remote data); the rebuilt wheel is pushed to "
                f"{self.ref(hit.package, hit.key)} over it")

    def lock(self, package: str, key: str, waiting=None):  # pragma: no cover - the tiered cache locks locally
        raise NotImplementedError("a remote store is locked through the local wheelhouse")

