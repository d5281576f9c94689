"""`builder publish`: the image smoke ran is pushed by digest (an OCI archive with rewritten timestamps, copied
by skopeo with the digest preserved), aliases move only when every cell of the run is in the registry,
images.json records what was published, credentials never land anywhere, transient registry errors are
retried — checked against real registries on 127.0.0.1 (docker-registry, with and without htpasswd auth)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.image import publish as pub
from builder.errors import CommandError, UserError
from builder.matrix import Selection, load
from builder.resolve import select
from builder.registry_api import Endpoint, RegistryPath

from tests.support.publish import CELL, CELL_90, MATRIX, MATRIX_PUBLISH, REPO


# -- pieces, no Docker --------------------------------------------------------------------------------------
@pytest.mark.pure
def test_transient_registry_errors_are_told_from_permanent_ones():
    assert pub.transient('time="..." level=fatal msg="... dial tcp 127.0.0.1:5999: connect: connection refused"')
    assert pub.transient("received unexpected HTTP status: 503 Service Unavailable")
    assert pub.transient("429 Too Many Requests")
    assert pub.transient("read: connection reset by peer")
    assert not pub.transient("unauthorized: authentication required")
    assert not pub.transient("denied: requested access to the resource is denied")
    assert not pub.transient("Error: lookup registry.invalid: no such host")


def _target(tmp_path, **kw) -> tuple[pub.Target, list[float]]:
    slept: list[float] = []
    where = RegistryPath("127.0.0.1:1/x", Endpoint("127.0.0.1:1", tls_verify=False,
                                                  credentials=kw.pop("credentials", None)))
    t = pub.Target(where=where, images_json=tmp_path / "images.json", sleep=slept.append, **kw)
    return t, slept


@pytest.mark.pure
def test_retries_back_off_exponentially_then_give_up(tmp_path):
    target, slept = _target(tmp_path, attempts=4, backoff=2.0)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise CommandError(["skopeo", "copy"], 1, "dial tcp 127.0.0.1:1: connect: connection refused")
        return "done"

    said: list[str] = []
    assert pub.retrying("push x", flaky, target, said.append) == "done"
    assert slept == [2.0, 4.0] and len(calls) == 3
    assert "attempt 2 of 4 in 2s" in said[0] and "connection refused" in said[0]

    def down():
        raise CommandError(["skopeo"], 1, "503 Service Unavailable")

    slept.clear()
    with pytest.raises(pub.PublishError, match="gave up after 4 attempts"):
        pub.retrying("push x", down, target, said.append)
    assert slept == [2.0, 4.0, 8.0]


@pytest.mark.pure
def test_a_permanent_error_is_not_retried(tmp_path):
    target, slept = _target(tmp_path, attempts=5)

    def denied():
        raise CommandError(["skopeo"], 1, 'level=fatal msg="... unauthorized: authentication required"')

    with pytest.raises(pub.PublishError, match="unauthorized"):
        pub.retrying("push x", denied, target, lambda s: None)
    assert slept == []


@pytest.mark.pure
def test_credentials_are_not_in_the_targets_repr_and_reach_skopeo_through_memory(tmp_path):
    from builder import docker

    target, _ = _target(tmp_path, credentials=("ci", "pa55-" + "x" * 8))
    assert "pa55" not in repr(target) and "pa55" not in str(target)
    fd = docker._auth_fd(target.auth())
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")  # anonymous memory, not a file on disk
        doc = json.loads(Path(f"/proc/self/fd/{fd}").read_text())
        assert base64.b64decode(doc["auths"]["127.0.0.1:1"]["auth"]).decode() == "ci:pa55-xxxxxxxx"
    finally:
        os.close(fd)


@pytest.mark.pure
def test_make_target_checks_the_registry_and_reads_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_REGISTRY_USER", "ci")
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "pw")
    t = pub.make_target("127.0.0.1:5000/team", tmp_path / "i.json")
    assert t.credentials == ("ci", "pw") and not t.tls_verify and t.repository("vllm") == "127.0.0.1:5000/team/vllm"
    assert pub.make_target("registry.example.com/ml", tmp_path / "i.json").tls_verify  # TLS unless loopback
    for bad in ("127.0.0.1:5000", "Bad Registry/x", "127.0.0.1:5000/UPPER"):
        with pytest.raises(UserError):
            pub.make_target(bad, tmp_path / "i.json")
    monkeypatch.delenv("BUILDER_REGISTRY_PASSWORD")
    with pytest.raises(UserError, match="BUILDER_REGISTRY_PASSWORD"):
        pub.make_target("127.0.0.1:5000/team", tmp_path / "i.json")


@pytest.mark.pure
def test_aliases_go_to_the_default_profiles_cell_and_latest_to_the_newest_version():
    m = load(MATRIX_PUBLISH)
    cells = select(m, Selection(profiles=("all",)))
    claims = pub.alias_claims(cells, m, cells)
    assert claims == {CELL: ["1.0.0", "latest-cu130"], CELL_90: []}
    # an --arch variant of a profile is no standard cell: it moves no alias
    variant = select(m, Selection(archs=(80,)))
    assert pub.alias_claims(variant, m, cells) == {"cuda-ext-1.0.0-cu130-py311-sm80": []}
    # the shipped matrix: each engine version has its alias; latest-cuXYZ per CUDA
    real = load(REPO / "matrix.toml")
    every = select(real, Selection(profiles=("all",)))
    claims = pub.alias_claims(every, real, every)
    assert claims["vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90"] == ["0.33.0", "latest-cu130"]
    assert claims["vllm-0.6.3.post1-cu121-torch2.4.0-py310-sm80.90"] == ["0.6.3.post1", "latest-cu121"]


@pytest.mark.pure
def test_images_json_is_replaced_atomically_and_merged(tmp_path):
    path = tmp_path / "images.json"
    data = pub.load_images(path)
    data["images"]["a"] = {"digest": "sha256:" + "0" * 64}
    pub.write_images(path, data)
    again = pub.load_images(path)
    again["images"]["b"] = {"digest": "sha256:" + "1" * 64}
    pub.write_images(path, again)
    assert set(json.loads(path.read_text())["images"]) == {"a", "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["images.json"]  # no temporary left behind
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a readable images.json"):
        pub.load_images(path)


@pytest.mark.pure
def test_the_warm_table_of_images_json_is_recorded_beside_what_publish_wrote(tmp_path):
    path = tmp_path / "images.json"
    published = {"format": 1, "images": {"a": {"digest": "sha256:" + "0" * 64}}, "aliases": {"r:latest": {"digest": "d"}}}
    path.write_text(json.dumps(published))
    pub.record_warm(path, "r:t-warm-mtp2-sm90", {"digest": "sha256:" + "1" * 64})
    pub.record_warm(path, "r:t-warm-eagle-sm90", {"digest": "sha256:" + "2" * 64})
    data = json.loads(path.read_text())
    assert (data["images"], data["aliases"]) == (published["images"], published["aliases"])
    assert sorted(data["warm"]) == ["r:t-warm-eagle-sm90", "r:t-warm-mtp2-sm90"]
    assert [p.name for p in tmp_path.iterdir()] == ["images.json"]


def images_json_writers(package: Path) -> list[str]:
    """Modules that write images.json themselves: a call of write_images, or a table of what load_images returned
    changed (`data["warm"][k] = ...`), anywhere but in image/publish.py. "module:line"."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        if module == "image.publish":
            continue
        tree = ast.parse(path.read_text(), str(path))
        name_of = lambda f: f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""  # noqa: E731
        loaded = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                  and name_of(n.value.func) == "load_images" for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and name_of(node.func) == "write_images":
                found.append(f"{module}:{node.lineno}")
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                base = node.value
                while isinstance(base, ast.Subscript):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in loaded:
                    found.append(f"{module}:{node.lineno}")
    return found


