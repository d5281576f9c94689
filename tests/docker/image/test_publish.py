"""`builder publish`: the image smoke ran is pushed by digest (an OCI archive with rewritten timestamps, copied

The Docker half of tests/unit/image/test_publish.py: its docstring says the rest."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from builder.image import attest, sbom
from builder.registry_api import Client as RegistryClient
from builder.registry_api import RegistryPath
from tests.helpers import free_port, registry_config_lines, stop_process
from tests.support.ledger_signing import pair
from tests.support.publish import CELL, CELL_90, FIXTURE, MATRIX, MATRIX_PUBLISH

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# -- against real registries --------------------------------------------------------------------------------
class Client:
    """Reads a registry over its HTTP API, with Basic auth when given."""

    def __init__(self, host: str, auth: tuple[str, str] | None = None):
        self.host, self.auth = host, auth

    def get(self, path: str, accept: str = "application/vnd.oci.image.manifest.v1+json") -> bytes | None:
        req = urllib.request.Request(f"http://{self.host}{path}", headers={"Accept": accept})
        if self.auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(":".join(self.auth).encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def digest(self, repo: str, ref: str) -> str | None:
        body = self.get(f"/v2/{repo}/manifests/{ref}")
        return None if body is None else "sha256:" + hashlib.sha256(body).hexdigest()

    def tags(self, repo: str) -> list[str]:
        body = self.get(f"/v2/{repo}/tags/list", accept="application/json")
        return sorted(json.loads(body).get("tags") or []) if body else []


class Registry(Client):
    """A docker-registry on 127.0.0.1:PORT that a test can stop and start again on the same port and data."""

    def __init__(self, root: Path):
        super().__init__(f"127.0.0.1:{free_port()}")
        self.root = root
        self.proc: subprocess.Popen | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.yml").write_text("\n".join(registry_config_lines(root, self.host)) + "\n")

    def start(self) -> "Registry":
        log = (self.root / "registry.log").open("ab")
        self.proc = subprocess.Popen([shutil.which("docker-registry"), "serve", str(self.root / "config.yml")],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    pytest.fail(f"docker-registry on {self.host} did not come up")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            stop_process(self.proc, 10)


class Shared(NamedTuple):
    root: Path
    ns: str  # the fixture's local image namespace: 127.0.0.1:5000/<ns>/cuda-ext


@pytest.fixture(scope="module")
def shared(tmp_path_factory, local_bases):
    """One wheelhouse and pins dir for the module (the fixture's wheel is compiled once), and a copy of the
    fixture whose local image names are this module's own: other builds of the fixture on this host (other
    tests, other sessions) retag theirs, and publish rightly refuses a tag that no longer names what smoke ran."""
    root = tmp_path_factory.mktemp("publish-shared")
    ns = f"publish-{uuid.uuid4().hex[:10]}"
    fixture = root / "fixture"
    shutil.copytree(FIXTURE, fixture)
    for name in ("matrix.toml", "matrix-publish.toml"):
        text = (fixture / name).read_text()
        (fixture / name).write_text(text.replace('registry = "127.0.0.1:5000/builder-test"', f'registry = "127.0.0.1:5000/{ns}"'))
    yield Shared(root, ns)
    names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"127.0.0.1:5000/{ns}/*"],
                           capture_output=True, text=True).stdout.split()
    if names:
        subprocess.run(["docker", "image", "rm", *names], capture_output=True)


def local_ref(shared: Shared, cell: str = CELL) -> str:
    return f"127.0.0.1:5000/{shared.ns}/cuda-ext:{cell.removeprefix('cuda-ext-')}"


def publish_argv(shared: Shared, tmp: Path, registry: str, *extra: str, matrix: Path = MATRIX) -> list[str]:
    matrix = shared.root / "fixture" / matrix.name
    return [sys.executable, "-m", "builder.cli", "publish", "--matrix", str(matrix), "--registry", registry,
            "--images-json", str(tmp / "images.json"), "--wheelhouse", str(shared.root / "wheelhouse"),
            "--pins-dir", str(shared.root / "pins"), "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"),
            "--ca-bundle", str(HOST_CA), "--quiet", *extra]


def run_publish(shared, tmp, registry, *extra, env=None, matrix=MATRIX) -> subprocess.CompletedProcess[str]:
    return subprocess.run(publish_argv(shared, tmp, registry, *extra, matrix=matrix), capture_output=True, text=True,
                          cwd=tmp, env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000", **(env or {})}, timeout=1800)


def text_files(root: Path):
    for p in root.rglob("*"):
        if p.is_file() and p.stat().st_size < 50 << 20:
            yield p


def test_publish_pushes_the_smoked_image_by_digest_with_auth_and_moves_aliases(shared, auth_registry, tmp_path):
    reg = Client(auth_registry.host, (auth_registry.user, auth_registry.password))
    env = {"BUILDER_REGISTRY_USER": auth_registry.user, "BUILDER_REGISTRY_PASSWORD": auth_registry.password}
    res = run_publish(shared, tmp_path, f"{auth_registry.host}/team", env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    # the pushed digest is the image smoke ran: the local image's id, the archive's digest
    local = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", local_ref(shared)], capture_output=True,
                           text=True, check=True).stdout.strip()
    from builder.image import oci

    archive = tmp_path / "work" / CELL / "image.oci.tar"
    assert oci.digest_of(archive) == local
    assert f"docker pull {auth_registry.host}/team/cuda-ext@{local}" in res.stdout.splitlines()
    assert "smoke ok" in out and out.index("smoke ok") < out.index("push ")
    # the registry serves it under the full tag, the digest and both aliases
    repo = "team/cuda-ext"
    for ref in ("1.0.0-cu130-py311-sm80.90", local, "1.0.0", "latest-cu130"):
        assert reg.digest(repo, ref) == local, ref
    # images.json: cell → tag → digest → wheel keys → smoke results
    images = json.loads((tmp_path / "images.json").read_text())
    entry = images["images"][CELL]
    assert entry["digest"] == local and entry["tag"] == "1.0.0-cu130-py311-sm80.90"
    assert entry["image"] == f"{auth_registry.host}/team/cuda-ext:1.0.0-cu130-py311-sm80.90"
    assert entry["aliases"] == ["1.0.0", "latest-cu130"]
    plan = json.loads(subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--matrix",
                                      str(shared.root / "fixture" / "matrix.toml"), "--json"],
                                     capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    (cell,) = plan["cells"]
    key = next(p["cache_key"] for p in cell["packages"] if p["name"] == "cuda-ext")
    assert entry["wheels"]["cuda-ext"]["key"] == key
    assert entry["wheels"]["cuda-ext"]["files"][0]["sha256"]
    layers = {r["layer"]: r["status"] for s in entry["smoke"] for r in s["artifacts"]["layers"]}
    assert layers["L0"] == "pass" and layers["L1"] == "pass"
    assert images["aliases"][f"{auth_registry.host}/team/cuda-ext:latest-cu130"]["digest"] == local
    # the image ledger binds the pushed digest to the image's content key, with the tag it went to
    from builder.image import labels

    config = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                        local_ref(shared)], capture_output=True, text=True, check=True).stdout)
    recorded = json.loads((shared.root / "wheelhouse" / ".images" / f"{labels.content_key(config)}.json").read_text())
    assert local in recorded["images"], recorded
    assert recorded["published"][f"{auth_registry.host}/team/cuda-ext:1.0.0-cu130-py311-sm80.90"] == local
    # and the same record went to the image's repository, through the registry's Basic auth (builder/image/reuse.py)
    assert "could not push the ledger record" not in out
    assert reg.digest(repo, f"builder-ledger-{labels.content_key(config)}") is not None
    assert auth_registry.password not in json.dumps(recorded)
    # the password is nowhere: output, logs, work dir, images.json
    secret = auth_registry.password
    assert secret not in out
    for f in text_files(tmp_path):
        assert secret.encode() not in f.read_bytes(), f
    # a deployer pulls by digest after `docker login`
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    login = subprocess.run(["docker", "--config", str(cfg), "login", "-u", auth_registry.user, "--password-stdin",
                            auth_registry.host], input=secret, capture_output=True, text=True)
    assert login.returncode == 0, login.stderr
    pulled = f"{auth_registry.host}/team/cuda-ext@{local}"
    pull = subprocess.run(["docker", "--config", str(cfg), "pull", pulled], capture_output=True, text=True)
    assert pull.returncode == 0, pull.stderr
    subprocess.run(["docker", "image", "rm", pulled], capture_output=True)


# slow: a publish against a registry with auth; the default tier reads docker login's credentials in
# tests/unit/image/test_publish.py and tests/unit/net/test_credential_scope.py, and pushes with auth in
# test_publish_pushes_the_smoked_image_by_digest_with_auth_and_moves_aliases
@pytest.mark.slow
def test_docker_login_credentials_are_used_and_a_wrong_password_fails_at_once(shared, auth_registry, tmp_path):
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    auth = base64.b64encode(f"{auth_registry.user}:{auth_registry.password}".encode()).decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    env = {"DOCKER_CONFIG": str(cfg)}
    (tmp_path / "ok").mkdir()
    ok = run_publish(shared, tmp_path / "ok", f"{auth_registry.host}/login", "--no-aliases", env=env)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-4000:]
    assert f"credentials from docker login ({cfg / 'config.json'})" in ok.stderr
    reg = Client(auth_registry.host, (auth_registry.user, auth_registry.password))
    tags = reg.tags("login/cuda-ext")
    # --no-aliases: the full tag only, beside the ledger record that vouches for its digest (builder/image/reuse.py)
    assert [t for t in tags if not t.startswith("builder-ledger-")] == ["1.0.0-cu130-py311-sm80.90"], tags
    assert len([t for t in tags if t.startswith("builder-ledger-")]) == 1, tags
    # a wrong password: refused by the registry before anything is built (exit 3), not retried, nothing written
    (tmp_path / "bad").mkdir()
    bad = run_publish(shared, tmp_path / "bad", f"{auth_registry.host}/wrong", "--retries", "3",
                      env={"BUILDER_REGISTRY_USER": auth_registry.user, "BUILDER_REGISTRY_PASSWORD": "not-it"})
    out = bad.stdout + bad.stderr
    assert bad.returncode == 3, out[-4000:]
    assert "refuses the credentials" in out and "nothing was built" in out and "transient" not in out
    assert not (tmp_path / "bad" / "work").exists() and "compile" not in bad.stdout
    assert "not-it" not in out
    assert reg.tags("wrong/cuda-ext") == []
    assert not (tmp_path / "bad" / "images.json").exists()


# slow: waits out real backoffs; the default tier holds the backoff in tests/unit/image/test_publish.py
@pytest.mark.slow
def test_a_registry_that_is_not_up_yet_is_retried_with_backoff(shared, tmp_path):
    """Connection refused on the first push attempt(s); the registry comes up; the push then goes through."""
    reg = Registry(tmp_path / "late")
    proc = subprocess.Popen(publish_argv(shared, tmp_path, f"{reg.host}/late", "--retries", "6"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
    lines: list[str] = []
    started = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "transient registry error" in line and not started.is_set():
                started.set()
                reg.start()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert proc.wait(timeout=1800) == 0, "".join(lines)[-5000:]
    finally:
        reader.join(timeout=30)
        reg.stop()
    out = "".join(lines)
    assert "transient registry error" in out and "connection refused" in out and "attempt 2 of 7" in out
    reg.start()
    try:
        digest = reg.digest("late/cuda-ext", "1.0.0-cu130-py311-sm80.90")
        assert digest and f"docker pull {reg.host}/late/cuda-ext@{digest}" in out
    finally:
        reg.stop()


def test_a_failure_mid_publish_moves_no_alias(shared, tmp_path):
    """Publish the default cell (aliases → D1); then publish two cells with a new SOURCE_DATE_EPOCH (new
    digests) and take the registry down right after the first cell is pushed: the second push fails, no alias
    moves (they still name D1, which is in the registry), images.json keeps D1's aliases."""
    reg = Registry(tmp_path / "reg").start()
    try:
        (tmp_path / "one").mkdir()
        first = run_publish(shared, tmp_path / "one", f"{reg.host}/mid", "--retries", "0", matrix=MATRIX_PUBLISH)
        assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
        d1 = reg.digest("mid/cuda-ext", "1.0.0")
        assert d1 and reg.digest("mid/cuda-ext", "latest-cu130") == d1
        (tmp_path / "two").mkdir()
        shutil.copy2(tmp_path / "one" / "images.json", tmp_path / "two" / "images.json")
        proc = subprocess.Popen(publish_argv(shared, tmp_path / "two", f"{reg.host}/mid", "--retries", "1",
                                             "--profile", "all", "--keep-going", matrix=MATRIX_PUBLISH),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path / "two",
                                env={**os.environ, "SOURCE_DATE_EPOCH": "1700000001"})
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if f"[{CELL}] pushed " in line:
                reg.stop()  # the registry goes away between the two cells
        rc = proc.wait(timeout=1800)
        out = "".join(lines)
        assert rc == 1, out[-5000:]
        assert f"not published: {CELL_90}" in out and "aliases not moved" in out
    finally:
        reg.stop()
    reg.start()
    try:
        d2 = reg.digest("mid/cuda-ext", "1.0.0-cu130-py311-sm80.90")
        assert d2 and d2 != d1  # the first cell's new build was pushed under its full tag
        assert reg.digest("mid/cuda-ext", "1.0.0") == d1 and reg.digest("mid/cuda-ext", "latest-cu130") == d1
        assert reg.digest("mid/cuda-ext", "1.0.0-cu130-py311-sm90") is None
        images = json.loads((tmp_path / "two" / "images.json").read_text())
        assert images["images"][CELL]["digest"] == d2 and CELL_90 not in images["images"]
        assert images["aliases"][f"{reg.host}/mid/cuda-ext:1.0.0"]["digest"] == d1
        assert images["images"][CELL]["aliases"] == []  # this push moved none
        # and the entry says which digest each alias it did not move still names
        assert images["images"][CELL]["aliases_not_moved"] == {f"{reg.host}/mid/cuda-ext:1.0.0": d1,
                                                              f"{reg.host}/mid/cuda-ext:latest-cu130": d1}
    finally:
        reg.stop()


