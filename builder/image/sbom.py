"""The image's SBOM: an SPDX 2.3 document (JSON, as a dict) of one platform image, made from its OCI archive alone
(one pass over its layers: sizes.walk, the final filesystem with whiteouts applied).

What it holds, one SPDX package per:
- Debian package of the base (/var/lib/dpkg/status and status.d/*): purl pkg:deb/<os id>/NAME@VERSION?arch=ARCH,
  supplier from its Maintainer, its source package (sourceInfo) when that differs;
- *.dist-info directory (any site-packages): name and version from METADATA, licenseDeclared when its
  License-Expression (or License) is an SPDX expression of builder/data/spdx-license-ids.txt, purl pkg:pypi/…,
  checksum = the sha256 of its RECORD; two copies at two paths are two packages;
- wheel builder compiled (the io.builder.package.<name>.* labels with an audit): where its source came from, the
  cell's archs, the SASS / PTX its audit found, CUDA (its nvcc is that toolkit's), torch and python; the dist-info
  installed from it is EXPANDED_FROM_ARCHIVE it;
- compile cache under the image's cache root (io.builder.cache-env): file count, bytes, and the sha256 of its
  `sha256sum` listing (lines "<sha256>  <path relative to the cache directory>\\n", sorted by path), with the
  io.builder.warm.* facts of a warm image;
and the image itself (SPDXRef-Image, checksum = its manifest digest), which the document DESCRIBES and which
CONTAINS every other package. Every ELF file with device code is an SPDX file (SHA1 and SHA256) with the SASS and PTX
its fatbin holds, CONTAINed by the package whose RECORD lists it (the image's, when none does).

The machine-readable facts: every element builder writes carries one annotation (type OTHER, annotator
"Tool: builder-<version>") whose comment is a JSON object with "kind" (image, dpkg, dist-info, compiled, jit,
device-code) and that element's facts, keys sorted (ANNOTATION_KINDS). The same archive gives the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
from collections import Counter
from datetime import datetime, timezone
from email.parser import BytesHeaderParser
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from .. import __version__
from .. import audit
from ..errors import UserError
from . import labels as labels_mod
from . import sizes

TOOL = f"Tool: builder-{__version__}"
ANNOTATION_KINDS = ("image", "dpkg", "dist-info", "compiled", "jit", "device-code")
DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_STATUS_D = "/var/lib/dpkg/status.d/"  # distroless bases: one file per package
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")
_DIST_INFO = re.compile(r"^(.*?/[^/]+\.dist-info)/")
IMAGE_ID = "SPDXRef-Image"


# -- reading the image ----------------------------------------------------------------------------------------
def _kept(path: str) -> bool:
    """The files whose contents the SBOM reads (small text; everything else is only hashed)."""
    return (path.endswith((".dist-info/METADATA", ".dist-info/RECORD")) or path == DPKG_STATUS
            or path.startswith(DPKG_STATUS_D) or path in OS_RELEASE)


def _labels(walked: sizes.Walk) -> dict[str, str]:
    return (walked.image.config.get("config") or {}).get("Labels") or {}


def _dist_infos(files: dict[str, sizes.File]) -> list[str]:
    """Every *.dist-info directory of the final filesystem (a directory that still holds a file)."""
    return sorted({m.group(1) for path in files if (m := _DIST_INFO.match(path))})


def _owners(files: dict[str, sizes.File]) -> dict[str, str]:
    """path -> the dist-info directory whose RECORD lists it (RECORDs still in the image)."""
    return {p: posixpath.dirname(record) for record, f in sorted(files.items())
            if record.endswith(".dist-info/RECORD") and f.text is not None
            for p in sizes.record_paths(f.text.decode("utf-8", "replace"), record)}


def _coverage(entries) -> tuple[list[str], list[str]]:
    """(SASS, PTX) names of a fatbin's entries (sm_90a, compute_80), in arch order."""
    def names(kind: str) -> list[str]:
        return [n for _, _, n in sorted({(e.arch, e.variant, e.name) for e in entries if e.kind == kind})]
    return names("sass"), names("ptx")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    return version.split("+", 1)[0]


# -- SPDX pieces ----------------------------------------------------------------------------------------------
def _spdx_id(kind: str, name: str, unique: str) -> str:
    """A stable SPDXID: the kind, the name (letters, digits, . and - only) and a hash of what makes it unique."""
    return (f"SPDXRef-{kind}-{re.sub(r'[^A-Za-z0-9.-]+', '-', name).strip('-')[:60]}-"
            f"{hashlib.sha256(unique.encode()).hexdigest()[:12]}")


