"""Read package facts from a PEP 691 Simple index (PyPI or a private mirror).

The JSON API is not available everywhere (it answers 404 on some mirrors); the Simple API is, and so is
PEP 658 metadata for most wheels. Where a wheel has no `.metadata` file we read METADATA straight out of
the remote zip with HTTP range requests, so a 300 MB wheel costs a few hundred kilobytes.
"""

from __future__ import annotations

import email.parser
import http.client
import html
import html.parser
import json
import os
import re
import ssl
import struct
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from . import net, redact
from .errors import BuilderError, EnvironmentProblem, UserError

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class DistFile:
    filename: str
    url: str  # absolute
    sha256: str  # "" when the index lists none
    requires_python: str | None
    has_metadata: bool
    yanked: bool = False

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith((".tar.gz", ".zip"))


@dataclass(frozen=True)
class Metadata:
    name: str
    version: str
    requires_python: str | None
    requires_dist: tuple[str, ...] = field(default_factory=tuple)

    def pin(self, dependency: str, extras: tuple[str, ...] = ()) -> str | None:
        """The exact version this package pins `dependency` to (== or ===), or None.

        A requirement guarded by an extra counts only when that extra is in `extras`.
        """
        want = canonicalize_name(dependency)
        for line in self.requires_dist:
            req = Requirement(line)
            if canonicalize_name(req.name) != want:
                continue
            if req.marker is not None:
                envs = [{"extra": e} for e in extras] or [{"extra": ""}]
                if not any(req.marker.evaluate(env) for env in envs):
                    continue
            for spec in req.specifier:
                if spec.operator in ("==", "==="):
                    return spec.version
        return None


    def cuda_major(self) -> tuple[int, str] | None:
        """The CUDA major a torch-like wheel is built for, read from the CUDA wheels it requires on Linux x86_64:
        (13, "cuda-toolkit==13.0.3") for torch 2.14, (12, "nvidia-cuda-runtime-cu12==12.1.105") for torch 2.4;
        None when it requires none (a CPU build)."""
        linux = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "extra": ""}
        named: list[tuple[int, int, str]] = []  # (rank, major, evidence): the runtime's own pin first
        for line in self.requires_dist:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(linux):
                continue
            name = canonicalize_name(req.name)
            pinned = next((sp.version for sp in req.specifier if sp.operator in ("==", "===")), "")
            spelled = f"{req.name}=={pinned}" if pinned else str(req).split(";")[0].strip()
            suffix = re.fullmatch(r"nvidia-.+-cu(\d+)", name)
            if name in ("cuda-toolkit", "nvidia-cuda-runtime") and pinned:
                named.append((0, int(pinned.split(".")[0]), spelled))
            elif suffix and name.startswith("nvidia-cuda-runtime"):
                named.append((1, int(suffix.group(1)), spelled))
            elif suffix:
                named.append((2, int(suffix.group(1)), spelled))
        if not named:
            return None
        _, major, evidence = min(named)
        return major, evidence


ACCEPT_ANY = f"{_ACCEPT}, text/html;q=0.1"


class _Anchors(html.parser.HTMLParser):
    """The <a> elements of a PEP 503 page: (attributes, text)."""

    def __init__(self):
        super().__init__()
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self._open: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._open, self._text = dict(attrs), []

    def handle_data(self, data):
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._open is not None:
            self.anchors.append((self._open, "".join(self._text).strip()))
            self._open = None


