"""What the attestation tests share (tests/unit/image/test_verify.py): an image archive made with real nvcc-built
libraries, pushed to a real registry over its API, and its attestations attached as publish attaches them."""

from __future__ import annotations

import json
from pathlib import Path

from builder.image import attest, labels, oci, provenance
from tests.helpers import zstd_layer

SITE = "opt/venv/lib/python3.12/site-packages"
CELL = "toy-1.0-cu130-torch2.11.0-py312-sm80.90"
CONTENT_KEY = "e" * 64
COMMIT = "a" * 40


def image_labels(sass: str = "sm_80,sm_90", extra: dict | None = None) -> dict[str, str]:
    return {labels.CELL: CELL, labels.ENGINE: "toy", labels.ENGINE_VERSION: "1.0", labels.CUDA: "13.0",
            labels.TORCH: "2.11.0", labels.PYTHON: "3.12", labels.ARCHS: "80,90", labels.CONTENT_KEY: CONTENT_KEY,
            labels.package("toykern", "version"): "1.0",
            labels.package("toykern", "source"): f"https://github.com/example/toykern@{COMMIT}",
            labels.package("toykern", "sass"): sass, labels.package("toykern", "ptx"): "",
            labels.package("toykern", "binaries"): "", labels.package("toykern", "cache-key"): "k" * 64,
            **(extra or {})}


def archive(path: Path, lib: bytes, image_labels: dict[str, str], more: dict[str, bytes] | None = None) -> oci.Image:
    """An image of one dist-info and one compiled library, with `image_labels`; its oci.Image."""
    record = b"toykern/__init__.py,,\ntoykern/_k.so,,\ntoykern-1.0.dist-info/METADATA,,\ntoykern-1.0.dist-info/RECORD,,\n"
    files = {f"{SITE}/toykern/__init__.py": b"", f"{SITE}/toykern/_k.so": lib,
             f"{SITE}/toykern-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: toykern\nVersion: 1.0\n",
             f"{SITE}/toykern-1.0.dist-info/RECORD": record,
             "var/lib/dpkg/status": b"Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\nArchitecture: amd64\n"
                                    b"Maintainer: GNU Libc Maintainers <debian-glibc@lists.debian.org>\n\n"}
    layers = [zstd_layer(files)] + ([zstd_layer(more)] if more else [])
    config = {"architecture": "amd64", "os": "linux", "created": "2026-12-05T00:00:00Z",
              "config": {"Labels": image_labels, "Env": ["PATH=/usr/bin:/bin"]},
              "rootfs": {"type": "layers", "diff_ids": []},
              "history": [{"created_by": f"RUN step {i}"} for i in range(len(layers))]}
    oci.write_archive(path, config, [("application/vnd.oci.image.layer.v1.tar+zstd", b) for b in layers])
    with oci.Archive(path) as a:
        return a.image()


def push(client, repository: str, tag: str, archive_path: Path) -> str:
    """The archive's image pushed over the registry API under TAG (blobs, then the manifest); its digest."""
    with oci.Archive(archive_path) as a:
        top = json.loads(a.read("index.json"))["manifests"][0]
        body = a.blob(top["digest"])
        manifest = json.loads(body)
        for d in [manifest["config"], *manifest["layers"]]:
            client.upload(repository, a.blob(d["digest"]))
    client.put_manifest(repository, tag, body, top["mediaType"])
    return top["digest"]


def cell_provenance(cell: str = CELL, content_key: str = CONTENT_KEY, commit: str = COMMIT) -> dict:
    source = {"kind": "git", "repository": "https://github.com/example/toykern", "tag": "v1.0", "commit": commit}
    return provenance.predicate({"id": cell, "content_key": content_key}, [{"name": "toykern", "version": "1.0",
                                                                            "source": source, "deps": {}}],
                                {"dockerfile": "d" * 64, "bases": {}}, {}, started="2026-12-05T00:00:00Z",
                                finished="2026-12-05T00:01:00Z", versions={})


def publish(where, repository: str, tag: str, path: Path, image: oci.Image, predicate: dict, signer,
            cyclonedx: bool = False) -> list[dict]:
    """As publish does: attestations attached first, then the image pushed under its tag."""
    from builder.registry_api import Client

    attached = attest.attach_image(where, repository, path, image, predicate, signer, lambda line: None,
                                   cyclonedx=cyclonedx)
    with Client(where) as client:
        push(client, repository, tag, path)
    return attached
