"""`builder build` end to end on the real Docker engine: a small real CUDA package (tests/fixtures/cuda-ext)

The Docker half of tests/unit/builds/test_build.py: its docstring says the rest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from builder.audit import audit, read_fatbin_entries

from builder import pins
from builder.image import labels

from tests.helpers import CUDA_EXT_CELL as CELL
from tests.helpers import commit_image, fixture_copy
from tests.helpers import run_cli
from tests.support.build import FIXTURE, HOST_CA, MATRIX, build_args, builder

MATRIX_TWO = FIXTURE / "matrix-two.toml"


@pytest.fixture(scope="module")
def ca_bundle(tmp_path_factory) -> tuple[Path, str]:
    """The host CA bundle plus a unique marker line (text outside PEM blocks is ignored by TLS), so a test can
    prove the bundle never lands in a layer: the public certs themselves are in every base image."""
    marker = f"builder-secret-marker-{uuid.uuid4().hex}"
    path = tmp_path_factory.mktemp("ca") / "bundle.pem"
    path.write_text(f"# {marker}\n" + HOST_CA.read_text())
    return path, marker


def sass(entries) -> set[str]:
    return {e.name for e in entries if e.kind == "sass"}


def wheel_so(wheelhouse: Path, tmp: Path) -> Path:
    wheels = list(wheelhouse.glob("cuda-ext/*/*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        so = tmp / "libsaxpy.so"
        so.write_bytes(zf.read("cuda_ext/libsaxpy.so"))
    return so


@pytest.fixture(scope="module")
def built_80_90(local_bases, ca_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("b8090")
    res = builder(*build_args(tmp, ca_bundle[0], "--arch", "80,90"), cwd=tmp)
    return tmp, res


def test_build_compiles_exports_audits_and_tags(built_80_90, docker_engine):
    tmp, res = built_80_90
    assert res.returncode == 0, res.stdout + res.stderr
    cell = "cuda-ext-1.0.0-cu130-py311-sm80.90"
    ref = "127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90"
    # the closing table: cell, result, duration, tag, digest, wheels built / reused
    row = next(line for line in res.stdout.splitlines() if line.startswith(cell))
    assert re.search(rf"{cell}\s+ok\s+\d+s\s+{re.escape(ref)}\s+sha256:[0-9a-f]{{12}}", row), row
    assert "cuda-ext==1.0.0" in row
    # parallelism was chosen by the stated rule and printed
    assert re.search(r"build cuda-ext==1\.0\.0 .*MAX_JOBS=\d+ NVCC_THREADS=\d+ \(\d+ cores, [\d.]+ GB free", res.stderr)
    # the wheel left its build stage for the wheelhouse, with its manifest, and carries sm_80 + sm_90 SASS only
    so = wheel_so(tmp / "wheelhouse", tmp)
    assert sass(read_fatbin_entries(so)) == {"sm_80", "sm_90"}
    assert not [e for e in read_fatbin_entries(so) if e.kind == "ptx"]
    manifest = json.loads(next((tmp / "wheelhouse").glob("cuda-ext/*/builder-wheel.json")).read_text())
    assert manifest["audit"]["ok"] is True and manifest["audit"]["binaries_with_device_code"] == 1
    assert manifest["key_inputs"]["knobs"] == [["CUDA_EXT_ARCHS", "80;90"]]
    # a log per cell, holding the buildx output
    log = (tmp / "logs" / f"{cell}.log").read_text()
    assert "docker buildx build" in log and "--target wheels-cuda-ext" in log and "nvcc" in log
    # the tagged image runs its own import check and carries the labels
    labels = json.loads(subprocess.run(["docker", "image", "inspect", ref, "--format", "{{json .Config.Labels}}"],
                                       capture_output=True, text=True, check=True).stdout)
    assert labels["io.builder.archs"] == "80,90"
    assert labels["io.builder.package.cuda-ext.sass"] == "sm_80,sm_90"  # what the audit found (builder/image/labels.py)
    assert labels["io.builder.package.cuda-ext.ptx"] == "" and labels["io.builder.package.cuda-ext.binaries"] == ""
    # the runtime image has no compiler: it installed only the wheel
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", ref, "-c",
                          "command -v nvcc || echo no-nvcc; python -c 'import cuda_ext; print(cuda_ext.__file__)'"],
                         capture_output=True, text=True)
    assert "no-nvcc" in out.stdout and "/opt/venv/" in out.stdout, out.stdout + out.stderr
    # the image audit (docker export, fatbins read in Python) agrees
    report = run_cli("audit", ref, "--arch", "80,90")
    assert report.exit_code == 0, report.output
    # smoke ran the image under the run's own name, which went with the run: the image keeps the cell's tag only
    assert re.search(rf"name={re.escape(ref)}-run-[0-9a-f]{{8}}", log), log[-2000:]
    image_id = subprocess.run(["docker", "image", "inspect", ref, "--format", "{{.Id}}"], capture_output=True,
                              text=True, check=True).stdout.strip()
    names = subprocess.run(["docker", "image", "ls", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [n for n in names if "-run-" in n and n.startswith(image_id)], names


def test_ca_bundle_is_a_secret_not_a_layer(built_80_90, ca_bundle, docker_engine, tmp_path):
    tmp, res = built_80_90
    assert res.returncode == 0
    ref = "127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90"
    _, marker = ca_bundle
    history = subprocess.run(["docker", "history", "--no-trunc", ref], capture_output=True, text=True, check=True).stdout
    assert marker not in history and "ca-certificates.crt" not in history
    tar = tmp_path / "image.tar"
    subprocess.run(["docker", "save", "-o", str(tar), ref], check=True)
    assert marker.encode() not in tar.read_bytes()
    # the wheel stages saw it (pip reached PyPI through it) but the exported wheel does not carry it either
    for whl in (tmp / "wheelhouse").rglob("*.whl"):
        assert marker.encode() not in whl.read_bytes()


def test_unchanged_package_is_never_compiled_twice(built_80_90, ca_bundle, docker_engine):
    tmp, first = built_80_90
    assert first.returncode == 0
    plan = builder("plan", "--matrix", str(MATRIX), "--wheelhouse", str(tmp / "wheelhouse"), "--arch", "80,90", cwd=tmp)
    assert re.search(r"reuse\s+cuda-ext==1\.0\.0", plan.stdout), plan.stdout
    again = builder(*build_args(tmp, ca_bundle[0], "--arch", "80,90", "--json"), cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert "reuse cuda-ext==1.0.0" in again.stderr
    assert "--target wheels-cuda-ext" not in (tmp / "logs" / "cuda-ext-1.0.0-cu130-py311-sm80.90.log").read_text()
    # --json: every step's result; the reused wheel is audited again, not stored again, then tagged
    (cell,) = json.loads(again.stdout)
    steps = {s["step"]: s for s in cell["steps"]}
    assert list(steps)[:5] == ["compile", "audit", "cache", "image", "smoke"]
    (whl,) = (tmp / "wheelhouse").glob("cuda-ext/*/*.whl")
    assert steps["compile"]["status"] == "ok" and steps["compile"]["artifacts"]["reused"] is True
    assert steps["compile"]["artifacts"]["wheels"] == [{"file": whl.name, "sha256": hashlib.sha256(whl.read_bytes()).hexdigest(),
                                                       "bytes": whl.stat().st_size}]
    assert steps["audit"]["status"] == "ok" and steps["audit"]["artifacts"]["binaries_with_device_code"] == 1
    assert steps["cache"]["status"] == "skipped" and steps["cache"]["reason"] == "already in wheelhouse"
    assert steps["image"]["status"] == "ok" and steps["image"]["artifacts"]["digest"].startswith("sha256:")
    assert cell["result"] == "ok" and cell["reused"] == ["cuda-ext==1.0.0"] and cell["built"] == []
    # smoke ran on the tagged image: labels and versions (L0), imports and the audit inside it (L1)
    assert steps["smoke"]["status"] == "ok" and cell["smoke"]["status"] == "ok"
    layers = {(x["layer"], x["status"]) for x in steps["smoke"]["artifacts"]["layers"]}
    assert {("L0", "pass"), ("L1", "pass")} <= layers
    assert Path(steps["smoke"]["artifacts"]["junit"]).is_file()


def test_no_smoke_is_shown_skipped_with_the_reason(built_80_90, ca_bundle, docker_engine):
    tmp, first = built_80_90
    assert first.returncode == 0
    row = next(line for line in first.stdout.splitlines() if line.startswith("cuda-ext-1.0.0-cu130-py311-sm80.90"))
    assert row.rstrip().endswith(" ok"), row  # the smoke column of the first build
    res = builder(*build_args(tmp, ca_bundle[0], "--arch", "80,90", "--no-smoke"), cwd=tmp)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("cuda-ext-1.0.0-cu130-py311-sm80.90"))
    assert "skipped: --no-smoke" in row, res.stdout
    assert "cuda-ext-1.0.0-cu130-py311-sm80.90: smoke skipped: --no-smoke (nothing of this cell may be published)" in res.stdout


def test_arch_80_only_has_no_sm90_and_the_audit_says_so(local_bases, ca_bundle, tmp_path, docker_engine):
    res = builder(*build_args(tmp_path, ca_bundle[0], "--arch", "80"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    so = wheel_so(tmp_path / "wheelhouse", tmp_path)
    assert sass(read_fatbin_entries(so)) == {"sm_80"}
    wheel = next((tmp_path / "wheelhouse").glob("cuda-ext/*/*.whl"))
    report = run_cli("audit", str(wheel), "--arch", "80,90")
    assert report.exit_code == 1
    assert "FAIL" in report.output and "cuda_ext/libsaxpy.so: sm_90 missing (has SASS sm_80, no PTX)" in report.output
    assert audit(wheel, [80]).ok and not audit(wheel, [90]).ok
    assert audit(wheel, [86]).ok  # sm_80 SASS runs on 8.6


def test_a_knob_that_does_nothing_fails_the_audit_and_keep_going(local_bases, ca_bundle, tmp_path, docker_engine):
    """cuda-ext-badknob spells the knob CUDA_EXT_ARCH: the package silently builds its default (sm_80).
    The audit refuses that cell: no tag, no cache entry; --keep-going still builds the next cell."""
    bad_ref = "127.0.0.1:5000/builder-test/cuda-ext-badknob:1.0.0-cu130-py311-sm80.90"
    subprocess.run(["docker", "image", "rm", "-f", bad_ref], capture_output=True)
    res = builder(*build_args(tmp_path, ca_bundle[0], "--keep-going", matrix=MATRIX_TWO), cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "sm_90 missing (has SASS sm_80, no PTX)" in res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith("cuda-ext")}
    assert "FAILED" in rows["cuda-ext-badknob-1.0.0-cu130-py311-sm80.90"] and "(not tagged)" in rows["cuda-ext-badknob-1.0.0-cu130-py311-sm80.90"]
    assert " ok " in rows["cuda-ext-1.0.0-cu130-py311-sm80.90"]
    assert "audit failed for cuda-ext-badknob==1.0.0" in res.stdout
    inspect = subprocess.run(["docker", "image", "inspect", bad_ref], capture_output=True, text=True)
    assert inspect.returncode != 0, "a cell that failed its audit must not be tagged"
    assert not list((tmp_path / "wheelhouse").glob("cuda-ext-badknob/*")), "a failed wheel must not enter the cache"
    # without --keep-going the first failure stops the run
    res2 = builder(*build_args(tmp_path / "again", ca_bundle[0], matrix=MATRIX_TWO), cwd=tmp_path)
    assert res2.returncode == 1
    assert "cuda-ext-1.0.0-cu130-py311-sm80.90" not in res2.stdout


# slow: a second build; the default tier reads and checks pins files in tests/unit/matrix/test_pins_files.py
@pytest.mark.slow
def test_runtime_dependencies_are_pinned_after_the_first_build(built_80_90, ca_bundle, docker_engine):
    """The first build records every distribution the image holds but its own wheels (packaging, and setuptools
    with pip: the fixture requires setuptools, as vLLM 0.33.0's closure does, and pip's freeze leaves it out), each
    with its hashes; a later build installs exactly the pinned versions, even an older one than the index's
    newest."""
    tmp, first = built_80_90
    assert first.returncode == 0
    cell = "cuda-ext-1.0.0-cu130-py311-sm80.90"
    ref = "127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90"
    pins = tmp / "pins" / f"{cell}.txt"
    recorded = pins.read_text()
    assert re.search(r"^packaging==\d+\.\d+", recorded, re.M), recorded
    pinned = [l for l in recorded.splitlines() if not l.startswith("#")]
    assert not [l for l in pinned if l.startswith(("cuda-ext", "cuda_ext", "torch"))], pinned
    for tool in ("setuptools", "pip"):  # complete by construction: pip's own tools too, hash-locked
        assert re.search(rf"^{tool}==[^ ]+ --hash=sha256:[0-9a-f]{{64}}", recorded, re.M), recorded
    pins.write_text("packaging==23.2\n")
    again = builder(*build_args(tmp, ca_bundle[0], "--arch", "80,90"), cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert f"runtime dependencies pinned by {pins}" in again.stderr
    shown = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", ref, "-c",
                            "import packaging; print(packaging.__version__)"], capture_output=True, text=True)
    assert shown.stdout.strip() == "23.2", shown.stdout + shown.stderr
    assert pins.read_text() == "packaging==23.2\n"  # used, not rewritten


def test_every_external_command_is_logged_with_its_exact_argv(docker_engine, tmp_path):
    """`builder --debug` prints each docker / git command line (builder/docker.py) before it runs."""
    res = subprocess.run([sys.executable, "-m", "builder.cli", "--debug", "audit", "builder-test/no-such:image", "--arch", "80"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "no such file, directory or local image" in res.stderr
    assert "builder.commands: $ docker image inspect --format '{{.Id}}' builder-test/no-such:image" in res.stderr
    assert "builder.commands: $ docker info --format '{{.ServerVersion}}'" in res.stderr


# -- an unchanged cell costs seconds (the image's content key, builder/steps/image.py) -------------------------
def build_keyed(tmp: Path, matrix: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    ca = ["--ca-bundle", str(HOST_CA)]
    res = builder("build", "--matrix", str(matrix), "--wheelhouse", str(tmp / "wheelhouse"), "--work-dir",
                  str(tmp / "work"), "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"), "--no-smoke",
                  "--quiet", "--json", *ca, *extra, cwd=tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (image,) = [r for c in json.loads(res.stdout) for r in c["steps"] if r["step"] == "image"]
    return res, image


def content_label(ref: str) -> str:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", ref],
                         capture_output=True, text=True, check=True).stdout
    return labels.content_key(json.loads(out))


def image_id(ref: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


# slow: four builds; the default tier reuses a published image in tests/docker/image/test_registry_reuse.py
@pytest.mark.slow
def test_an_unchanged_cell_reuses_its_tagged_image_and_a_changed_one_is_built(built_80_90, local_bases, docker_engine,
                                                                               tmp_path):
    """The fixture cell under a registry of this test only, its wheel from the build above: the first build tags
    an image labelled with its content key; unchanged builds reuse it (seconds, the same digest, no export); an
    edited pin or a tag that moved to another image means a build."""
    shutil.copytree(built_80_90[0] / "wheelhouse", tmp_path / "wheelhouse")
    registry = f"127.0.0.1:5000/builder-test-ck{uuid.uuid4().hex[:8]}"
    m = fixture_copy(tmp_path, registry)
    ref = f"{registry}/cuda-ext:1.0.0-cu130-py311-sm80.90"
    log = tmp_path / "logs" / f"{CELL}.log"
    try:
        _, first = build_keyed(tmp_path, m)
        key, digest = first["artifacts"]["content_key"], first["artifacts"]["digest"]
        assert first["artifacts"]["reused"] is False and re.fullmatch(r"[0-9a-f]{64}", key)
        assert content_label(ref) == key  # on the image, in the work dir's record and in the pins file's header
        record = json.loads((tmp_path / "work" / CELL / "content-key.json").read_text())
        assert record["content_key"] == key and record["runtime_pins"].startswith("resolved by this build")
        assert set(record["bases"]) == {"BASE_DEVEL_IMAGE", "BASE_RUNTIME_IMAGE"}
        pins_file = tmp_path / "pins" / f"{CELL}.txt"
        assert pins.origin(pins_file.read_text()) == (digest, key)

        # unchanged (the pins now hash-locked, read from that image): reused, nothing built or exported
        res, second = build_keyed(tmp_path, m)
        assert second["artifacts"]["reused"] is True and second["artifacts"]["digest"] == digest, second
        assert second["artifacts"]["archive"] == "" and not (tmp_path / "work" / CELL / "image.oci.tar").exists()
        assert "--target runtime " not in log.read_text() and f"reuse {ref} ({digest})" in res.stderr
        assert image_id(ref) == digest
        assert second["seconds"] < 10, second

        # a comment added to the pins file reaches no pip: still that image
        text = pins_file.read_text()
        pins_file.write_text(text + "# a comment\n")
        assert build_keyed(tmp_path, m)[1]["artifacts"]["reused"] is True
        # an edited pin line (one more hash allowed for a release): the pins no longer say what that image holds.
        # Built for real from the hash-locked pins (pip --require-hashes): pins without the setuptools the fixture
        # requires stopped exactly here
        line = next(l for l in text.splitlines() if "--hash=" in l)
        pins_file.write_text(text.replace(line, line + " --hash=sha256:" + "0" * 64))
        assert pins.origin(pins_file.read_text()) is None
        _, edited = build_keyed(tmp_path, m)
        assert edited["artifacts"]["reused"] is False and "--target runtime " in log.read_text()
        assert edited["artifacts"]["content_key"] not in (key, "") and content_label(ref) == edited["artifacts"]["content_key"]
        _, again = build_keyed(tmp_path, m)  # that image carries this key itself now
        assert again["artifacts"]["reused"] is True and again["artifacts"]["digest"] == edited["artifacts"]["digest"]
        # the cell's tag moved to another image (by someone else): its label is not the key, so it is built
        subprocess.run(["docker", "tag", local_bases["cuda_base"], ref], check=True)
        res, moved = build_keyed(tmp_path, m)
        assert moved["artifacts"]["reused"] is False and image_id(ref) == edited["artifacts"]["digest"]
        assert f"image {ref} ({image_id(local_bases['cuda_base'])}) carries no content key" in res.stderr
    finally:
        remove_images(registry)


def remove_images(registry: str) -> None:
    names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"{registry}/cuda-ext"],
                           capture_output=True, text=True).stdout.split()
    for name in names:
        subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)


# slow: three builds; the default tier holds the judge in tests/unit/image/test_ledger.py and a tampered record in
# tests/docker/image/test_registry_reuse.py
@pytest.mark.slow
def test_reuse_takes_only_an_image_whose_digest_builder_recorded(built_80_90, local_bases, docker_engine, tmp_path):
    """The content-key label alone never makes a reuse (builder/image/ledger.py): an image built FROM the cell's image
    inherits the label, and any image can be given a copy of it. Only a digest the image ledger recorded for the
    key when builder built it is reused: a derived image, a copied label or a tampered ledger entry mean a build,
    said in one line, and an unchanged cell is still reused with the same digest."""
    shutil.copytree(built_80_90[0] / "wheelhouse", tmp_path / "wheelhouse")
    registry = f"127.0.0.1:5000/builder-test-led{uuid.uuid4().hex[:8]}"
    m = fixture_copy(tmp_path, registry)
    ref = f"{registry}/cuda-ext:1.0.0-cu130-py311-sm80.90"
    entries = tmp_path / "wheelhouse" / ".images"
    try:
        _, first = build_keyed(tmp_path, m)
        key, digest = first["artifacts"]["content_key"], first["artifacts"]["digest"]
        entry = json.loads((entries / f"{key}.json").read_text())
        assert entry["content_key"] == key and digest in entry["images"], entry
        assert entry["images"][digest]["cell"] == CELL

        # unchanged: reused, the same digest, and the line says why
        res, same = build_keyed(tmp_path, m)
        assert same["artifacts"]["reused"] is True and same["artifacts"]["digest"] == digest, same
        assert "its digest is one builder recorded for that key" in res.stderr
        # the pins are hash-locked now: the key every later build computes
        key2 = same["artifacts"]["content_key"]
        assert key2 != key

        # an image built FROM the cell's image plus one more layer, tagged as the cell: it inherits the label
        derived = commit_image(ref, ref)
        assert derived != digest and content_label(ref) == key
        res, rebuilt = build_keyed(tmp_path, m)
        assert rebuilt["artifacts"]["reused"] is False, rebuilt
        assert (f"image {ref} carries content key {key} but its digest {derived} is not the one builder recorded "
                f"for it ({digest}): building") in res.stderr
        digest2 = rebuilt["artifacts"]["digest"]
        assert image_id(ref) == digest2 and digest2 != derived and content_label(ref) == key2

        # another image (the CUDA base) given a copy of the label, tagged as the cell
        copied = commit_image(local_bases["cuda_base"], ref, f"LABEL {labels.CONTENT_KEY}={key2}", add_file=False)
        assert content_label(ref) == key2 and copied != digest2
        res, again = build_keyed(tmp_path, m)
        assert again["artifacts"]["reused"] is False and again["artifacts"]["digest"] == digest2, again
        assert f"image {ref} carries content key {key2} but its digest {copied} is not the one builder" in res.stderr
        assert image_id(ref) == digest2  # the same inputs gave the same image again

        # a tampered ledger: the entry names another digest for the key; the real image is built again
        path = entries / f"{key2}.json"
        good = json.loads(path.read_text())
        assert digest2 in good["images"]
        other = "sha256:" + "0" * 64
        path.write_text(json.dumps({**good, "images": {other: good["images"][digest2]}}))
        res, tampered = build_keyed(tmp_path, m)
        assert tampered["artifacts"]["reused"] is False and tampered["artifacts"]["digest"] == digest2, tampered
        assert (f"image {ref} carries content key {key2} but its digest {digest2} is not the one builder recorded "
                f"for it ({other}): building") in res.stderr
        assert digest2 in json.loads(path.read_text())["images"]  # recorded again by that build

        # a corrupt entry is ignored with a line, and replaced by the build
        path.write_text('{"format": 1, "content_key": "' + key2 + '", "images": [')
        res, corrupt = build_keyed(tmp_path, m)
        assert corrupt["artifacts"]["reused"] is False, corrupt
        assert f"image {ref} carries content key {key2} but its ledger entry is ignored ({path}: not JSON" in res.stderr
        assert "image ledger: replaced an unreadable ledger entry" in res.stderr
        # and now, unchanged again: reused, the same digest
        _, last = build_keyed(tmp_path, m)
        assert last["artifacts"]["reused"] is True and last["artifacts"]["digest"] == digest2, last
    finally:
        remove_images(registry)


# slow: a build interrupted during its reuse; the default tier interrupts a build with SIGINT in
# tests/hardening/test_hardening.py
@pytest.mark.slow
def test_sigint_during_a_reuse_leaves_no_run_name(built_80_90, local_bases, docker_engine, tmp_path):
    """Ctrl-C while a reuse names the image for this run (`<tag>-run-<hex>`): the build exits 130 and the name
    is gone, the cell's tag untouched. The interrupt comes at that very moment from a docker wrapper that runs the
    real `docker tag` and then sends SIGINT to builder (its parent), as a user's Ctrl-C would."""
    shutil.copytree(built_80_90[0] / "wheelhouse", tmp_path / "wheelhouse")
    registry = f"127.0.0.1:5000/builder-test-int{uuid.uuid4().hex[:8]}"
    m = fixture_copy(tmp_path, registry)
    ref = f"{registry}/cuda-ext:1.0.0-cu130-py311-sm80.90"
    try:
        _, first = build_keyed(tmp_path, m)
        digest = first["artifacts"]["digest"]
        shims = tmp_path / "shims"
        shims.mkdir()
        real = shutil.which("docker")
        (shims / "docker").write_text(f'#!/bin/sh\ncase "$1 $3" in\n  "tag "*-run-*) "{real}" "$@"; rc=$?; '
                                      f'kill -INT $PPID; exit $rc;;\nesac\nexec "{real}" "$@"\n')
        (shims / "docker").chmod(0o755)
        argv = ["build", "--matrix", str(m), "--wheelhouse", str(tmp_path / "wheelhouse"), "--work-dir",
                str(tmp_path / "work"), "--log-dir", str(tmp_path / "logs"), "--pins-dir", str(tmp_path / "pins"),
                "--no-smoke", "--quiet", "--ca-bundle", str(HOST_CA)]
        res = subprocess.run([sys.executable, "-m", "builder.cli", *argv], capture_output=True, text=True,
                             cwd=tmp_path, env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}, timeout=600)
        assert res.returncode == 130, res.stdout[-2000:] + res.stderr[-3000:]
        assert f"reuse {ref} ({digest})" in res.stderr and f"interrupted by SIGINT during image of {CELL}" in res.stderr
        names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"{registry}/cuda-ext"],
                               capture_output=True, text=True, check=True).stdout.split()
        assert names == [ref], names  # no <tag>-run-<hex> left
        assert image_id(ref) == digest
    finally:
        remove_images(registry)