def project_files(body: str, content_type: str, page_url: str) -> list[DistFile]:
    """The files a simple-API project page lists, with absolute URLs: the PEP 691 JSON form (PyPI, devpi, ...)
    or the PEP 503 HTML form that pypiserver and many mirrors serve (hash in the URL fragment, the other facts in
    data-* attributes). Raises ValueError for anything else."""
    if "json" in content_type:
        data = json.loads(body)
        return [DistFile(filename=f["filename"], url=urllib.parse.urljoin(page_url, f["url"]),
                         sha256=(f.get("hashes") or {}).get("sha256", ""), requires_python=f.get("requires-python"),
                         has_metadata=bool(f.get("core-metadata") or f.get("data-dist-info-metadata")),
                         yanked=bool(f.get("yanked")))
                for f in data["files"]]
    if "html" not in content_type:
        raise ValueError(f"Content-Type {content_type or 'missing'}")
    parser = _Anchors()
    parser.feed(body)
    out = []
    for attrs, text in parser.anchors:
        href = attrs.get("href") or ""
        link, _, fragment = href.partition("#")
        if not link:
            continue
        name = text or urllib.parse.unquote(link.rsplit("/", 1)[-1])
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else ""
        metadata = attrs.get("data-core-metadata") or attrs.get("data-dist-info-metadata")
        out.append(DistFile(filename=name, url=urllib.parse.urljoin(page_url, link), sha256=sha,
                            requires_python=html.unescape(attrs["data-requires-python"]) if attrs.get("data-requires-python") else None,
                            has_metadata=bool(metadata) and metadata != "false", yanked="data-yanked" in attrs))
    return out


class IndexError_(BuilderError):
    """The index could not be read (network, 404, unexpected answer)."""


def ca_bundle_file() -> str | None:
    """The CA bundle the user named for HTTPS to the index (BUILDER_CA_BUNDLE, else pip's PIP_CERT, else
    SSL_CERT_FILE), or None."""
    return os.environ.get("BUILDER_CA_BUNDLE") or os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")


def _ssl_context() -> ssl.SSLContext:
    bundle = ca_bundle_file()
    ctx = ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()
    if not bundle and os.path.exists("/etc/ssl/certs/ca-certificates.crt"):
        ctx.load_verify_locations("/etc/ssl/certs/ca-certificates.crt")
    return ctx


