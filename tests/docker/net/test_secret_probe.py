"""The secret probe (issues 8 and 28): one fresh build and publish of the fixture cell with every kind of secret
builder is handed — a CA bundle (--ca-bundle), a hub token, the registry's password (a real registry with
htpasswd auth) and an index password in the environment, token variables CI runners set — each carrying a
unique marker, with --debug (every command line logged). The markers must be in 0 layers (every blob of the
OCI archive that was pushed and of the image the daemon holds, decompressed), 0 histories, 0 image configs
(local and as the registry serves it), 0 logs, 0 reports (images.json, the build's JSON, smoke reports, the
work dir) and 0 lines of builder's own output."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from builder.image import oci

from tests.hardening import cases as hc
from tests.helpers import REPO

CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"


def _blobs(archive: Path) -> dict[str, bytes]:
    """Every member of a tar (docker save, an OCI archive), gzip and zstd layers decompressed too."""
    out = {}
    with tarfile.open(archive) as tar:
        for m in tar:
            if not m.isreg():
                continue
            data = tar.extractfile(m).read()
            out[m.name] = data
            if data[:2] == b"\x1f\x8b":
                out[m.name + " (gunzip)"] = gzip.GzipFile(fileobj=io.BytesIO(data)).read()
            elif data[:4] == oci.ZSTD_MAGIC:  # the runtime image's layers (builder's default compression)
                out[m.name + " (unzstd)"] = oci.decompressed(io.BufferedReader(io.BytesIO(data))).read()
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root.parent)): p.read_bytes() for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@pytest.mark.slow
def test_no_secret_reaches_a_layer_a_history_a_log_or_a_report(local_bases, auth_registry, tmp_path):
    tmp = hc.make_fixture(tmp_path / "t")
    markers = {name: f"builder-secret-{name.lower().replace('_', '-')}-{uuid.uuid4().hex}" for name in
               ("CA", "HF_TOKEN", "BUILDER_INDEX_PASSWORD", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                "BUILDER_SCCACHE_DIST_TOKEN")}
    markers["BUILDER_REGISTRY_PASSWORD"] = auth_registry.password  # the registry's htpasswd password
    ca = tmp / "ca.pem"
    ca.write_text(f"# {markers['CA']}\n" + hc.HOST_CA.read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), **{k: v for k, v in markers.items() if k != "CA"},
           "BUILDER_REGISTRY_USER": auth_registry.user, "BUILDER_INDEX_USER": "ci",
           # a time of its own: the compile and the image really run, nothing comes from a cache
           "SOURCE_DATE_EPOCH": str(1_600_000_000 + uuid.uuid4().int % 10**6)}
    env.pop("BUILDER_CA_BUNDLE", None)
    registry = f"{auth_registry.host}/secret-probe-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "builder.cli", "--debug", "publish", "--matrix", str(tmp / "fx" / "matrix.toml"),
            "--registry", registry, "--ca-bundle", str(ca), "--work-dir", str(tmp / "w"), "--log-dir", str(tmp / "l"),
            "--pins-dir", str(tmp / "p"), "--wheelhouse", str(tmp / "wh"), "--images-json", str(tmp / "images.json"),
            "--no-aliases"]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, env=env, timeout=3600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    images = json.loads((tmp / "images.json").read_text())
    entry = images["images"][CELL]
    local = f"{hc.REGISTRY}/cuda-ext:{CELL.removeprefix('cuda-ext-')}"
    pushed = f"{registry}/cuda-ext@{entry['digest']}"
    auth = f"--creds={auth_registry.user}:{auth_registry.password}"
    try:
        searched: dict[str, dict[str, bytes]] = {"output": {"stdout + stderr (--debug)": (res.stdout + res.stderr).encode()}}
        saved = tmp / "saved.tar"
        subprocess.run(["docker", "save", "-o", str(saved), local], check=True)
        searched["layers"] = {f"docker save: {k}": v for k, v in _blobs(saved).items()}
        archive = tmp / "w" / CELL / "image.oci.tar"
        searched["layers"].update({f"pushed archive: {k}": v for k, v in _blobs(archive).items()})
        searched["histories"] = {
            "docker history": subprocess.run(["docker", "history", "--no-trunc", local], capture_output=True, check=True).stdout}
        searched["configs"] = {
            "docker image inspect": subprocess.run(["docker", "image", "inspect", local], capture_output=True, check=True).stdout,
            "registry: manifest": subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", auth, f"docker://{pushed}"],
                                                 capture_output=True, check=True).stdout,
            "registry: config": subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", auth, f"docker://{pushed}"],
                                               capture_output=True, check=True).stdout}
        searched["logs"] = _files(tmp / "l")
        searched["reports"] = {"images.json": (tmp / "images.json").read_bytes(),
                               **{k: v for k, v in _files(tmp / "w").items() if not k.endswith("image.oci.tar")},
                               **_files(tmp / "wh"), **_files(tmp / "p")}
        assert searched["layers"] and searched["histories"]["docker history"] and searched["logs"], searched.keys()
        # the search finds what is there: the cell's label in the configs, the wheel's code in a decompressed layer
        assert all(CELL.encode() in searched["configs"][k] for k in ("docker image inspect", "registry: config"))
        assert any(k.endswith("(gunzip)") and b"cuda_ext/__init__.py" in v for k, v in searched["layers"].items())
        found = {place: sorted({f"{name} in {where}" for where, data in items.items() for name, m in markers.items()
                                if m.encode() in data}) for place, items in searched.items()}
        counts = {place: len(hits) for place, hits in found.items()}
        print("secret probe:", {p: f"{len(items)} searched, {counts[p]} with a marker" for p, items in searched.items()})
        assert counts == {"output": 0, "layers": 0, "histories": 0, "configs": 0, "logs": 0, "reports": 0}, found
    finally:
        subprocess.run(["docker", "image", "rm", "-f", local], capture_output=True)