@pytest.mark.pure
def test_images_json_and_its_warm_table_have_one_writer_publish(tmp_path):
    """images.json is publish's: the cells and aliases it pushed, and the warm images `builder warm --push` pushed
    (through publish.record_warm); no other module writes it or changes what it read of it."""
    pkg = tmp_path / "builder"
    (pkg / "image").mkdir(parents=True)
    (pkg / "image" / "publish.py").write_text("def write_images(p, d): pass\n")
    (pkg / "warm.py").write_text("from .image import publish\n"
                                 "def f(p):\n    data = publish.load_images(p)\n    data['warm']['x'] = 1\n"
                                 "    publish.write_images(p, data)\n")
    assert images_json_writers(pkg) == ["warm:4", "warm:5"]
    assert images_json_writers(REPO / "builder") == []


def test_publish_dry_run_prints_the_push_and_needs_no_registry(tmp_path):
    res = subprocess.run([sys.executable, "-m", "builder.cli", "publish", "--matrix", str(MATRIX), "--dry-run",
                          "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "w"),
                          "--registry", "127.0.0.1:9/team"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    runtime = next(l for l in lines if "--target runtime " in l)
    assert "--output type=oci,dest=" in runtime and "rewrite-timestamp=true" in runtime and "--load" not in runtime
    assert any(l.startswith("docker load --input ") for l in lines)
    push = next(l for l in lines if l.startswith("skopeo copy"))
    assert "--preserve-digests" in push and "--dest-tls-verify=false" in push
    assert push.endswith("docker://127.0.0.1:9/team/cuda-ext:1.0.0-cu130-py311-sm80.90")
    assert not (tmp_path / "w").exists()