def _annotation(created: str, facts: dict) -> list[dict]:
    return [{"annotationDate": created, "annotationType": "OTHER", "annotator": TOOL,
             "comment": json.dumps(facts, sort_keys=True, separators=(",", ":"))}]


def facts_of(element: dict) -> dict:
    """The builder facts of one SPDX element (its builder annotation's JSON), {} for an element without one."""
    for a in element.get("annotations") or []:
        if a.get("annotator", "").startswith("Tool: builder-"):
            try:
                facts = json.loads(a.get("comment", ""))
            except ValueError:
                continue
            if isinstance(facts, dict) and facts.get("kind") in ANNOTATION_KINDS:
                return facts
    return {}


def _purl_ref(purl: str) -> dict:
    return {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}


def _pct(text: str) -> str:
    return quote(text, safe="")


def _package(spdx_id: str, name: str, version: str, created: str, facts: dict, **fields) -> dict:
    out = {"SPDXID": spdx_id, "name": name, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
           **fields, "annotations": _annotation(created, facts)}
    if version:
        out["versionInfo"] = version
    return out


def _timestamp(value: str, what: str) -> str:
    """An RFC 3339 time (BuildKit writes nanoseconds, an offset or Z) as SPDX wants it: UTC, seconds, Z."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)", value.strip())
    if not m:
        raise UserError(f"{what} {value!r} is not a time like 2026-01-31T12:00:00Z")
    when = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(2) == "Z" else m.group(2)))
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- licences -------------------------------------------------------------------------------------------------
@functools.cache
def _license_ids() -> tuple[dict[str, str], dict[str, str]]:
    """({lower-case id: id} of licences, the same of exceptions) from builder/data/spdx-license-ids.txt."""
    text = resources.files("builder").joinpath("data/spdx-license-ids.txt").read_text()
    licences, exceptions = {}, {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            ident, _, mark = line.partition(" ")
            (exceptions if mark == "exception" else licences)[ident.lower()] = ident
    return licences, exceptions


def license_expression(text: str) -> str:
    """`text` as an SPDX licence expression of known ids (their case corrected), else NOASSERTION: a free-text
    License field ("MIT License", a licence's whole text) is no expression."""
    tokens = re.findall(r"\(|\)|[^\s()]+", text or "")
    if not tokens or len(tokens) > 64:
        return "NOASSERTION"
    licences, exceptions = _license_ids()
    out: list[str] = []
    pos = 0

    def expression() -> bool:
        nonlocal pos
        if not term():
            return False
        while pos < len(tokens) and tokens[pos].upper() in ("AND", "OR"):
            out.append(tokens[pos].upper())
            pos += 1
            if not term():
                return False
        return True

    def term() -> bool:
        nonlocal pos
        if pos >= len(tokens):
            return False
        if tokens[pos] == "(":
            out.append("(")
            pos += 1
            if not expression() or pos >= len(tokens) or tokens[pos] != ")":
                return False
            out.append(")")
            pos += 1
            return True
        ident = licences.get(tokens[pos].lower())
        if ident is None and tokens[pos].endswith("+"):
            base = licences.get(tokens[pos][:-1].lower())
            ident = base + "+" if base else None
        if ident is None:
            return False
        out.append(ident)
        pos += 1
        if pos < len(tokens) and tokens[pos].upper() == "WITH":
            exception = exceptions.get(tokens[pos + 1].lower()) if pos + 1 < len(tokens) else None
            if exception is None:
                return False
            out.extend(("WITH", exception))
            pos += 2
        return True

    if not expression() or pos != len(tokens):
        return "NOASSERTION"
    return " ".join(out).replace("( ", "(").replace(" )", ")")


# -- the packages, one source at a time -----------------------------------------------------------------------
def _os_release(files: dict[str, sizes.File]) -> dict[str, str]:
    for path in OS_RELEASE:
        f = files.get(path)
        if f is not None and f.text is not None:
            pairs = (line.split("=", 1) for line in f.text.decode("utf-8", "replace").splitlines() if "=" in line)
            return {k.strip(): v.strip().strip('"') for k, v in pairs}
    return {}


def _stanzas(text: str) -> list[dict[str, str]]:
    """The paragraphs of a dpkg status file ({field: value}, continuation lines joined)."""
    out: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current:
                out.append(current)
            current, key = {}, None
        elif line[0] in " \t":
            if key is not None:
                current[key] += "\n" + line.strip()
        else:
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip()
                current[key] = value.strip()
    return out


def _supplier(maintainer: str) -> str:
    """SPDX's actor of a Debian Maintainer field: an Organization for a team or a list, else a Person."""
    m = re.fullmatch(r"\s*([^<]*?)\s*(?:<([^>]*)>)?\s*", maintainer or "")
    name = re.sub(r"[()]", "", m.group(1) if m else maintainer).strip()
    email = (m.group(2) or "") if m else ""
    if not name:
        return "NOASSERTION"
    team = re.search(r"team|maintainers|developers|project|packagers|group", name, re.I) or "@lists." in email
    return f"{'Organization' if team else 'Person'}: {name}" + (f" ({email})" if email else "")


def _dpkg_packages(files: dict[str, sizes.File], created: str) -> list[dict]:
    release = _os_release(files)
    distro = _canonical(release.get("ID", "")) or "debian"
    qualifier = f"&distro={_pct(distro + '-' + release['VERSION_ID'])}" if release.get("VERSION_ID") else ""
    out = {}
    for path in sorted(p for p in files if p == DPKG_STATUS or p.startswith(DPKG_STATUS_D)):
        text = files[path].text
        for st in _stanzas((text or b"").decode("utf-8", "replace")):
            name, version, arch = st.get("Package", ""), st.get("Version", ""), st.get("Architecture", "")
            # the main status file also lists removed packages (deinstall ok config-files); status.d has no Status
            if not name or ("Status" in st and st["Status"].split()[-1:] != ["installed"]):
                continue
            source, _, source_version = st.get("Source", "").partition(" ")
            source_version = source_version.strip("() ") or version
            facts = {"kind": "dpkg", "status": path, "architecture": arch}
            fields = {"supplier": _supplier(st.get("Maintainer", "")),
                      "externalRefs": [_purl_ref(f"pkg:deb/{distro}/{_pct(name)}@{_pct(version)}"
                                                 f"?arch={_pct(arch or 'all')}{qualifier}")]}
            if source and (source, source_version) != (name, version):
                facts["source"] = {"name": source, "version": source_version}
                fields["sourceInfo"] = f"built from the Debian source package {source} {source_version}"
            spdx_id = _spdx_id("dpkg", name, f"{path}\0{name}\0{arch}")
            out[spdx_id] = _package(spdx_id, name, version, created, facts, **fields)
    return list(out.values())


def _metadata(files: dict[str, sizes.File], dist_info: str) -> tuple[str, str, str]:
    """(name, version, licence expression) of one dist-info: METADATA, else its directory's name."""
    f = files.get(dist_info + "/METADATA")
    headers = BytesHeaderParser().parsebytes(f.text) if f is not None and f.text is not None else {}
    stem = posixpath.basename(dist_info).removesuffix(".dist-info")
    name, version = headers.get("Name") or stem.rsplit("-", 1)[0], headers.get("Version") or stem.rpartition("-")[2]
    licence = license_expression(headers.get("License-Expression") or headers.get("License") or "")
    return str(name).strip(), str(version).strip(), licence


def _dist_info_packages(files: dict[str, sizes.File], created: str) -> list[dict]:
    out = []
    for d in _dist_infos(files):
        name, version, licence = _metadata(files, d)
        record = files.get(d + "/RECORD")
        facts = {"kind": "dist-info", "path": d, "distribution": _canonical(name)}
        fields = {"licenseDeclared": licence, "comment": f"installed at {d}",
                  "externalRefs": [_purl_ref(f"pkg:pypi/{_pct(_canonical(name))}@{_pct(version)}")]}
        if record is not None:
            facts["record_sha256"] = record.sha256
            fields["checksums"] = [{"algorithm": "SHA256", "checksumValue": record.sha256}]
        out.append(_package(_spdx_id("dist-info", name, d), name, version, created, facts, **fields))
    return out


def source_of(ref: str) -> dict[str, str]:
    """A package's source label (resolve.Source.ref) as facts: git (repository, commit or an unpinned tag), or an
    sdist / local tree / index wheel with its sha256."""
    m = re.fullmatch(r"(?:(local|index):)?(.+)@sha256:([0-9a-f]{64})", ref)
    if m:
        return {"kind": m.group(1) or "sdist", "filename": m.group(2), "sha256": m.group(3)}
    repository, at, pin = ref.rpartition("@")
    if not at:
        return {"kind": "unknown", "ref": ref}
    if pin.endswith(" (unpinned tag)"):
        return {"kind": "git", "repository": repository, "tag": pin.removesuffix(" (unpinned tag)")}
    return {"kind": "git", "repository": repository, "commit": pin}


def compiled_names(labels: dict[str, str]) -> list[str]:
    """The packages the labels say builder compiled: those with an audit (labels.AUDITED)."""
    return [n for n in labels_mod.packages(labels) if labels_mod.package(n, "sass") in labels]


def _compiled_packages(labels: dict[str, str], created: str) -> list[dict]:
    archs = [int(a) for a in labels.get(labels_mod.ARCHS, "").split(",") if a.strip().isdigit()]
    out = []
    for name in compiled_names(labels):
        said = labels_mod.package_facts(labels, name)
        source = source_of(said["source"])
        facts = {"kind": "compiled", "name": name, "version": said["version"], "source": source,
                 "archs": archs, "sass": said["sass"], "ptx": said["ptx"], "binaries": said["binaries"],
                 "cuda": labels.get(labels_mod.CUDA, ""), "nvcc": labels.get(labels_mod.CUDA, ""),
                 "torch": labels.get(labels_mod.TORCH, ""), "python": labels.get(labels_mod.PYTHON, ""),
                 "cell": labels.get(labels_mod.CELL, ""), "cache_key": said["cache-key"], "route": said["route"],
                 "binary_kinds": labels.get(labels_mod.package(name, "binary-kinds"), "")}
        fields = {"sourceInfo": f"compiled by builder from {said['source'] or 'an unnamed source'}",
                  "primaryPackagePurpose": "LIBRARY",
                  "comment": (f"archs {','.join(map(str, archs))}; SASS {','.join(said['sass']) or 'none'}; "
                              f"PTX {','.join(said['ptx']) or 'none'}; CUDA {facts['cuda']}; torch {facts['torch']}"),
                  "externalRefs": [_purl_ref(f"pkg:pypi/{_pct(_canonical(name))}@{_pct(said['version'])}")]}
        if source["kind"] == "git" and source.get("commit") and re.match(r"(https?|ssh|git)://", source["repository"]):
            fields["downloadLocation"] = f"git+{source['repository']}@{source['commit']}"
        out.append(_package(_spdx_id("compiled", name, name), name, said["version"], created, facts, **fields))
    return out


def _jit_packages(files: dict[str, sizes.File], labels: dict[str, str], created: str) -> list[dict]:
    root = labels_mod.cache_root(labels).rstrip("/")
    if not root:
        return []
    caches = {directory.rstrip("/"): variable for variable, directory in labels_mod.cache_env(labels).items()}
    warm = labels_mod.warm(labels)
    problem = labels_mod.warm_problem(labels)
    grouped: dict[str, list[str]] = {}
    for path in files:
        if path.startswith(root + "/"):
            # the deepest cache directory that holds it; the root itself for a file of none
            home = max((d for d in caches if path.startswith(d + "/")), key=len, default=root)
            grouped.setdefault(home, []).append(path)
    out = []
    for directory, paths in sorted(grouped.items()):
        listing = "".join(f"{files[p].sha256}  {posixpath.relpath(p, directory)}\n" for p in sorted(paths))
        variable = caches.get(directory, "")
        facts = {"kind": "jit", "variable": variable, "directory": directory, "files": len(paths),
                 "bytes": sum(files[p].size for p in paths if not files[p].linked),
                 "content_sha256": hashlib.sha256(listing.encode()).hexdigest()}
        comment = f"{facts['files']} files, {facts['bytes']} bytes under {directory}"
        if warm:
            facts["warm"] = {"problem": problem} if problem else warm
            comment += (f"; from a warm layer ({problem})" if problem else
                        f"; from a warm layer over {warm['of']}, warmed for {warm['strategy']} on {warm['gpu']}, "
                        f"key {warm['key']}")
        name = f"compile cache {variable}" if variable else f"cache root {directory}"
        out.append(_package(_spdx_id("jit", variable or "root", directory), name, "", created, facts,
                            primaryPackagePurpose="OTHER", comment=comment))
    return out


def _image_package(walked: sizes.Walk, labels: dict[str, str], created: str) -> dict:
    image = walked.image
    name = labels.get(labels_mod.CELL) or labels.get(labels_mod.OCI_TITLE) or "image"
    version = labels.get(labels_mod.OCI_VERSION) or labels.get(labels_mod.ENGINE_VERSION, "")
    algo, _, hexpart = image.manifest_digest.partition(":")
    arch = image.config.get("architecture", "")
    purl = (f"pkg:oci/{_pct(_canonical(name).replace(' ', '-'))}@{_pct(image.manifest_digest)}"
            + (f"?arch={_pct(arch)}" if arch else ""))
    facts = {"kind": "image", "digest": image.digest, "manifest": image.manifest_digest,
             "labels": labels_mod.image_wide(labels)}
    return _package(IMAGE_ID, name, version, created, facts, primaryPackagePurpose="CONTAINER",
                    checksums=[{"algorithm": algo.upper(), "checksumValue": hexpart}],
                    externalRefs=[_purl_ref(purl)])


def _device_files(files: dict[str, sizes.File], owners: dict[str, str], created: str) -> list[dict]:
    out = []
    for path, f in sorted(files.items()):
        if not f.entries:
            continue
        sass, ptx = _coverage(f.entries)
        facts = {"kind": "device-code", "path": path, "sass": sass, "ptx": ptx, "owner": owners.get(path, "")}
        out.append({"SPDXID": _spdx_id("File", posixpath.basename(path), path), "fileName": "." + path,
                    "fileTypes": ["BINARY"],
                    "checksums": [{"algorithm": "SHA1", "checksumValue": f.sha1},
                                  {"algorithm": "SHA256", "checksumValue": f.sha256}],
                    "comment": f"device code: SASS {','.join(sass) or 'none'}; PTX {','.join(ptx) or 'none'}",
                    "annotations": _annotation(created, facts)})
    return out


# -- the document ---------------------------------------------------------------------------------------------
def make(archive: Path, *, created: str | None = None, say=lambda line: None) -> dict:
    """The SPDX 2.3 document of the archive's image (see the module's docstring). `created` (RFC 3339) stands for
    the image config's own creation time."""
    walked = sizes.walk(archive, keep=_kept, say=say)
    labels, files, image = _labels(walked), walked.files, walked.image
    when = created or image.config.get("created")
    if not when:
        raise UserError(f"{archive}: the image config has no created time: give the SBOM's creation time")
    when = _timestamp(when, "created" if created else f"{archive}: the image config's created")
    root = _image_package(walked, labels, when)
    dpkg, dist_infos = _dpkg_packages(files, when), _dist_info_packages(files, when)
    compiled, jit = _compiled_packages(labels, when), _jit_packages(files, labels, when)
    owners = _owners(files)
    device = _device_files(files, owners, when)
    say(f"SBOM: {len(dpkg)} Debian packages, {len(dist_infos)} dist-infos, {len(compiled)} compiled, "
        f"{len(jit)} caches, {len(device)} binaries with device code")

    relationships = [("SPDXRef-DOCUMENT", "DESCRIBES", IMAGE_ID)]
    relationships += [(IMAGE_ID, "CONTAINS", p["SPDXID"]) for p in dpkg + dist_infos + compiled + jit]
    by_dist_info = {facts_of(p)["path"]: p for p in dist_infos}
    for c in compiled:
        said = facts_of(c)
        for p in dist_infos:  # the installed wheel: its distribution, of the version the labels name
            facts = facts_of(p)
            if (facts["distribution"] == _canonical(said["name"])
                    and _public(p.get("versionInfo", "")) == _public(said["version"])):
                relationships.append((p["SPDXID"], "EXPANDED_FROM_ARCHIVE", c["SPDXID"]))
    for f in device:
        owner = by_dist_info.get(facts_of(f)["owner"], root)
        owner["filesAnalyzed"] = True  # SPDX: a package that CONTAINS files has analysed them (those listed)
        relationships.append((owner["SPDXID"], "CONTAINS", f["SPDXID"]))

    hexpart = image.manifest_digest.partition(":")[2]
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{root['name']}@{image.manifest_digest}",
        "documentNamespace": f"https://spdx.org/spdxdocs/builder/{quote(root['name'], safe='')}-{hexpart}",
        "creationInfo": {"created": when, "creators": [TOOL]},
        "packages": [root, *dpkg, *dist_infos, *compiled, *jit],
        "files": device,
        "relationships": [{"spdxElementId": a, "relationshipType": kind, "relatedSpdxElement": b}
                          for a, kind, b in relationships],
    }


