"""builder/image/sbom.py: the SPDX 2.3 SBOM of an image, made from a real OCI archive (two zstd layers, the second
whiting out a distribution and adding one) holding a dpkg status file, dist-infos at two site directories, real
nvcc-built libraries with device code, a compiled package's labels and a warm cache root; validated by spdx-tools'
own parser and validator."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from license_expression import get_spdx_licensing
from packageurl import PackageURL
from spdx_tools.spdx.parser.parse_anything import parse_file
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

from builder.audit import read_fatbin_entries
from builder.errors import UserError
from builder.image import labels, oci, sbom
from builder.resolve import Source
from tests.helpers import zstd_layer
from tests.support import audit as support

built = support.built
host_cc = support.host_cc
SITE = "opt/venv/lib/python3.12/site-packages"
DIST = "usr/lib/python3/dist-packages"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
COLD = "sha256:" + "c" * 64

STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u7
Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: libstdc++6
Status: install ok installed
Architecture: amd64
Source: gcc-12 (12.2.0-14)
Version: 12.2.0-14
Maintainer: Debian GCC Maintainers <debian-gcc@lists.debian.org>

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b7
Maintainer: Matthias Klose <doko@debian.org>

Package: removed-tool
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1
Maintainer: Someone <someone@example.org>
"""