class SimpleIndex:
    def __init__(self, url: str = DEFAULT_INDEX, timeout: float | None = None):
        self.url = url.rstrip("/")
        self.timeout = net.timeouts()[1] if timeout is None else timeout  # BUILDER_REMOTE_TIMEOUT
        self._ctx = _ssl_context()
        self._projects: dict[str, list[DistFile]] = {}

    def get(self, url: str, headers: dict[str, str] | None = None) -> bytes:
        """GET a URL of this index (or of the files it lists), with the index's TLS settings."""
        return self._get(url, headers)[0]

    def _get(self, url: str, headers: dict[str, str] | None = None) -> tuple[bytes, str, str]:
        """(body, Content-Type, the URL answered after redirects)."""
        req = urllib.request.Request(url, headers=headers or {})
        try:
            with net.urlopen(req, f"the index {url}", context=self._ctx, timeout=self.timeout) as resp:
                return net.read_urllib(resp, f"the index {url}"), resp.headers.get("Content-Type", ""), resp.geturl()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code >= 500:  # the index is down, not the request wrong
                raise EnvironmentProblem(f"{url}: the index answers HTTP {exc.code}; try again later") from None
            if 300 <= exc.code < 400:  # urllib gives up on a loop (or more than 10 hops)
                raise EnvironmentProblem(f"{url}: the index redirects in a loop (HTTP {exc.code})") from None
            if exc.code in (401, 403):
                raise EnvironmentProblem(f"{url}: the index refuses access (HTTP {exc.code})") from None
            raise IndexError_(f"{url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise EnvironmentProblem(f"{url}: the index is unreachable ({getattr(exc, 'reason', exc)})") from None
        except ValueError as exc:  # a URL urllib cannot even parse
            raise UserError(f"{url}: not a usable URL ({exc})") from None

    def files(self, project: str) -> list[DistFile]:
        name = canonicalize_name(project)
        if name not in self._projects:
            body, content_type, answered = self._get(f"{self.url}/{name}/", {"Accept": ACCEPT_ANY})
            try:
                files = project_files(body.decode("utf-8", "replace"), content_type, answered)
            except (ValueError, RecursionError) as exc:  # an index that answers garbage is the environment's fault
                raise EnvironmentProblem(f"{answered}: the index answers no simple-API project page "
                                         f"({redact.redact(str(exc))[:200]})") from None
            self._projects[name] = [f for f in files if not f.yanked]
        return self._projects[name]

    def release_files(self, project: str, version: str) -> list[DistFile]:
        want = Version(version)
        out = []
        for f in self.files(project):
            try:
                if f.is_wheel:
                    _, v, _, _ = parse_wheel_filename(f.filename)
                elif f.filename.endswith(".tar.gz"):
                    _, v = parse_sdist_filename(f.filename)
                else:
                    continue
            except Exception:  # noqa: BLE001 - foreign file names on an index are not our error
                continue
            if v == want:
                out.append(f)
        if not out:
            raise UserError(f"{project} {version}: no such release on {self.url}")
        return out

    def sdist(self, project: str, version: str) -> DistFile | None:
        return next((f for f in self.release_files(project, version) if f.is_sdist), None)

    def metadata(self, project: str, version: str) -> Metadata:
        """Core metadata of a release, read from one of its wheels."""
        wheels = [f for f in self.release_files(project, version) if f.is_wheel]
        if not wheels:
            raise UserError(f"{project} {version}: no wheel on {self.url} to read metadata from")
        # Prefer an x86_64 Linux or pure wheel: pins can differ per platform (markers) but not per file
        wheels.sort(key=lambda f: (not f.has_metadata, "x86_64" not in f.filename and "none-any" not in f.filename))
        return self.file_metadata(wheels[0])

    def file_metadata(self, chosen: DistFile) -> Metadata:
        """Core metadata of one wheel: its PEP 658 file, else METADATA read out of the remote zip."""
        if chosen.has_metadata:
            text = self.get(chosen.url + ".metadata").decode()
        else:
            text = self._remote_zip_metadata(chosen)
        msg = email.parser.Parser().parsestr(text)
        return Metadata(
            name=msg["Name"],
            version=msg["Version"],
            requires_python=msg.get("Requires-Python"),
            requires_dist=tuple(msg.get_all("Requires-Dist") or ()),
        )

    def _range(self, url: str, start: int, end: int | None = None) -> bytes:
        rng = f"bytes={start}-" if end is None else f"bytes={start}-{end}"
        return self.get(url, {"Range": rng})

    def _remote_zip_metadata(self, f: DistFile) -> str:
        """METADATA out of a remote wheel via range requests on its central directory."""
        tail = self.get(f.url, {"Range": "bytes=-65536"})
        eocd = tail.rfind(b"PK\x05\x06")
        if eocd < 0:
            raise IndexError_(f"{f.filename}: no zip end record in the last 64 KiB")
        cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
        if cd_offset == 0xFFFFFFFF:  # zip64: the real offsets are in the zip64 end record
            loc = tail.rfind(b"PK\x06\x07")
            (z64_off,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
            rec = self._range(f.url, z64_off, z64_off + 55)
            cd_size, cd_offset = struct.unpack("<QQ", rec[40:56])
        cd = self._range(f.url, cd_offset, cd_offset + cd_size - 1)
        pos = 0
        while pos < len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
            (method,) = struct.unpack("<H", cd[pos + 10 : pos + 12])
            csize, _usize, nlen, xlen, clen = struct.unpack("<IIHHH", cd[pos + 20 : pos + 34])
            (lho,) = struct.unpack("<I", cd[pos + 42 : pos + 46])
            name = cd[pos + 46 : pos + 46 + nlen].decode()
            if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
                if lho == 0xFFFFFFFF:
                    raise IndexError_(f"{f.filename}: METADATA past 4 GiB is not supported")
                head = self._range(f.url, lho, lho + 30 + 1024 + csize)
                lnlen, lxlen = struct.unpack("<HH", head[26:30])
                blob = head[30 + lnlen + lxlen : 30 + lnlen + lxlen + csize]
                if method == 0:
                    return blob.decode()
                if method == 8:
                    return zlib.decompressobj(-15).decompress(blob).decode()
                raise IndexError_(f"{f.filename}: METADATA uses zip method {method}")
            pos += 46 + nlen + xlen + clen
        raise IndexError_(f"{f.filename}: no .dist-info/METADATA in the wheel")