def counts(doc: dict) -> dict[str, int]:
    """Packages per source (dpkg, dist-info, compiled, jit: the caches, warm: those a warm layer filled) and the
    binaries with device code."""
    kinds = Counter(facts_of(p).get("kind") for p in doc.get("packages", []))
    return {"dpkg": kinds["dpkg"], "dist-info": kinds["dist-info"], "compiled": kinds["compiled"], "jit": kinds["jit"],
            "warm": sum(1 for p in doc.get("packages", []) if "warm" in facts_of(p)),
            "device-code files": sum(1 for f in doc.get("files", []) if facts_of(f).get("kind") == "device-code")}


def check_coverage(doc: dict, archive: Path) -> list[str]:
    """What the SBOM misses or misstates of the archive's image (empty: nothing): every dist-info of the image, every
    compiled package of its labels, and every binary with device code, its SASS / PTX those of its fatbin and, for
    a compiled package's binary, those its audit label claims (sass/ptx, or its own line in binaries)."""
    walked = sizes.walk(archive, keep=_kept)
    labels, files = _labels(walked), walked.files
    packages = {p["SPDXID"]: p for p in doc.get("packages", [])}
    problems = []

    present = set(_dist_infos(files))
    listed = {facts_of(p)["path"]: sid for sid, p in packages.items() if facts_of(p).get("kind") == "dist-info"}
    problems += [f"dist-info {d}: in the image, not in the SBOM" for d in sorted(present - set(listed))]
    problems += [f"dist-info {d}: in the SBOM, not in the image" for d in sorted(set(listed) - present)]

    said_files = {facts_of(f)["path"]: f for f in doc.get("files", []) if facts_of(f).get("kind") == "device-code"}
    for path, f in sorted(files.items()):
        if not f.entries:
            continue
        if path not in said_files:
            problems.append(f"binary {path}: has device code, not in the SBOM")
        elif (said := facts_of(said_files[path])) and [said["sass"], said["ptx"]] != list(_coverage(f.entries)):
            problems.append(f"binary {path}: the SBOM says SASS {said['sass']} PTX {said['ptx']}, its fatbin holds "
                            f"SASS {_coverage(f.entries)[0]} PTX {_coverage(f.entries)[1]}")

    return problems + check_labels(doc, labels)


