"""A PEP 503 index (pypiserver, devpi, Nexus, ...) as a wheel store, usable by people outside builder too.

A wheel is uploaded (twine) under a local version label that names what it was built for and its key:

    cuda_ext-1.0.0+cu130.sm80.90.k3f1c2a9b0d4e-cp311-cp311-linux_x86_64.whl
    vllm-0.33.0+cu130.torch2140.sm80.90.k1a2b3c4d5e6-cp38-abi3-linux_x86_64.whl

so one index holds every variant and `pip install --index-url URL 'vllm==0.33.0+cu130.torch2140.sm80.90.k1a2b3c4d5e6'`
installs exactly that build (a plain `vllm==0.33.0` matches any label). Relabelling rewrites the file name, the
.dist-info directory name, METADATA's Version and RECORD consistently, so pip accepts the wheel; everything
else in the archive is byte for byte the audited wheel's.

The manifest travels inside the wheel: `<dist>-<version>.dist-info/builder-wheel.json` holds the original
manifest (the audited wheel's sha256 and size, key inputs, audit, who built it) plus the sha256 of every
member of the relabelled archive. A pull checks the index's advertised sha256, then every member against
that list and against RECORD, the key, and the audit for the archs asked: a wheel tampered inside a valid
zip, truncated or bit-flipped is CacheCorrupt and never used. (Someone who can upload to the index and
rewrites the embedded manifest too is not caught by hashes; that needs signatures.)

lookup reads the project's simple page only (PEP 691 JSON, or the HTML of PEP 503); the manifest is read on
fetch, which then completes hit.manifest.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from . import CacheCorrupt, CacheHit, manifest_problem, sha256_file
from .config import RemoteSpec, down
from .. import net
from ..net import index_credentials, stream_into, with_timeouts
from ..errors import BuilderError, EnvironmentProblem
from ..pypi import ACCEPT_ANY, project_files

if TYPE_CHECKING:
    import requests

MANIFEST_MEMBER = "builder-wheel.json"
LOCAL_ONLY_KEYS = ("remotes", "pulled", "registry", "index")
_SIGNATURES = ("RECORD.jws", "RECORD.p7s")
_NEW_MEMBER_TIME = (1980, 1, 1, 0, 0, 0)


# -- labels and relabelling ------------------------------------------------------------------------------
def label_for(manifest: dict, key: str) -> str:
    """`cu130.torch2140.sm80.90.k<12 hex of the key>`: CUDA, torch, audited archs, key."""
    ki = manifest.get("key_inputs") if isinstance(manifest.get("key_inputs"), dict) else {}
    parts = []
    m = re.match(r"(\d+)\.(\d+)", str(ki.get("cuda") or ""))
    if m:
        parts.append(f"cu{m[1]}{m[2]}")
    if ki.get("torch"):
        parts.append("torch" + re.sub(r"[^0-9a-z]", "", str(ki["torch"]).lower()))
    audit = manifest.get("audit") if isinstance(manifest.get("audit"), dict) else {}
    archs = audit.get("archs") or ki.get("built_archs") or []
    if archs:
        parts.append("sm" + ".".join(str(a) for a in archs))
    parts.append(f"k{key[:12]}")
    return ".".join(parts)


def key_tag(key: str) -> str:
    return f"k{key[:12]}"


def _record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _dist_info(names: list[str]) -> str:
    dirs = {n.split("/", 1)[0] for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")}
    if len(dirs) != 1:
        raise CacheCorrupt(f"the wheel has {len(dirs)} .dist-info directories with a METADATA, not one")
    return dirs.pop()


def _set_version(metadata: bytes, version: str) -> bytes:
    text = metadata.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    head, n = re.subn(r"^Version:[ \t]*.*$", f"Version: {version}", head, count=1, flags=re.M)
    if n != 1:
        raise CacheCorrupt("the wheel's METADATA has no Version header")
    return (head + sep + body).encode("utf-8")


def relabel(src: Path, label: str, manifest: dict, dest_dir: Path) -> Path:
    """A copy of wheel `src` as version `<version>+<label>` with the manifest inside its .dist-info.
    Deterministic: the same wheel and manifest give the same bytes."""
    dist, version, *rest = src.name[:-len(".whl")].split("-")
    new_version = f"{version}.{label}" if "+" in version else f"{version}+{label}"
    out = dest_dir / ("-".join([dist, new_version, *rest]) + ".whl")
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        old_info = _dist_info([i.filename for i in infos])
        info_dist = old_info[:-len(".dist-info")].rsplit("-", 1)[0]
        old_ver = old_info[:-len(".dist-info")].rsplit("-", 1)[1]
        new_ver = f"{old_ver}.{label}" if "+" in old_ver else f"{old_ver}+{label}"
        new_info = f"{info_dist}-{new_ver}.dist-info"
        old_data, new_data = f"{info_dist}-{old_ver}.data/", f"{info_dist}-{new_ver}.data/"
        skip = {f"{old_info}/RECORD", f"{old_info}/{MANIFEST_MEMBER}"} | {f"{old_info}/{s}" for s in _SIGNATURES}
        body = [i for i in infos if i.filename not in skip and not i.filename.startswith(old_info + "/")]
        meta_members = [i for i in infos if i.filename not in skip and i.filename.startswith(old_info + "/")]
        hashes: dict[str, str] = {}
        rows: list[tuple[str, str, str]] = []
        tmp = dest_dir / f".{out.name}.part"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:

            def put(name: str, data_iter, template: zipfile.ZipInfo | None) -> None:
                zi = zipfile.ZipInfo(name, date_time=template.date_time if template else _NEW_MEMBER_TIME)
                zi.external_attr = template.external_attr if template else 0o644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                h, size = hashlib.sha256(), 0
                with zout.open(zi, "w") as fh:
                    for chunk in data_iter:
                        h.update(chunk)
                        size += len(chunk)
                        fh.write(chunk)
                if name != f"{new_info}/{MANIFEST_MEMBER}":
                    hashes[name] = h.hexdigest()
                rows.append((name, _record_hash(h.digest()), str(size)))

            def chunks(info: zipfile.ZipInfo):
                with zin.open(info) as fh:
                    yield from iter(lambda: fh.read(1 << 20), b"")

            for info in body:
                name = info.filename
                if name.startswith(old_data):
                    name = new_data + name[len(old_data):]
                put(name, chunks(info), info)
            for info in meta_members:
                name = new_info + info.filename[len(old_info):]
                if info.filename == f"{old_info}/METADATA":
                    put(name, [_set_version(zin.read(info), new_ver)], info)
                else:
                    put(name, chunks(info), info)
            embedded = {k: v for k, v in manifest.items() if k not in LOCAL_ONLY_KEYS}
            embedded["index"] = {"label": label, "version": new_ver, "original": src.name, "members": hashes}
            put(f"{new_info}/{MANIFEST_MEMBER}", [json.dumps(embedded, indent=2, sort_keys=True).encode()], None)
            record = io.StringIO()
            writer = csv.writer(record, lineterminator="\n")
            writer.writerows(rows)
            writer.writerow((f"{new_info}/RECORD", "", ""))
            zi = zipfile.ZipInfo(f"{new_info}/RECORD", date_time=_NEW_MEMBER_TIME)
            zi.external_attr, zi.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
            zout.writestr(zi, record.getvalue())
    os.replace(tmp, out)
    return out


def embedded_manifest(path: Path) -> dict | None:
    """The builder manifest inside a (relabelled) wheel, or None."""
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/" + MANIFEST_MEMBER)]
        return json.loads(z.read(names[0])) if len(names) == 1 else None


# What a damaged wheel raises while it is read: a broken zip or a bad CRC, bad deflate data (zlib.error: a flipped
# bit inside a compressed member), a truncated member, an encrypted or unsupported member, text that is not UTF-8.
_UNREADABLE_WHEEL = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, RuntimeError,
                     NotImplementedError, UnicodeDecodeError)


def verify_labelled(path: Path, package: str, key: str, archs: tuple[int, ...]) -> dict:
    """Check a wheel from the index: every member against the embedded manifest's list and against RECORD,
    the key, the package and the recorded audit. Returns the embedded manifest; raises CacheCorrupt."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            names = [i.filename for i in infos]
            if len(set(names)) != len(names):
                raise CacheCorrupt("the wheel has a member twice")
            info_dir = _dist_info(names)
            mpath, rpath = f"{info_dir}/{MANIFEST_MEMBER}", f"{info_dir}/RECORD"
            if mpath not in names:
                raise CacheCorrupt(f"the wheel carries no {MANIFEST_MEMBER} (not uploaded by builder?)")
            try:
                meta = json.loads(z.read(mpath))
            except ValueError:
                raise CacheCorrupt(f"its {MANIFEST_MEMBER} is not JSON") from None
            problem = manifest_problem(meta, archs)
            if problem:
                raise CacheCorrupt(problem)
            if meta.get("key") != key or meta.get("package") != package:
                raise CacheCorrupt(f"it carries the manifest of {meta.get('package')} key {str(meta.get('key'))[:16]}, not of this key")
            members = (meta.get("index") or {}).get("members")
            if not isinstance(members, dict):
                raise CacheCorrupt(f"its {MANIFEST_MEMBER} lists no member hashes")
            record = {row[0]: row[1] for row in csv.reader(io.StringIO(z.read(rpath).decode())) if row} if rpath in names else {}
            if not record:
                raise CacheCorrupt("the wheel has no RECORD")
            extra = set(names) - {mpath, rpath} - set(members)
            missing = set(members) - set(names)
            if extra or missing:
                what = f"{sorted(extra)[0]} is not in its manifest" if extra else f"{sorted(missing)[0]} is missing"
                raise CacheCorrupt(what)
            for info in infos:
                if info.filename == rpath:
                    continue
                h = hashlib.sha256()
                with z.open(info) as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                if info.filename != mpath and h.hexdigest() != members[info.filename]:
                    raise CacheCorrupt(f"{info.filename}: sha256 {h.hexdigest()[:16]}…, the manifest says "
                                       f"{members[info.filename][:16]}…")
                if record.get(info.filename) != _record_hash(h.digest()):
                    raise CacheCorrupt(f"{info.filename} does not match RECORD")
            return meta
    except _UNREADABLE_WHEEL as exc:
        raise CacheCorrupt(f"not a readable wheel ({type(exc).__name__}: {exc})") from None