def _dist(site: str, name: str, version: str, licence: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """A dist-info with its files: METADATA, and a RECORD listing them with their hashes (as pip writes it)."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{licence}\n\nA description.\n".encode()
    rows = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for p, d in {**files, f"{info}/METADATA": metadata}.items()]
    record = ("\n".join(rows + [f"{info}/RECORD,,"]) + "\n").encode()
    return {f"{site}/{p}": d for p, d in {**files, f"{info}/METADATA": metadata, f"{info}/RECORD": record}.items()}


def _labels(binaries: dict) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": "vllm 0.33.0", "org.opencontainers.image.version": "0.33.0",
        labels.CELL: "vllm-0.33.0-cu130-torch2.9.0-py312-sm80.90", labels.ENGINE: "vllm",
        labels.ENGINE_VERSION: "0.33.0", labels.CUDA: "13.0", labels.TORCH: "2.9.0", labels.PYTHON: "3.12",
        labels.ARCHS: "80,90", labels.CACHE_ROOT: "/opt/jit-cache",
        labels.CACHE_ENV: "VLLM_CACHE_ROOT=/opt/jit-cache/vllm TRITON_CACHE_DIR=/opt/jit-cache/triton",
        labels.package("foo-kernels", "version"): "1.0",
        labels.package("foo-kernels", "source"): f"https://github.com/example/foo@{COMMIT}",
        labels.package("foo-kernels", "cache-key"): "k" * 16,
        labels.package("foo-kernels", "sass"): "sm_80,sm_90", labels.package("foo-kernels", "ptx"): "",
        labels.package("foo-kernels", "binaries"): json.dumps(binaries, sort_keys=True) if binaries else "",
        labels.package("foo-kernels", "binary-kinds"): "CUDA kernels; bound to torch 2.9.0",
        # a package builder installs from the index without an audit: not compiled
        labels.package("tokenizers", "version"): "0.21.0",
        labels.package("tokenizers", "source"): "index:tokenizers-0.21.0-cp39-abi3-manylinux.whl@sha256:" + "a" * 64,
        **dict(labels.warm_written({"strategy": "baseline", "gpu": "NVIDIA H100", "gpu-arch": "sm90", "files": 3,
                                    "key": json.dumps({"vllm": "abc123"})}, COLD)),
    }


@pytest.fixture(scope="module")
def image(built, tmp_path_factory) -> dict:
    """The archive and what went into it."""
    root = tmp_path_factory.mktemp("sbom")
    libk, libp, libsys = (built[n].read_bytes() for n in ("sm80_sm90", "ptx80", "sm90a"))
    first = {"var/lib/dpkg/status": STATUS.encode(), "usr/lib/os-release": b'ID=debian\nVERSION_ID="12"\n',
             "usr/local/lib/libsys.so": libsys,  # device code no RECORD lists: the image's own
             **_dist(SITE, "foo_kernels", "1.0+cu130", "License-Expression: apache-2.0 OR mit",
                     {"foo_kernels/__init__.py": b"", "foo_kernels/libk.so": libk, "foo_kernels/libp.so": libp}),
             **_dist(SITE, "old", "1.0", "License: MIT", {"old/__init__.py": b"gone"}),
             **_dist(SITE, "six", "1.16.0", "License: MIT", {"six.py": b"# six"}),
             **_dist(DIST, "six", "1.16.0", "License: MIT", {"six.py": b"# six"}),  # a second copy elsewhere
             "opt/jit-cache/vllm/torch_compile_cache/abc/rank_0_0/model.py": b"graph",
             "opt/jit-cache/triton/K1/kernel.cubin": b"cubin" * 100, "opt/jit-cache/stray.lock": b""}
    second = {f"{SITE}/.wh.old-1.0.dist-info": b"", f"{SITE}/.wh.old": b"",
              **_dist(SITE, "New.Package", "3.0", "License: MIT License\n (the whole text)", {"new_package.py": b""})}
    config = {"architecture": "amd64", "os": "linux", "created": "2026-01-02T03:04:05.123456789Z",
              "config": {"Labels": _labels({"foo_kernels/libp.so": {"sass": [], "ptx": ["compute_80"]}})},
              "history": [{"created_by": "RUN base"}, {"created_by": "RUN pip install"}]}
    path = root / "image.oci.tar"
    digest = oci.write_archive(path, config, [("application/vnd.oci.image.layer.v1.tar+zstd", zstd_layer(layer))
                                              for layer in (first, second)])[0]
    return {"path": path, "digest": digest, "config": config, "layers": (first, second), "root": root,
            "entries": {n: read_fatbin_entries(built[n]) for n in ("sm80_sm90", "ptx80", "sm90a")}}


@pytest.fixture(scope="module")
def doc(image) -> dict:
    return sbom.make(image["path"])


def _by(doc: dict, kind: str) -> list[dict]:
    return [p for p in doc["packages"] if sbom.facts_of(p).get("kind") == kind]


def _purls(package: dict) -> list[str]:
    return [r["referenceLocator"] for r in package.get("externalRefs", []) if r["referenceType"] == "purl"]


def _relationships(doc: dict, kind: str) -> set[tuple[str, str]]:
    return {(r["spdxElementId"], r["relatedSpdxElement"]) for r in doc["relationships"] if r["relationshipType"] == kind}


def test_spdx_tools_parses_and_validates_the_document(doc, tmp_path):
    path = tmp_path / "image.spdx.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    parsed = parse_file(str(path))
    assert [m.validation_message for m in validate_full_spdx_document(parsed)] == []
    assert len(parsed.packages) == len(doc["packages"]) and len(parsed.files) == 3


def test_the_image_is_the_documents_subject_and_contains_every_other_package(image, doc):
    manifest = image["digest"]
    assert doc["documentNamespace"].endswith(manifest.removeprefix("sha256:"))
    assert doc["name"] == f"vllm-0.33.0-cu130-torch2.9.0-py312-sm80.90@{manifest}"
    assert doc["creationInfo"] == {"created": "2026-01-02T03:04:05Z", "creators": [f"Tool: builder-{sbom.__version__}"]}
    root = doc["packages"][0]
    assert root["SPDXID"] == sbom.IMAGE_ID and root["checksums"] == [{"algorithm": "SHA256",
                                                                    "checksumValue": manifest[7:]}]
    purl = PackageURL.from_string(_purls(root)[0])
    assert (purl.type, purl.version, purl.qualifiers) == ("oci", manifest, {"arch": "amd64"})
    said = sbom.facts_of(root)["labels"]  # what the image says of itself; its packages are packages of their own
    assert said[labels.CUDA] == "13.0" and said[labels.WARM_OF] == COLD and not any(".package." in k for k in said)
    assert _relationships(doc, "DESCRIBES") == {("SPDXRef-DOCUMENT", sbom.IMAGE_ID)}
    assert {b for a, b in _relationships(doc, "CONTAINS") if a == sbom.IMAGE_ID} >= {
        p["SPDXID"] for p in doc["packages"][1:]}


def test_the_debian_packages_of_the_base_with_purls_suppliers_and_sources(doc):
    dpkg = {p["name"]: p for p in _by(doc, "dpkg")}
    assert sorted(dpkg) == ["bash", "libc6", "libstdc++6"]  # the removed package's config files are not it
    purl = PackageURL.from_string(_purls(dpkg["libstdc++6"])[0])
    assert (purl.type, purl.namespace, purl.name, purl.version, purl.qualifiers) == (
        "deb", "debian", "libstdc++6", "12.2.0-14", {"arch": "amd64", "distro": "debian-12"})
    assert PackageURL.from_string(_purls(dpkg["libc6"])[0]).version == "2.36-9+deb12u7"
    assert dpkg["libc6"]["supplier"] == "Organization: GNU Libc Maintainers (debian-glibc@lists.debian.org)"
    assert dpkg["bash"]["supplier"] == "Person: Matthias Klose (doko@debian.org)"
    # the source package when it differs (by name, or by version), not when it is the package itself
    assert sbom.facts_of(dpkg["libc6"])["source"] == {"name": "glibc", "version": "2.36-9+deb12u7"}
    assert sbom.facts_of(dpkg["libstdc++6"])["source"] == {"name": "gcc-12", "version": "12.2.0-14"}
    assert "source" not in sbom.facts_of(dpkg["bash"]) and "sourceInfo" not in dpkg["bash"]


def test_every_dist_info_of_the_final_filesystem_and_no_other(image, doc):
    found = {sbom.facts_of(p)["path"]: p for p in _by(doc, "dist-info")}
    assert sorted(found) == sorted([f"/{SITE}/foo_kernels-1.0+cu130.dist-info", f"/{SITE}/six-1.16.0.dist-info",
                                    f"/{DIST}/six-1.16.0.dist-info", f"/{SITE}/New.Package-3.0.dist-info"])
    assert not any("old" in path for path in found)  # whited out by the second layer
    six = [found[f"/{SITE}/six-1.16.0.dist-info"], found[f"/{DIST}/six-1.16.0.dist-info"]]
    assert six[0]["SPDXID"] != six[1]["SPDXID"] and six[0]["comment"] == f"installed at /{SITE}/six-1.16.0.dist-info"
    assert six[0]["licenseDeclared"] == "MIT" and _purls(six[0]) == ["pkg:pypi/six@1.16.0"]
    foo = found[f"/{SITE}/foo_kernels-1.0+cu130.dist-info"]
    assert foo["licenseDeclared"] == "Apache-2.0 OR MIT"  # an expression, its ids' case corrected
    assert PackageURL.from_string(_purls(foo)[0]).to_dict()["name"] == "foo-kernels"
    new = found[f"/{SITE}/New.Package-3.0.dist-info"]
    assert new["licenseDeclared"] == "NOASSERTION"  # free text is no SPDX expression
    record = image["layers"][1][f"{SITE}/New.Package-3.0.dist-info/RECORD"]
    assert new["checksums"] == [{"algorithm": "SHA256", "checksumValue": hashlib.sha256(record).hexdigest()}]


def test_the_compiled_package_its_source_archs_audit_and_toolchain(doc):
    [compiled] = _by(doc, "compiled")  # tokenizers has no audit: installed, not compiled
    facts = sbom.facts_of(compiled)
    assert compiled["name"] == "foo-kernels" and compiled["versionInfo"] == "1.0"
    assert compiled["downloadLocation"] == f"git+https://github.com/example/foo@{COMMIT}"
    assert facts["source"] == {"kind": "git", "repository": "https://github.com/example/foo", "commit": COMMIT}
    assert (facts["archs"], facts["sass"], facts["ptx"]) == ([80, 90], ["sm_80", "sm_90"], [])
    assert facts["binaries"] == {"foo_kernels/libp.so": {"sass": [], "ptx": ["compute_80"]}}
    assert (facts["cuda"], facts["nvcc"], facts["torch"], facts["python"]) == ("13.0", "13.0", "2.9.0", "3.12")
    # the installed wheel (its local version +cu130 aside) is expanded from it; the other dist-infos are not
    [(dist_info, archive)] = _relationships(doc, "EXPANDED_FROM_ARCHIVE")
    assert archive == compiled["SPDXID"]
    assert sbom.facts_of(next(p for p in doc["packages"] if p["SPDXID"] == dist_info))["distribution"] == "foo-kernels"


def test_each_binary_with_device_code_holds_the_archs_of_its_fatbin_and_belongs_to_its_owner(image, doc):
    files = {sbom.facts_of(f)["path"]: f for f in doc["files"]}
    assert sorted(files) == [f"/{SITE}/foo_kernels/libk.so", f"/{SITE}/foo_kernels/libp.so", "/usr/local/lib/libsys.so"]
    for path, name in [(f"/{SITE}/foo_kernels/libk.so", "sm80_sm90"), (f"/{SITE}/foo_kernels/libp.so", "ptx80"),
                       ("/usr/local/lib/libsys.so", "sm90a")]:
        entries = image["entries"][name]
        facts = sbom.facts_of(files[path])
        assert set(facts["sass"]) == {e.name for e in entries if e.kind == "sass"}
        assert set(facts["ptx"]) == {e.name for e in entries if e.kind == "ptx"}
        data = next(layer[path[1:]] for layer in image["layers"] if path[1:] in layer)
        assert {c["algorithm"]: c["checksumValue"] for c in files[path]["checksums"]} == {
            "SHA1": hashlib.sha1(data).hexdigest(), "SHA256": hashlib.sha256(data).hexdigest()}
    assert sbom.facts_of(files["/usr/local/lib/libsys.so"])["sass"] == ["sm_90a"]
    owner = {b: a for a, b in _relationships(doc, "CONTAINS")}
    foo = next(p for p in _by(doc, "dist-info") if p["name"] == "foo_kernels")
    assert owner[files[f"/{SITE}/foo_kernels/libk.so"]["SPDXID"]] == foo["SPDXID"] and foo["filesAnalyzed"]
    assert owner[files["/usr/local/lib/libsys.so"]["SPDXID"]] == sbom.IMAGE_ID


def test_the_caches_under_the_root_one_package_each_with_the_warm_layers_facts(image, doc):
    jit = {sbom.facts_of(p)["directory"]: sbom.facts_of(p) for p in _by(doc, "jit")}
    assert sorted(jit) == ["/opt/jit-cache", "/opt/jit-cache/triton", "/opt/jit-cache/vllm"]
    triton = jit["/opt/jit-cache/triton"]
    assert (triton["variable"], triton["files"], triton["bytes"]) == ("TRITON_CACHE_DIR", 1, 500)
    listing = f"{hashlib.sha256(b'cubin' * 100).hexdigest()}  K1/kernel.cubin\n"  # sha256sum's own format
    assert triton["content_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    assert jit["/opt/jit-cache"]["variable"] == "" and jit["/opt/jit-cache"]["files"] == 1  # stray.lock
    assert triton["warm"]["of"] == COLD and json.loads(triton["warm"]["key"]) == {"vllm": "abc123"}
    comment = next(p for p in _by(doc, "jit") if sbom.facts_of(p)["variable"] == "VLLM_CACHE_ROOT")["comment"]
    assert "warm layer" in comment and '{"vllm": "abc123"}' in comment
    assert sbom.counts(doc) == {"dpkg": 3, "dist-info": 4, "compiled": 1, "jit": 3, "warm": 3, "device-code files": 3}


def test_the_same_archive_gives_the_same_bytes_and_the_time_can_be_given(image, doc):
    again = sbom.make(image["path"])
    assert json.dumps(again, sort_keys=True) == json.dumps(doc, sort_keys=True)
    given = sbom.make(image["path"], created="2026-03-01T10:00:00+02:00")
    assert given["creationInfo"]["created"] == "2026-03-01T08:00:00Z"
    with pytest.raises(UserError, match="not a time"):
        sbom.make(image["path"], created="yesterday")


def test_coverage_holds_and_names_what_a_tampered_sbom_misses(image, doc):
    assert sbom.check_coverage(doc, image["path"]) == []
    # a dist-info dropped
    dropped = json.loads(json.dumps(doc))
    dropped["packages"] = [p for p in dropped["packages"] if p["name"] != "six" or "/usr/" not in p["comment"]]
    assert sbom.check_coverage(dropped, image["path"]) == [f"dist-info /{DIST}/six-1.16.0.dist-info: in the image, "
                                                            "not in the SBOM"]
    # a binary's archs changed: its fatbin and its audit label both disagree
    changed = json.loads(json.dumps(doc))
    libk = next(f for f in changed["files"] if f["fileName"].endswith("/libk.so"))
    facts = sbom.facts_of(libk) | {"sass": ["sm_80"]}
    libk["annotations"][0]["comment"] = json.dumps(facts, sort_keys=True)
    problems = sbom.check_coverage(changed, image["path"])
    assert len(problems) == 2
    assert problems[0].startswith(f"binary /{SITE}/foo_kernels/libk.so: the SBOM says SASS ['sm_80']")
    assert problems[1].startswith("compiled package foo-kernels: foo_kernels/libk.so: the SBOM says SASS ['sm_80']")
    # the compiled package dropped
    no_compiled = json.loads(json.dumps(doc))
    no_compiled["packages"] = [p for p in no_compiled["packages"] if sbom.facts_of(p).get("kind") != "compiled"]
    assert sbom.check_coverage(no_compiled, image["path"]) == [
        "compiled package foo-kernels: in the image's labels, not in the SBOM"]


def test_an_audit_label_the_binaries_do_not_bear_out_is_a_problem(image, tmp_path):
    """The same image whose label claims libp.so carries SASS sm_90 (and nothing claims libk.so's sm_80): the
    SBOM, true to the fatbins, disagrees with the label."""
    config = json.loads(json.dumps(image["config"]))
    config["config"]["Labels"] = _labels({"foo_kernels/libp.so": {"sass": ["sm_90"], "ptx": []}})
    path = tmp_path / "lying.oci.tar"
    oci.write_archive(path, config, [("application/vnd.oci.image.layer.v1.tar+zstd", zstd_layer(layer))
                                     for layer in image["layers"]])
    problems = sbom.check_coverage(sbom.make(path), path)
    assert problems == ["compiled package foo-kernels: foo_kernels/libp.so: the SBOM says SASS [] PTX ['compute_80'], "
                        "the audit label SASS ['sm_90'] PTX []"]


def test_a_source_label_reads_back_as_what_resolve_wrote():
    cases = [Source("git", repository="https://github.com/vllm-project/vllm", commit=COMMIT),
             Source("sdist", filename="vllm-0.33.0.tar.gz", sha256="b" * 64),
             Source("index", filename="flash_attn-2.8.3-cp312.whl", sha256="d" * 64),
             Source("local", path="/src/my-kernels", sha256="e" * 64)]
    assert [sbom.source_of(s.ref) for s in cases] == [
        {"kind": "git", "repository": "https://github.com/vllm-project/vllm", "commit": COMMIT},
        {"kind": "sdist", "filename": "vllm-0.33.0.tar.gz", "sha256": "b" * 64},
        {"kind": "index", "filename": "flash_attn-2.8.3-cp312.whl", "sha256": "d" * 64},
        {"kind": "local", "filename": "my-kernels", "sha256": "e" * 64}]
    assert sbom.source_of(Source("git", repository="https://x.org/r", tag="v1").ref) == {
        "kind": "git", "repository": "https://x.org/r", "tag": "v1"}


def test_a_licence_is_stated_only_when_it_is_an_spdx_expression():
    said = {"MIT": "MIT", "apache-2.0 or mit": "Apache-2.0 OR MIT", "GPL-2.0-only WITH Classpath-exception-2.0":
            "GPL-2.0-only WITH Classpath-exception-2.0", "(MIT OR BSD-3-Clause) AND Apache-2.0":
            "(MIT OR BSD-3-Clause) AND Apache-2.0", "MIT License": "NOASSERTION", "(MIT": "NOASSERTION",
            "MIT WITH MIT": "NOASSERTION", "BSD": "NOASSERTION", "": "NOASSERTION", "MIT OR": "NOASSERTION"}
    assert {text: sbom.license_expression(text) for text in said} == said
    licensing = get_spdx_licensing()  # what spdx-tools validates against takes every expression stated
    assert all(not licensing.validate(v).invalid_symbols for v in said.values() if v != "NOASSERTION")


def test_the_licence_list_is_the_one_spdx_tools_validates_against():
    text = (Path(sbom.__file__).parents[1] / "data" / "spdx-license-ids.txt").read_text()
    lines = [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    licences, exceptions = [l[0] for l in lines if len(l) == 1], [l[0] for l in lines if l[1:] == ["exception"]]
    assert len(licences) > 600 and len(exceptions) > 50 and len(licences) + len(exceptions) == len(lines)
    licensing = get_spdx_licensing()
    assert [i for i in licences if licensing.validate(i).errors] == []
    assert [e for e in exceptions if licensing.validate(f"MIT WITH {e}").errors] == []


def test_the_cyclonedx_form_is_valid_and_holds_the_same_components(doc):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    bom = sbom.to_cyclonedx(doc)
    assert JsonStrictValidator(SchemaVersion.V1_5).validate_str(json.dumps(bom)) is None
    assert json.dumps(sbom.to_cyclonedx(doc), sort_keys=True) == json.dumps(bom, sort_keys=True)
    assert bom["metadata"]["component"]["bom-ref"] == sbom.IMAGE_ID and bom["metadata"]["timestamp"].startswith(
        "2026-01-02T03:04:05")
    top = {c["bom-ref"]: c for c in bom["components"]}
    assert len(top) == len(doc["packages"]) - 1 + 1  # every package but the image, and the image's own binary
    foo = next(c for c in top.values() if c["name"] == "foo_kernels")
    assert sorted(c["name"].rsplit("/", 1)[-1] for c in foo["components"]) == ["libk.so", "libp.so"]
    props = {p["name"]: p["value"] for p in next(c for c in top.values() if c["name"] == "foo-kernels")["properties"]}
    assert json.loads(props["builder:sass"]) == ["sm_80", "sm_90"] and props["builder:cuda"] == "13.0"