def check_labels(doc: dict, labels: dict[str, str]) -> list[str]:
    """What the SBOM and the image's audit labels disagree on (empty: nothing): every compiled package of the labels
    is in the SBOM, and every binary with device code of its installed dist-info(s) holds the SASS / PTX the label
    claims (its own line in binaries, else the package's sass/ptx). Needs no layer: `builder verify` runs it on the
    registry's config and the attached SBOM."""
    packages = {p["SPDXID"]: p for p in doc.get("packages", [])}
    problems = []
    compiled = {facts_of(p)["name"]: sid for sid, p in packages.items() if facts_of(p).get("kind") == "compiled"}
    problems += [f"compiled package {n}: in the image's labels, not in the SBOM"
                 for n in compiled_names(labels) if n not in compiled]

    # the audit label of each compiled package against the binaries of its installed dist-info(s)
    contains = {r["relatedSpdxElement"]: r["spdxElementId"] for r in doc.get("relationships", [])
                if r["relationshipType"] == "CONTAINS"}
    expanded = [(r["spdxElementId"], r["relatedSpdxElement"]) for r in doc.get("relationships", [])
                if r["relationshipType"] == "EXPANDED_FROM_ARCHIVE"]
    for name in compiled_names(labels):
        if name not in compiled:
            continue
        said = labels_mod.package_facts(labels, name)
        dist_infos = {facts_of(packages[d])["path"]: d for d, c in expanded if c == compiled[name] and d in packages}
        if not dist_infos:
            problems.append(f"compiled package {name}: no installed dist-info of it in the SBOM")
            continue
        binaries = {}
        for f in doc.get("files", []):
            facts = facts_of(f)
            if facts.get("kind") != "device-code":
                continue
            owner = packages.get(contains.get(f["SPDXID"], ""), {})
            dist_info = facts_of(owner).get("path")
            if dist_info in dist_infos and audit.is_shared_lib(facts["path"]):
                binaries[posixpath.relpath(facts["path"], posixpath.dirname(dist_info))] = facts
        for rel, facts in sorted(binaries.items()):
            claim = said["binaries"].get(rel, {"sass": said["sass"], "ptx": said["ptx"]})
            if set(facts["sass"]) != set(claim["sass"]) or set(facts["ptx"]) != set(claim["ptx"]):
                problems.append(f"compiled package {name}: {rel}: the SBOM says SASS {facts['sass']} PTX "
                                f"{facts['ptx']}, the audit label SASS {claim['sass']} PTX {claim['ptx']}")
        problems += [f"compiled package {name}: {rel}: in the audit label, no binary of the SBOM"
                     for rel in sorted(set(said["binaries"]) - set(binaries))]
        if (said["sass"] or said["ptx"]) and not binaries:
            problems.append(f"compiled package {name}: the audit label claims device code, the SBOM holds no binary "
                            "of it with device code")
    return problems