# -- the simple API --------------------------------------------------------------------------------------
# twine's command line, its requests under builder's deadlines (net.bounded_twine)
TWINE = "import sys; from builder.net import bounded_twine; sys.exit(bounded_twine(sys.argv[1:]))"


def upload_url_for(simple: str) -> str:
    """pypiserver / devpi / Nexus take uploads at the index URL without its trailing simple/ (+simple/)."""
    base = simple.rstrip("/")
    for suffix in ("/+simple", "/simple"):
        if base.endswith(suffix):
            return base[: -len(suffix)] + "/"
    return base + "/"


class IndexStore:
    kind = "index"

    def __init__(self, spec: RemoteSpec, name: str = "index"):
        self.spec = spec
        self.name = name
        self.simple = spec.url.rstrip("/") + "/"
        self.upload = spec.upload or upload_url_for(spec.url)
        self.push_enabled = spec.push
        self.label = f"index {spec.url}"
        self._session: requests.Session | None = None

    def session(self) -> requests.Session:
        if self._session is None:
            import requests  # on the first request: a run refused before it reaches the remote does not pay for it

            s = with_timeouts(requests.Session())
            creds = index_credentials()
            if creds:
                s.auth = creds
            self._session = s
        return self._session

    def page(self, package: str) -> str:
        return urllib.parse.urljoin(self.simple, canonicalize_name(package) + "/")

    def files(self, package: str) -> dict[str, tuple[str, str | None]] | None:
        """{file name: (absolute URL, sha256 or None)} from the project's simple page; None when there is none."""
        url = self.page(package)
        try:
            resp = self.session().get(url, headers={"Accept": ACCEPT_ANY}, stream=True)
            try:
                body = net.read_document(resp, f"cache remote {self.label}: {url}")
            finally:
                resp.close()
        except net.NETWORK_ERRORS as exc:
            raise down(self.label, exc) from None
        if resp.status_code == 404:
            return None
        if resp.status_code in (401, 403):
            raise EnvironmentProblem(f"cache remote {self.label} refused reading {url} (HTTP {resp.status_code}): "
                                     "set BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD")
        if resp.status_code != 200:
            raise EnvironmentProblem(f"cache remote {self.label}: GET {url} answered HTTP {resp.status_code}")
        try:
            listed = project_files(body.decode("utf-8", "replace"), resp.headers.get("Content-Type", ""), resp.url)
        except (ValueError, RecursionError) as exc:
            raise EnvironmentProblem(f"cache remote {self.label}: {url} is not a simple-API page ({exc})") from None
        return {f.filename: (f.url, f.sha256 or None) for f in listed}

    # -- the protocol -------------------------------------------------------------------------------------
    def lookup(self, package: str, key: str, archs: tuple[int, ...]) -> CacheHit | None:
        files = self.files(package)
        if not files:
            return None
        tag = key_tag(key)
        mine = {}
        for name, (url, sha) in files.items():
            if not name.endswith(".whl"):
                continue
            try:
                _, version, _, _ = parse_wheel_filename(name)
            except (ValueError, InvalidVersion):
                continue
            if version.local and version.local.split(".")[-1] == tag:
                mine[name] = {"url": url, "sha256": sha}
        if not mine:
            return None
        summary = {"index": {"page": self.page(package), "files": mine, "archs": list(archs)}}
        return CacheHit(self.name, package, key, f"{self.page(package)} ({', '.join(sorted(mine))})",
                        tuple(sorted(mine)), summary, remote=True)

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]:
        dest.mkdir(parents=True, exist_ok=True)
        info = hit.manifest["index"]
        archs = tuple(info.get("archs") or ())
        out: list[Path] = []
        embedded: list[dict] = []
        records: dict[str, dict] = {}
        try:
            for name in hit.wheels:
                url, sha = info["files"][name]["url"], info["files"][name]["sha256"]
                part = dest / f".{name}.part"
                try:
                    with self.session().get(url, stream=True) as resp:
                        if resp.status_code != 200:
                            raise EnvironmentProblem(f"cache remote {self.label}: GET {url} answered HTTP {resp.status_code}")
                        got, size = stream_into(resp, part, f"cache remote {self.label}: {url}")
                except net.NETWORK_ERRORS as exc:
                    raise down(self.label, exc, f"(stopped during the download of {name})") from None
                where = f"{self.label}: {hit.package} {hit.key[:16]}: {name}"
                if sha and got != sha:
                    raise CacheCorrupt(f"{where}: downloaded sha256 {got[:16]}…, the index says {sha[:16]}…")
                try:
                    embedded.append(verify_labelled(part, hit.package, hit.key, archs))
                except CacheCorrupt as exc:
                    raise CacheCorrupt(f"{where}: {exc}") from None
                os.replace(part, dest / name)
                out.append(dest / name)
                records[name] = {"sha256": got, "bytes": size}
            originals = {e["index"]["original"] for e in embedded}
            wanted = set(embedded[0]["wheels"])
            if originals != wanted:
                raise CacheCorrupt(f"{self.label}: {hit.package} {hit.key[:16]}: the index holds {sorted(originals)}, "
                                   f"the entry has {sorted(wanted)}")
        except BaseException:
            for f in [*out, *dest.glob(".*.part")]:
                f.unlink(missing_ok=True)
            raise
        first = embedded[0]
        entry = {k: v for k, v in first.items() if k != "index"}
        entry.update({
            "wheels": [p.name for p in out],
            "files": records,
            "index": {"page": info["page"], "files": {n: info["files"][n]["url"] for n in hit.wheels},
                      "label": first["index"]["label"], "original_wheels": first["wheels"],
                      "original_files": first["files"]},
        })
        hit.manifest.clear()
        hit.manifest.update(entry)
        return out

    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit:
        """Relabel each wheel (unless it already carries this key's label) and upload them with twine."""
        label = label_for(manifest, key)
        stage = Path(tempfile.mkdtemp(prefix="builder-index-"))
        try:
            files = []
            for w in wheels:
                meta = embedded_manifest(w)
                if meta is not None and meta.get("key") == key:
                    files.append(w)  # pulled from an index before: already labelled, manifest inside
                else:
                    files.append(relabel(w, label, manifest, stage))
            existing = self.files(package) or {}
            new, replacing = [], []
            for f in files:
                theirs = existing.get(f.name, (None, None))[1]
                if f.name in existing and theirs == sha256_file(f):
                    continue  # already there, byte for byte
                (replacing if f.name in existing else new).append(f)
            if new or replacing:
                self._twine(new + replacing, replacing=[f.name for f in replacing])
                listed = self.files(package) or {}  # read back: an upload counts only once the index lists it
                for f in new + replacing:
                    sha = listed.get(f.name, (None, None))[1]
                    if f.name not in listed or (sha and sha != sha256_file(f)):
                        raise EnvironmentProblem(f"cache remote {self.label}: uploaded {f.name}, but the index "
                                                 f"{'does not list it' if f.name not in listed else 'lists other bytes'}; "
                                                 "not recorded as pushed")
            names = tuple(f.name for f in files)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return CacheHit(self.name, package, key, f"{self.page(package)} ({', '.join(names)})", names,
                        {"index": {"page": self.page(package), "label": label}}, remote=True)

    def _twine(self, files: list[Path], replacing: list[str] = ()) -> None:
        """Upload with twine (credentials through its environment, never its command line). `replacing`: files
        the index already holds with other content (a bad copy); most indexes refuse to overwrite them."""
        env = {**os.environ, "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring", "TWINE_NON_INTERACTIVE": "1",
               "NO_COLOR": "1", "TERM": "dumb"}
        for var in ("TWINE_USERNAME", "TWINE_PASSWORD", "TWINE_REPOSITORY", "TWINE_REPOSITORY_URL"):
            env.pop(var, None)
        creds = index_credentials()
        env["TWINE_USERNAME"], env["TWINE_PASSWORD"] = creds if creds else ("builder", "none")
        argv = [sys.executable, "-c", TWINE, "upload", "--repository-url", self.upload, "--non-interactive",
                "--disable-progress-bar", *map(str, files)]
        bound = net.subprocess_seconds(sum(f.stat().st_size for f in files), requests=2 * len(files))
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=bound, check=False)
        except subprocess.TimeoutExpired:
            raise net.TooSlow(f"cache remote {self.label}: twine upload to {self.upload} did not finish within "
                              f"{bound:g} s (BUILDER_REMOTE_TIMEOUT per request); stopped") from None
        stopped = [l for l in proc.stderr.splitlines() if l.startswith(net.TWINE_STOPPED)]
        if stopped:  # a request past its deadline or its cap
            raise net.TooSlow(f"cache remote {self.label}: {stopped[-1].removeprefix(net.TWINE_STOPPED)}")
        if proc.returncode == 0:
            return
        out = (proc.stdout + proc.stderr).strip()
        tail = " ".join(" ".join(out.splitlines()[-6:]).split())  # twine wraps its lines: one line here
        if replacing and re.search(r"\b(400|409)\b|already exists|Conflict|overwrite|Bad Request", out, re.I):
            raise BuilderError(f"{self.label} holds a different {', '.join(replacing)} and refuses to replace it "
                               "(indexes keep uploaded files): delete it on the index, then `builder wheels push`")
        if re.search(r"ConnectionError|Connection refused|Max retries exceeded|timed out", out):
            raise EnvironmentProblem(f"cache remote {self.label} does not answer uploads at {self.upload}: {tail}")
        if re.search(r"\b(401|403)\b", out):
            raise EnvironmentProblem(f"cache remote {self.label} refused the upload to {self.upload} (check "
                                     f"BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD): {tail}")
        raise EnvironmentProblem(f"cache remote {self.label}: twine upload to {self.upload} failed: {tail}")

    def discard(self, hit: CacheHit, why: str) -> str:
        return (f"left in {self.label} (builder never deletes remote data; indexes refuse to overwrite a file, "
                f"so remove {', '.join(hit.wheels) or 'it'} from the index by hand)")

    def lock(self, package: str, key: str, waiting=None):  # pragma: no cover - the tiered cache locks locally
        raise NotImplementedError("a remote store is locked through the local wheelhouse")
