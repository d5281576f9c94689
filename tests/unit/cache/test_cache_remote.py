"""Remote wheel stores: the images' OCI registry (oras) and a PEP 503 index (twine + pip), pull-through and
write-through behind the local wheelhouse, against REAL services on 127.0.0.1 started as containers through
testcontainers (tests/services.py; images built locally from the Debian base). The first part needs no
service: configuration, relabelled wheels, and a remote that is down."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from builder.cache import CacheCorrupt
from builder.cache.config import parse_spec
from builder.net import registry_credentials
from builder.cache.index import embedded_manifest, label_for, relabel, verify_labelled
from builder.errors import UserError

from tests.helpers import MATRIX as SHIPPED, REPO
from tests.support.cache_remote import ARCHS, FIXTURE, KEY, cli, make_wheel, manifest_for, rewrite_member


def matrix_with_cache(tmp: Path, cache_toml: str) -> Path:
    """The shipped matrix plus a [defaults.cache] table, next to a copy of the lock."""
    path = tmp / "matrix.toml"
    path.write_text(SHIPPED.read_text() + "\n[defaults.cache]\n" + cache_toml + "\n")
    (tmp / "matrix.lock").write_text((REPO / "matrix.lock").read_text())
    return path


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# -- configuration ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache_toml, message", [
    ('remotes = "registry"', "defaults.cache.remotes: expected a list of strings or tables, got a string 'registry'"),
    ('remotes = ["s3:bucket"]', "defaults.cache.remotes[0]: 's3:bucket': unknown store kind 's3'"),
    ('remotes = ["index"]', "defaults.cache.remotes[0]: index needs its URL"),
    ('remotes = ["index:ftp://host/simple"]', "defaults.cache.remotes[0].url: 'ftp://host/simple' is not an http(s) URL"),
    ('remotes = ["index:http://u:p@host/simple"]', "put no credentials in the URL"),
    ('remotes = ["registry:Not A Registry"]', "defaults.cache.remotes[0].url: 'Not A Registry' is not a registry repository"),
    ('remotes = [{ kind = "index", url = "http://h/simple", push = "yes" }]', "defaults.cache.remotes[0].push: expected a boolean, got a string 'yes'"),
    ('remotes = [{ kind = "registry", upload = "http://h/" }]', "defaults.cache.remotes[0].upload: only an index has an upload URL"),
    ('remotes = [{ kind = "index", url = "http://h/simple", pull = true }]', "unknown key 'pull'"),
    ('remotes = ["registry", "registry"]', "defaults.cache.remotes[1]: registry:127.0.0.1:5000/builder/wheels is listed twice"),
    ('remote = ["registry"]', "defaults.cache: unknown key 'remote' (did you mean 'remotes'?); allowed: compile, dist, dist_cores, remotes"),
])
def test_a_bad_cache_table_is_exit_2_naming_the_key(tmp_path, cache_toml, message):
    res = cli("plan", "--matrix", str(matrix_with_cache(tmp_path, cache_toml)), cwd=tmp_path)
    assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.pure
def test_cache_specs_in_both_forms():
    assert parse_spec("registry", "x", "127.0.0.1:5000/builder").url == "127.0.0.1:5000/builder/wheels"
    spec = parse_spec({"kind": "index", "url": "http://127.0.0.1:8080/simple", "push": False}, "x", "r/b")
    assert (spec.kind, spec.push, spec.upload) == ("index", False, None)
    from builder.cache.index import upload_url_for

    assert upload_url_for("http://127.0.0.1:8080/simple/") == "http://127.0.0.1:8080/"
    assert upload_url_for("https://devpi.example.com/root/dev/+simple/") == "https://devpi.example.com/root/dev/"
    with pytest.raises(UserError, match="registry, registry:HOST/REPO or index:URL"):
        parse_spec("oci:x", "--cache-remote oci:x", "r/b")


def test_cache_flags_are_checked_before_anything_runs(tmp_path):
    m = str(FIXTURE / "matrix.toml")
    res = cli("build", "--matrix", m, "--no-remote", "--cache-remote", "registry", "--work-dir", str(tmp_path / "w"), cwd=tmp_path)
    assert res.returncode == 2 and "--no-remote and --cache-remote contradict each other" in res.stderr
    res = cli("plan", "--matrix", m, "--cache-remote", "index:nope", cwd=tmp_path)
    assert res.returncode == 2 and "is not an http(s) URL" in res.stderr
    res = cli("wheels", "push", "--matrix", m, "--wheelhouse", str(tmp_path / "wh"), cwd=tmp_path)
    assert res.returncode == 2 and "no remote wheel store" in res.stderr
    assert not (tmp_path / "w").exists()


def test_plan_stays_offline_by_default_and_a_down_remote_is_exit_3(tmp_path):
    """Remotes configured but down: plan (no --remote) neither asks them nor fails; plan --remote and build
    stop with exit 3 before anything runs, naming the remote and --no-remote; --no-remote builds locally."""
    port = closed_port()
    matrix = matrix_with_cache(tmp_path, f'remotes = ["registry:127.0.0.1:{port}/builder/wheels", '
                                         f'"index:http://127.0.0.1:{port}/simple"]')
    res = cli("plan", "--matrix", str(matrix), "--wheelhouse", str(tmp_path / "wh"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert re.search(r"build\s+vllm==0\.33\.0", res.stdout)
    down = cli("plan", "--matrix", str(matrix), "--wheelhouse", str(tmp_path / "wh"), "--remote", cwd=tmp_path)
    assert down.returncode == 3, down.stderr
    assert f"cache remote registry 127.0.0.1:{port}/builder/wheels does not answer ([Errno 111] Connection refused)" in down.stderr
    assert "--no-remote" in down.stderr
    built = cli("build", "--matrix", str(FIXTURE / "matrix.toml"), "--cache-remote", f"index:http://127.0.0.1:{port}/simple",
                "--work-dir", str(tmp_path / "work"), "--wheelhouse", str(tmp_path / "wh"), "--dry-run", cwd=tmp_path)
    assert built.returncode == 3 and f"cache remote index http://127.0.0.1:{port}/simple does not answer" in built.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "wh").exists()
    local = cli("build", "--matrix", str(FIXTURE / "matrix.toml"), "--no-remote", "--work-dir", str(tmp_path / "work"),
                "--wheelhouse", str(tmp_path / "wh"), "--dry-run", cwd=tmp_path)
    assert local.returncode == 0 and "--target wheels-cuda-ext" in local.stdout, local.stderr


@pytest.mark.pure
def test_registry_credentials_come_from_env_or_docker_login_and_are_never_written(tmp_path, monkeypatch):
    import base64

    monkeypatch.delenv("BUILDER_REGISTRY_USER", raising=False)
    monkeypatch.delenv("BUILDER_REGISTRY_PASSWORD", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert registry_credentials("127.0.0.1:5000") == (None, "")
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:5000": {"auth": base64.b64encode(b"ci:pw:x").decode()}}}))
    creds, source = registry_credentials("127.0.0.1:5000")
    assert creds == ("ci", "pw:x") and "docker login" in source
    monkeypatch.setenv("BUILDER_REGISTRY_USER", "env-user")
    with pytest.raises(UserError, match="BUILDER_REGISTRY_PASSWORD is not set but BUILDER_REGISTRY_USER is"):
        registry_credentials("127.0.0.1:5000")
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "env-pw")
    # bound to one host (issue 34): the registry the command was given, else only BUILDER_REGISTRY_HOST's
    assert registry_credentials("127.0.0.1:5000", given=True)[0] == ("env-user", "env-pw")
    assert registry_credentials("127.0.0.1:5000")[0] == ("ci", "pw:x")  # an image's host: its own docker login
    assert registry_credentials("127.0.0.1:5001") == (None, "")
    monkeypatch.setenv("BUILDER_REGISTRY_HOST", "127.0.0.1:5001")
    assert registry_credentials("127.0.0.1:5001")[0] == ("env-user", "env-pw")
    assert registry_credentials("127.0.0.1:5000", given=True)[0] == ("ci", "pw:x")  # the binding wins
    monkeypatch.setenv("BUILDER_REGISTRY_HOST", "a b")
    with pytest.raises(UserError, match="BUILDER_REGISTRY_HOST: 'a b' is not a registry host"):
        registry_credentials("127.0.0.1:5001")
    monkeypatch.delenv("BUILDER_REGISTRY_HOST")


# -- relabelled wheels (the index's form) ----------------------------------------------------------------
@pytest.mark.pure
def test_relabelled_wheel_is_consistent_and_carries_its_manifest(tmp_path):
    wheel = make_wheel(tmp_path / "src")
    manifest = manifest_for([wheel])
    label = label_for(manifest, KEY)
    assert label == f"cu130.torch2140.sm80.90.k{KEY[:12]}"
    out = relabel(wheel, label, manifest, tmp_path)
    assert out.name == f"cuda_ext-1.0.0+{label}-cp311-cp311-linux_x86_64.whl"
    (tmp_path / "again").mkdir()
    assert relabel(wheel, label, manifest, tmp_path / "again").read_bytes() == out.read_bytes()  # deterministic
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        info = f"cuda_ext-1.0.0+{label}.dist-info"
        assert {f"{info}/METADATA", f"{info}/RECORD", f"{info}/builder-wheel.json"} <= set(names)
        assert not [n for n in names if n.startswith("cuda_ext-1.0.0.dist-info")]
        assert f"Version: 1.0.0+{label}\n" in zf.read(f"{info}/METADATA").decode()
        assert zf.read("cuda_ext/libsaxpy.so") == b"\x7fELF fake kernel library"  # the payload is untouched
        record = zf.read(f"{info}/RECORD").decode().splitlines()
        assert len(record) == len(names) and names[-1] == f"{info}/RECORD"
    meta = verify_labelled(out, "cuda-ext", KEY, ARCHS)
    assert meta["files"] == manifest["files"] and meta["index"]["original"] == wheel.name
    assert embedded_manifest(out)["key"] == KEY


@pytest.mark.pure
def test_a_tampered_relabelled_wheel_is_caught(tmp_path):
    wheel = make_wheel(tmp_path / "src")
    good = relabel(wheel, label_for(manifest_for([wheel]), KEY), manifest_for([wheel]), tmp_path)
    for d in ("t4", "t5"):
        (tmp_path / d).mkdir()
    cases = {
        "inside a valid zip": rewrite_member(good, "libsaxpy.so", b"\x7fELF evil", tmp_path / "t1.whl"),
        "truncated": tmp_path / "t2.whl",
        "bit-flipped": tmp_path / "t3.whl",
        "audit failed": relabel(wheel, "x", manifest_for([wheel], audit_ok=False), tmp_path / "t4"),
        "another key": relabel(wheel, "x", manifest_for([wheel], key="0" * 64), tmp_path / "t5"),
    }
    data = good.read_bytes()
    cases["truncated"].write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x01
    cases["bit-flipped"].write_bytes(bytes(flipped))
    for what, path in cases.items():
        with pytest.raises(CacheCorrupt) as err:
            verify_labelled(path, "cuda-ext", KEY, ARCHS)
        assert str(err.value), what
    # A flipped bit anywhere in a member's stored bytes is caught as corrupt, whatever the decompressor makes of
    # it (a bad CRC, bad deflate data, a short member), unless the member still reads back byte for byte the
    # same (a flip in a deflate stream's final padding bits): 1 in 7 bytes of every member, each bit in turn.
    with zipfile.ZipFile(good) as z:
        originals = {info.filename: (info, z.read(info)) for info in z.infolist()}
    flips = harmless = 0
    for name, (info, content) in originals.items():
        local = data[info.header_offset + 26: info.header_offset + 30]
        start = info.header_offset + 30 + int.from_bytes(local[:2], "little") + int.from_bytes(local[2:], "little")
        for offset in range(start, start + info.compress_size, 7):
            flipped = bytearray(data)
            flipped[offset] ^= 1 << (offset % 8)
            cases["bit-flipped"].write_bytes(bytes(flipped))
            try:
                verify_labelled(cases["bit-flipped"], "cuda-ext", KEY, ARCHS)
            except CacheCorrupt:
                flips += 1
                continue
            with zipfile.ZipFile(cases["bit-flipped"]) as z:
                assert z.read(name) == content, f"a flip at byte {offset - start} of {name} was accepted"
            harmless += 1
    assert flips > 20 and harmless < flips // 10
    with pytest.raises(CacheCorrupt, match="libsaxpy.so: sha256"):
        verify_labelled(cases["inside a valid zip"], "cuda-ext", KEY, ARCHS)
    with pytest.raises(CacheCorrupt, match="its recorded audit did not pass"):
        verify_labelled(cases["audit failed"], "cuda-ext", KEY, ARCHS)