# -- CycloneDX ------------------------------------------------------------------------------------------------
def to_cyclonedx(doc: dict) -> dict:
    """The SPDX document as CycloneDX 1.5 JSON (cyclonedx-python-lib, the `sbom` extra): the image is the BOM's
    component, every other package a component of it, each binary a file component inside its owner; builder's
    facts are properties "builder:<key>" (a JSON value where it is no string). Serial number and timestamp derive
    from the document, so the same document gives the same BOM."""
    try:
        from cyclonedx.model import HashAlgorithm, HashType, Property
        from cyclonedx.model.bom import Bom, BomMetaData
        from cyclonedx.model.component import Component, ComponentType
        from cyclonedx.model.license import LicenseExpression
        from cyclonedx.output.json import JsonV1Dot5
        from packageurl import PackageURL
    except ImportError:
        raise UserError("CycloneDX output needs cyclonedx-python-lib: pip install 'builder[sbom]'") from None
    import uuid

    algorithms = {"SHA1": HashAlgorithm.SHA_1, "SHA256": HashAlgorithm.SHA_256}
    types = {"image": ComponentType.CONTAINER, "jit": ComponentType.DATA, "device-code": ComponentType.FILE}
    expanded = {r["spdxElementId"]: r["relatedSpdxElement"] for r in doc["relationships"]
                if r["relationshipType"] == "EXPANDED_FROM_ARCHIVE"}

    def component(element: dict) -> Component:
        facts = facts_of(element)
        if element["SPDXID"] in expanded:
            facts = facts | {"expanded_from": expanded[element["SPDXID"]]}
        purls = [r["referenceLocator"] for r in element.get("externalRefs", []) if r["referenceType"] == "purl"]
        licence = element.get("licenseDeclared", "NOASSERTION")
        return Component(
            name=element.get("name") or element["fileName"], version=element.get("versionInfo"),
            type=types.get(facts.get("kind"), ComponentType.LIBRARY), bom_ref=element["SPDXID"],
            purl=PackageURL.from_string(purls[0]) if purls else None, description=element.get("comment"),
            hashes=[HashType(alg=algorithms[c["algorithm"]], content=c["checksumValue"])
                    for c in element.get("checksums", []) if c["algorithm"] in algorithms],
            licenses=[LicenseExpression(licence)] if licence not in ("NOASSERTION", "NONE") else None,
            properties=[Property(name=f"builder:{k}", value=v if isinstance(v, str) else json.dumps(v, sort_keys=True))
                        for k, v in sorted(facts.items())])

    components = {e["SPDXID"]: component(e) for e in doc["packages"] + doc.get("files", [])}
    root = components.pop(IMAGE_ID)
    nested = set()
    for r in doc["relationships"]:
        inner = r["relatedSpdxElement"]
        if r["relationshipType"] == "CONTAINS" and r["spdxElementId"] != IMAGE_ID and inner in components:
            components[r["spdxElementId"]].components.add(components[inner])
            nested.add(inner)
    created = datetime.strptime(doc["creationInfo"]["created"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, doc["documentNamespace"]),
              metadata=BomMetaData(component=root, timestamp=created),
              components=[c for sid, c in components.items() if sid not in nested])
    bom.register_dependency(root, [c for sid, c in components.items() if sid not in nested])
    return json.loads(JsonV1Dot5(bom).output_as_string())