def test_provenance_is_pushed_with_the_image_as_one_index(shared, registry, tmp_path):
    """--provenance: BuildKit's SLSA provenance goes with the image as an OCI index (skopeo copy --all keeps
    both digests); images.json records the index and the image manifest; the CA bundle's contents never reach
    the attestation (BuildKit records a secret's id, not its value)."""
    res = run_publish(shared, tmp_path, f"{registry}/prov", "--provenance", "--no-aliases")
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    entry = json.loads((tmp_path / "images.json").read_text())["images"][CELL]
    index, manifest = entry["digest"], entry["manifest"]
    assert index != manifest and len(entry["attestations"]) == 1
    reg = Client(registry)
    body = reg.get(f"/v2/prov/cuda-ext/manifests/{index}", accept="application/vnd.oci.image.index.v1+json")
    assert "sha256:" + hashlib.sha256(body).hexdigest() == index
    described = {m["digest"]: m for m in json.loads(body)["manifests"]}
    assert set(described) == {manifest, entry["attestations"][0]}
    att = described[entry["attestations"][0]]
    assert att["annotations"]["vnd.docker.reference.type"] == "attestation-manifest"
    att_manifest = json.loads(reg.get(f"/v2/prov/cuda-ext/manifests/{att['digest']}"))
    (layer,) = att_manifest["layers"]
    assert layer["annotations"]["in-toto.io/predicate-type"].startswith("https://slsa.dev/provenance/")
    statement = reg.get(f"/v2/prov/cuda-ext/blobs/{layer['digest']}", accept="*/*")
    assert b'"ca"' in statement and b"BEGIN CERTIFICATE" not in statement  # the secret's id, never its value
    assert reg.digest("prov/cuda-ext", manifest) == manifest  # the image manifest itself is served too

    # builder's own attestations (issue 49), unsigned here (no key given): the SBOM on the platform manifest, the
    # provenance on the index and on the manifest, each listed in images.json and in the referrers tag's index
    assert sorted((a["kind"], a["subject"]) for a in entry["referrers"]) == sorted(
        [("sbom", manifest), ("provenance", index), ("provenance", manifest)])
    assert all(a["signed_by"] == "" and a["mediaType"] == attest.IN_TOTO for a in entry["referrers"])
    assert "UNSIGNED (no BUILDER_LEDGER_SIGNING_KEY)" in res.stderr
    where = RegistryPath.parse(f"{registry}/prov", "test")
    with RegistryClient(where.endpoint) as client:
        found = client.image(where.repository("cuda-ext"), entry["tag"])
        on_manifest, how = attest.read(client, where.repository("cuda-ext"), manifest)
    assert how == "tag" and sorted(a.kind for a in on_manifest) == ["provenance", "sbom"]
    (sbom_doc,) = [a for a in on_manifest if a.kind == "sbom"]
    assert sbom_doc.opened.statement is not None and not sbom_doc.opened.signed_by
    doc = sbom_doc.opened.statement["predicate"]
    counts = sbom.counts(doc)
    assert counts["compiled"] == 1 and counts["dist-info"] >= 2 and counts["dpkg"] >= 50, counts
    assert sbom.check_labels(doc, found.labels) == []  # the audit's labels and the SBOM's binaries agree
    compiled = {sbom.facts_of(p)["name"] for p in doc["packages"] if sbom.facts_of(p).get("kind") == "compiled"}
    assert compiled == set(entry["wheels"]) and compiled  # every wheel images.json lists is a package of its own
    # a deployer with a key: both refused as unsigned, one line each, exit 1
    pem, pub = pair()
    (tmp_path / "ci.pub").write_bytes(pub)
    checked = subprocess.run([sys.executable, "-m", "builder.cli", "verify", f"{registry}/prov/cuda-ext@{index}",
                              "--key", str(tmp_path / "ci.pub")], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1 and checked.stdout.count("FAILED ") == 2 and "(unsigned)" in checked.stdout, \
        checked.stdout + checked.stderr


def test_publish_after_build_pushes_the_image_build_made_and_a_fresh_runner_builds_that_digest(shared, registry,
                                                                                               tmp_path):
    """Issue 51: the first build resolves its runtime pins before it installs anything and installs from them, as
    every later build does; `publish` right after (same wheelhouse, work dir and pins) smokes and pushes the very
    image build made — no runtime build, no second export; and a fresh runner (an empty wheelhouse, BuildKit's
    cache ignored, no registry to take the image from) building from the pins the first build wrote gets the
    first build's digest."""
    fixture_matrix = shared.root / "fixture" / MATRIX.name
    common = ["--matrix", str(fixture_matrix), "--wheelhouse", str(shared.root / "wheelhouse"),
              "--pins-dir", str(tmp_path / "pins"), "--work-dir", str(tmp_path / "work"), "--ca-bundle", str(HOST_CA),
              "--quiet"]
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}
    cli = [sys.executable, "-m", "builder.cli"]
    built = subprocess.run(cli + ["build", *common, "--log-dir", str(tmp_path / "logs-build")], capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=1800)
    assert built.returncode == 0, (built.stdout + built.stderr)[-6000:]
    log = (tmp_path / "logs-build" / f"{CELL}.log").read_text()
    # resolved first (pip's report, nothing installed), then one install: the hash-locked one every build runs
    assert "--target runtime-resolved" in log and log.index("--target runtime-resolved") < log.index("--target runtime ")
    assert "runtime-requirements.txt" in log
    pins_file = tmp_path / "pins" / f"{CELL}.txt"
    assert pins_file.is_file() and "--hash=sha256:" in pins_file.read_text()
    archive = tmp_path / "work" / CELL / "image.oci.tar"
    from builder.image import oci

    digest = oci.digest_of(archive)
    exported = archive.stat().st_mtime_ns
    # publish on the same runner: the image build made, smoked and pushed as it is
    published = subprocess.run(cli + ["publish", *common, "--registry", f"{registry}/{shared.ns}-51",
                                      "--images-json", str(tmp_path / "images.json"),
                                      "--log-dir", str(tmp_path / "logs-publish")],
                               capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1800)
    out = published.stdout + published.stderr
    assert published.returncode == 0, out[-6000:]
    log = (tmp_path / "logs-publish" / f"{CELL}.log").read_text()
    assert "docker buildx build" not in log, log[-3000:]  # no resolve, no runtime build: the pins and image stand
    assert archive.stat().st_mtime_ns == exported  # no second export
    assert "smoke ok" in out and out.index("smoke ok") < out.index("push ")
    assert Client(registry).digest(f"{shared.ns}-51/cuda-ext", "1.0.0-cu130-py311-sm80.90") == digest
    # a fresh runner from the committed pins: nothing cached, nothing taken from a registry, the same digest
    fresh = tmp_path / "fresh"
    (fresh / "pins").mkdir(parents=True)
    shutil.copy2(pins_file, fresh / "pins" / pins_file.name)
    again = subprocess.run(cli + ["build", "--matrix", str(fixture_matrix), "--wheelhouse", str(fresh / "wheelhouse"),
                                  "--pins-dir", str(fresh / "pins"), "--work-dir", str(fresh / "work"),
                                  "--log-dir", str(fresh / "logs"), "--ca-bundle", str(HOST_CA), "--quiet",
                                  "--no-cache", "--reuse-from", "none", "--no-smoke"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1800)
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    log = (fresh / "logs" / f"{CELL}.log").read_text()
    assert "--target runtime-resolved" not in log and "--target wheels-cuda-ext" in log  # compiled, installed from pins
    assert oci.digest_of(fresh / "work" / CELL / "image.oci.tar") == digest
    assert (fresh / "pins" / pins_file.name).read_text() == pins_file.read_text()  # read, not rewritten
