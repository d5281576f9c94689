"""Remote wheel stores: the images' OCI registry (oras) and a PEP 503 index (twine + pip), pull-through and

The Docker half of tests/unit/cache/test_cache_remote.py: its docstring says the rest."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from builder.cache import CacheCorrupt
from builder.cache.config import parse_spec
from builder.cache.index import label_for
from builder.cache.local import Wheelhouse
from builder.cache.registry import RegistryStore
from builder.cache.tiered import PULLS, TieredCache, cache_for
from builder.errors import EnvironmentProblem

from tests.support.cache_remote import ARCHS, FIXTURE, KEY, cli, make_wheel, manifest_for, rewrite_member

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# -- the registry (real services) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def service_images(local_bases):
    from tests import services

    return {"registry": services.build_image(services.REGISTRY_IMAGE, services.SERVICES / "registry"),
            "index": services.build_image(services.INDEX_IMAGE, services.SERVICES / "pypiserver")}


@pytest.fixture(scope="module")
def auth_registry_service(service_images):
    from tests import services

    with services.registry("builder", "pw-" + os.urandom(6).hex()) as svc:
        yield svc


@pytest.fixture
def registry_env(auth_registry_service, monkeypatch, tmp_path):
    """Credentials by environment, and an empty DOCKER_CONFIG that must stay empty."""
    monkeypatch.setenv("BUILDER_REGISTRY_USER", auth_registry_service.user)
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", auth_registry_service.password)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    (tmp_path / "docker-config").mkdir()
    yield auth_registry_service
    assert not list((tmp_path / "docker-config").iterdir()), "credentials must never be written"


def stored_entry(tmp: Path, remote: str, payload: bytes = b"\x7fELF fake kernel library", key: str = KEY):
    """A wheel built and 'audited' (manifest), stored through a TieredCache (wheelhouse + push)."""
    wheel = make_wheel(tmp / "out", payload)
    cache = cache_for(Wheelhouse(tmp / "wh-builder"), [parse_spec(remote, "test", "127.0.0.1:1/x")])
    entry = cache.store("cuda-ext", key, [wheel], manifest_for([wheel], key=key))
    return cache, entry, wheel


def test_registry_push_annotations_digest_and_pull_through_with_basic_auth(registry_env, tmp_path, monkeypatch):
    remote = f"registry:{registry_env.host}/builder/wheels"
    statuses: list[int] = []
    real_send = requests.adapters.HTTPAdapter.send

    def send(self, request, **kw):
        resp = real_send(self, request, **kw)
        statuses.append(resp.status_code)
        return resp

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)
    _, entry, wheel = stored_entry(tmp_path, remote)
    # after the one probe of /v2/, Basic credentials go with every request: a registry answers a large upload's
    # 401 by closing the connection mid-body, so no request may be sent without them
    assert statuses[0] == 401 and 401 not in statuses[1:], statuses
    assert entry.notes and entry.notes[0].startswith("pushed cuda-ext")
    pushed = entry.manifest["remotes"]["registry"]
    assert pushed["digest"].startswith("sha256:")
    assert json.loads((Path(entry.location) / "builder-wheel.json").read_text())["remotes"]["registry"]["digest"] == pushed["digest"]
    # the OCI manifest: one layer per wheel + the manifest, annotations with key inputs and audit
    ref = f"http://{registry_env.host}/v2/builder/wheels/cuda-ext/manifests/{KEY}"
    oci = requests.get(ref, auth=(registry_env.user, registry_env.password),
                       headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10)
    assert oci.headers["Docker-Content-Digest"] == pushed["digest"]
    ann = oci.json()["annotations"]
    assert ann["io.builder.key"] == KEY and ann["io.builder.archs"] == "80,90" and ann["io.builder.package"] == "cuda-ext"
    assert json.loads(ann["io.builder.audit"])["ok"] is True
    assert json.loads(ann["io.builder.key-inputs"])["cuda"] == "13.0.88"
    titles = [l["annotations"]["org.opencontainers.image.title"] for l in oci.json()["layers"]]
    assert titles == [wheel.name, "builder-wheel.json"]
    # a second machine: empty wheelhouse, the registry only
    said: list[str] = []
    other = TieredCache(Wheelhouse(tmp_path / "wh-other"), cache_for(Wheelhouse(tmp_path / "x"), [parse_spec(remote, "t", "")]).remotes, said.append)
    hit = other.lookup("cuda-ext", KEY, ARCHS)
    assert hit.remote and hit.usable and hit.store == "registry" and hit.location.endswith("@" + pushed["digest"])
    paths = other.fetch(hit, tmp_path / "dest")
    assert [p.read_bytes() for p in paths] == [wheel.read_bytes()]
    assert hit.manifest["files"][wheel.name]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    local = other.local.lookup("cuda-ext", KEY, ARCHS)
    assert local.usable and local.manifest["pulled"]["from"] == f"registry {registry_env.host}/builder/wheels"
    assert local.manifest["registry"]["digest"] == pushed["digest"]
    assert any(s.startswith("pulled cuda-ext") and "every sha256 verified" in s for s in said)
    assert not list((tmp_path / "wh-other" / PULLS).iterdir())


def test_registry_credentials_from_docker_login_and_wrong_ones_are_exit_3(auth_registry_service, tmp_path, monkeypatch):
    import base64

    svc = auth_registry_service
    monkeypatch.delenv("BUILDER_REGISTRY_USER", raising=False)
    monkeypatch.delenv("BUILDER_REGISTRY_PASSWORD", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    spec = parse_spec(f"registry:{svc.host}/builder/wheels", "t", "")
    with pytest.raises(EnvironmentProblem, match=f"asks for credentials: `docker login {svc.host}`"):
        RegistryStore(spec).lookup("cuda-ext", KEY, ARCHS)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {svc.host: {"auth": base64.b64encode(f"{svc.user}:wrong".encode()).decode()}}}))
    with pytest.raises(EnvironmentProblem, match="refuses the credentials from docker login"):
        RegistryStore(spec).lookup("cuda-ext", KEY, ARCHS)
    config.write_text(json.dumps({"auths": {svc.host: {"auth": base64.b64encode(f"{svc.user}:{svc.password}".encode()).decode()}}}))
    before = config.read_bytes()
    RegistryStore(spec).lookup("cuda-ext", "f" * 64, ARCHS)  # logged in: a miss, no error
    assert config.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def push_raw(svc, key: str, files: dict[str, bytes], tmp: Path) -> None:
    """Push an artifact by hand (oras, as a person or a broken tool would), replacing the tag."""
    import oras.provider

    d = tmp / f"raw-{os.urandom(3).hex()}"
    d.mkdir()
    paths = []
    for name, data in files.items():
        (d / name).write_bytes(data)
        paths.append(str(d / name))
    client = oras.provider.Registry(hostname=svc.host, insecure=True, auth_backend="basic")
    client.auth.set_basic_auth(svc.user, svc.password)
    client.auth.load_configs = lambda *a, **k: None
    client.push(target=f"{svc.host}/builder/wheels/cuda-ext:{key}", files=paths, disable_path_validation=True, quiet=True)


@pytest.mark.parametrize("case", ["tampered inside a valid zip", "truncated", "bit-flipped", "audit failed",
                                  "blob corrupt on the registry's disk"])
def test_a_bad_registry_artifact_is_not_used_but_reported_and_healed(registry_env, tmp_path, case):
    """The compile step's cache path against each corruption: the entry is detected (at lookup or while the
    download streams), never used, reported as left in the registry; the wheel is rebuilt and its push
    replaces the artifact — except a blob corrupt on the registry's own disk, which a push cannot replace."""
    from builder.steps.compile import CompileStep

    svc = registry_env
    key = hashlib.sha256(case.encode()).hexdigest()
    remote = f"registry:{svc.host}/builder/wheels"
    builder_cache, entry, wheel = stored_entry(tmp_path, remote, key=key)
    good = wheel.read_bytes()
    meta = json.loads((Path(entry.location) / "builder-wheel.json").read_text())
    meta.pop("remotes", None)
    if case == "tampered inside a valid zip":
        bad = rewrite_member(wheel, "libsaxpy.so", b"\x7fELF evil", tmp_path / "evil.whl").read_bytes()
        push_raw(svc, key, {wheel.name: bad, "builder-wheel.json": json.dumps(meta).encode()}, tmp_path)
    elif case == "truncated":
        push_raw(svc, key, {wheel.name: good[: len(good) // 2], "builder-wheel.json": json.dumps(meta).encode()}, tmp_path)
    elif case == "bit-flipped":
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0x10
        push_raw(svc, key, {wheel.name: bytes(flipped), "builder-wheel.json": json.dumps(meta).encode()}, tmp_path)
    elif case == "audit failed":
        push_raw(svc, key, {wheel.name: good, "builder-wheel.json": json.dumps({**meta, "audit": {"ok": False, "archs": [80]}}).encode()}, tmp_path)
    else:  # flip a byte of the wheel's blob file inside the registry's storage
        digest = hashlib.sha256(good).hexdigest()
        blob = f"/var/lib/registry/docker/registry/v2/blobs/sha256/{digest[:2]}/{digest}/data"
        res = svc.container.exec(["sh", "-c", f"printf 'X' | dd of={blob} bs=1 seek=100 conv=notrunc 2>/dev/null && echo done"])
        assert b"done" in res.output, res.output
    # a second machine's build: empty wheelhouse, the registry only; the compile step's cache path
    cache = cache_for(Wheelhouse(tmp_path / "wh-ci"), [parse_spec(remote, "t", "")])
    notes: list[str] = []

    class Ctx:  # the part of CellContext the cache path uses
        reused: dict = {}
        cell = type("C", (), {"archs": ARCHS})()

        def __init__(self):
            self.cache = cache

        def out_dir(self, name):
            return tmp_path / "out-ci"

        def note(self, text):
            notes.append(text)

    wheel_step = type("W", (), {"key": key, "short_key": key[:16],
                                "package": type("P", (), {"name": "cuda-ext", "version": "1.0.0", "cache_archs": ARCHS})()})()
    assert CompileStep()._cached(Ctx(), wheel_step) is None, "a bad remote entry must not be used"
    (note,) = notes
    assert "cache entry of cuda-ext==1.0.0" in note and "is bad:" in note and "compiling again" in note
    assert f"left in registry {svc.host}/builder/wheels (builder never deletes remote data)" in note
    assert not (tmp_path / "wh-ci" / "cuda-ext").exists() or not list((tmp_path / "wh-ci" / "cuda-ext").iterdir())
    assert not list((tmp_path / "out-ci").glob("*")) if (tmp_path / "out-ci").exists() else True
    assert cache.lookup("cuda-ext", key, ARCHS) is None  # skipped for the rest of this run
    # the rebuild is stored and written through
    rebuilt = cache.store("cuda-ext", key, [wheel], manifest_for([wheel], key=key))
    assert rebuilt.notes[0].startswith("pushed cuda-ext")
    fresh = cache_for(Wheelhouse(tmp_path / "wh-next"), [parse_spec(remote, "t", "")])
    hit = fresh.lookup("cuda-ext", key, ARCHS)
    if case == "blob corrupt on the registry's disk":
        assert "a push cannot replace a blob the registry already has" in note
        with pytest.raises(CacheCorrupt, match="the registry serves other bytes under the blob digest"):
            fresh.fetch(hit, tmp_path / "out-next")
    else:
        assert hit.usable, hit.problem
        assert [p.read_bytes() for p in fresh.fetch(hit, tmp_path / "out-next")] == [good]


def big_entry(tmp: Path, size: int) -> tuple[Path, dict]:
    wheel = make_wheel(tmp / "big", os.urandom(size))
    return wheel, manifest_for([wheel])


def test_registry_down_mid_pull_leaves_the_wheelhouse_intact_and_nothing_half_written(service_images, tmp_path, monkeypatch):
    """The registry is killed once the blob download has started (64 MB: far more than socket buffers hold):
    a clear exit-3 error naming the remote, no entry, no temporary files; the other entry is untouched."""
    from tests import services

    with services.registry("mid", "pull") as svc:  # with auth: a 64 MB upload must carry its credentials up front
        monkeypatch.setenv("BUILDER_REGISTRY_USER", "mid")
        monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "pull")
        remote = parse_spec(f"registry:{svc.host}/builder/wheels", "t", "")
        wheel, manifest = big_entry(tmp_path, 64 << 20)
        pushed = cache_for(Wheelhouse(tmp_path / "wh-builder"), [remote]).store("cuda-ext", KEY, [wheel], manifest)
        assert pushed.notes[0].startswith("pushed"), pushed.notes
        wh = Wheelhouse(tmp_path / "wh")
        other_wheel = make_wheel(tmp_path / "other", b"other")
        wh.store("cuda-ext", "e" * 64, [other_wheel], manifest_for([other_wheel], key="e" * 64))
        before = {p: p.read_bytes() for p in (tmp_path / "wh").rglob("*") if p.is_file()}
        cache = cache_for(wh, [remote])
        hit = cache.lookup("cuda-ext", KEY, ARCHS)
        assert hit.usable and hit.remote
        real = RegistryStore._request

        def kill_once_streaming(self, client, url, method, **kw):
            resp = real(self, client, url, method, **kw)
            if kw.get("stream"):
                svc.kill()
            return resp

        monkeypatch.setenv("BUILDER_REMOTE_TIMEOUT", "10")
        monkeypatch.setattr(RegistryStore, "_request", kill_once_streaming)
        with pytest.raises(EnvironmentProblem) as err:
            cache.fetch(hit, tmp_path / "dest")
        msg = str(err.value)
        assert f"pulling cuda-ext (key {KEY[:16]}) from registry {svc.host}/builder/wheels failed" in msg
        assert "stopped during the download" in msg and "Nothing was written to the wheelhouse" in msg
        after = {p: p.read_bytes() for p in (tmp_path / "wh").rglob("*") if p.is_file()}
        assert after == before  # the other entry as it was; no new entry, no .part, nothing in .pulls
        assert wh.lookup("cuda-ext", KEY, ARCHS) is None and wh.lookup("cuda-ext", "e" * 64, ARCHS).usable
        assert not list((tmp_path / "dest").glob("*"))


# -- the index (real pypiserver) -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def index_service(service_images):
    from tests import services

    with services.index("uploader", "pw-" + os.urandom(6).hex()) as svc:
        yield svc


def test_index_upload_with_a_local_label_pip_install_outside_builder_and_pull(index_service, tmp_path, monkeypatch):
    svc = index_service
    monkeypatch.setenv("BUILDER_INDEX_USER", svc.user)
    monkeypatch.setenv("BUILDER_INDEX_PASSWORD", svc.password)
    url = f"http://{svc.host}/simple"
    _, entry, wheel = stored_entry(tmp_path, f"index:{url}")
    label = f"cu130.torch2140.sm80.90.k{KEY[:12]}"
    assert entry.notes[0].startswith("pushed cuda-ext") and label in entry.notes[0]
    # pushing again is a no-op (same bytes already there)
    again = cache_for(Wheelhouse(tmp_path / "wh-builder"), [parse_spec(f"index:{url}", "t", "")])
    assert again.store("cuda-ext", KEY, [wheel], manifest_for([wheel])).notes[0].startswith("pushed")
    # people outside builder: pip install by exact local version (and a plain ==1.0.0 finds it too)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target),
                          "--index-url", url + "/", f"cuda-ext==1.0.0+{label}"], capture_output=True, text=True,
                         env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert pip.returncode == 0, pip.stdout + pip.stderr
    (dist_info,) = target.glob("cuda_ext-*.dist-info")
    assert dist_info.name == f"cuda_ext-1.0.0+{label}.dist-info"
    assert (target / "cuda_ext" / "libsaxpy.so").read_bytes() == b"\x7fELF fake kernel library"
    # uploads need the login; reading does not
    monkeypatch.setenv("BUILDER_INDEX_PASSWORD", "wrong")
    other = make_wheel(tmp_path / "o", b"other payload")
    refused = cache_for(Wheelhouse(tmp_path / "wh-2"), [parse_spec(f"index:{url}", "t", "")]).store(
        "cuda-ext", "d" * 64, [other], manifest_for([other], key="d" * 64))
    assert refused.notes[0].startswith("WARNING: pushing cuda-ext") and "refused the upload" in refused.notes[0]
    assert Wheelhouse(tmp_path / "wh-2").lookup("cuda-ext", "d" * 64, ARCHS).usable  # still cached locally
    # another machine pulls into an empty wheelhouse
    monkeypatch.delenv("BUILDER_INDEX_USER")
    monkeypatch.delenv("BUILDER_INDEX_PASSWORD")
    cache = cache_for(Wheelhouse(tmp_path / "wh-ci"), [parse_spec(f"index:{url}", "t", "")])
    hit = cache.lookup("cuda-ext", KEY, ARCHS)
    assert hit.remote and hit.usable and hit.store == "index"
    (path,) = cache.fetch(hit, tmp_path / "dest")
    assert path.name == f"cuda_ext-1.0.0+{label}-cp311-cp311-linux_x86_64.whl"
    local = cache.local.lookup("cuda-ext", KEY, ARCHS)
    assert local.usable and local.manifest["index"]["original_wheels"] == [wheel.name]
    assert hit.manifest["files"][path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_tampered_index_wheel_is_detected_and_an_index_that_allows_it_is_healed(service_images, tmp_path, monkeypatch):
    from tests import services

    with services.index(overwrite=True) as svc:
        url = f"http://{svc.host}/simple"
        _, entry, wheel = stored_entry(tmp_path, f"index:{url}")
        name = f"cuda_ext-1.0.0+{label_for(entry.manifest, KEY)}-cp311-cp311-linux_x86_64.whl"
        assert name in entry.notes[0]
        # replace the file on the index's disk by a wheel tampered inside a valid zip
        good = Path(tmp_path / "good.whl")
        cache = cache_for(Wheelhouse(tmp_path / "wh-a"), [parse_spec(f"index:{url}", "t", "")])
        hit = cache.lookup("cuda-ext", KEY, ARCHS)
        good.write_bytes(requests.get(hit.manifest["index"]["files"][name]["url"], timeout=10).content)
        evil = rewrite_member(good, "libsaxpy.so", b"\x7fELF evil", tmp_path / name)
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(evil, arcname=name)
        assert svc.container.get_wrapped_container().put_archive("/srv/packages", buf.getvalue())
        cache = cache_for(Wheelhouse(tmp_path / "wh-b"), [parse_spec(f"index:{url}", "t", "")])
        hit = cache.lookup("cuda-ext", KEY, ARCHS)
        with pytest.raises(CacheCorrupt, match="libsaxpy.so: sha256"):
            cache.fetch(hit, tmp_path / "dest")
        assert "remove" in cache.discard(hit, "tampered") and Wheelhouse(tmp_path / "wh-b").lookup("cuda-ext", KEY, ARCHS) is None
        # the rebuild's push replaces it (this index allows overwrites); the next pull is good
        rebuilt = cache.store("cuda-ext", KEY, [wheel], manifest_for([wheel]))
        assert rebuilt.notes[0].startswith("pushed"), rebuilt.notes
        fresh = cache_for(Wheelhouse(tmp_path / "wh-c"), [parse_spec(f"index:{url}", "t", "")])
        (path,) = fresh.fetch(fresh.lookup("cuda-ext", KEY, ARCHS), tmp_path / "dest2")
        assert path.read_bytes() == good.read_bytes()


def test_an_index_that_refuses_overwrites_is_reported_not_fatal(index_service, tmp_path, monkeypatch):
    svc = index_service
    monkeypatch.setenv("BUILDER_INDEX_USER", svc.user)
    monkeypatch.setenv("BUILDER_INDEX_PASSWORD", svc.password)
    url = f"http://{svc.host}/simple"
    key = "c" * 64
    stored_entry(tmp_path, f"index:{url}", key=key)
    _, second, _ = stored_entry(tmp_path / "b", f"index:{url}", payload=b"\x7fELF different build", key=key)
    assert second.notes[0].startswith("WARNING") and "refuses to replace it" in second.notes[0], second.notes


# -- end to end: builder build with the fixture cell ----------------------------------------------------
@pytest.fixture(scope="module")
def e2e(service_images, tmp_path_factory):
    from tests import services

    tmp = tmp_path_factory.mktemp("e2e")
    with services.registry("ci", "pw-" + os.urandom(6).hex()) as reg, services.index() as idx:
        env = {"BUILDER_REGISTRY_USER": reg.user, "BUILDER_REGISTRY_PASSWORD": reg.password,
               "DOCKER_CONFIG": str(tmp / "docker-config")}
        yield tmp, reg, idx, env


def build(tmp: Path, wheelhouse: str, *extra: str, env: dict) -> subprocess.CompletedProcess[str]:
    return cli("build", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / wheelhouse),
               "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / f"logs-{wheelhouse}"), "--pins-dir", str(tmp / "pins"),
               "--ca-bundle", str(HOST_CA), "--quiet", "--json", *extra, cwd=tmp, env=env)


CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
REF = "127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90"


# slow: a compile, a push and a second build; the default tier pulls in
# test_registry_down_mid_pull_leaves_the_wheelhouse_intact_and_nothing_half_written and reuses in
# test_unchanged_package_is_never_compiled_twice
@pytest.mark.slow
def test_pull_into_an_empty_wheelhouse_then_build_with_zero_compiles(e2e, docker_engine):
    tmp, reg, idx, env = e2e
    registry = f"registry:{reg.host}/builder-test/wheels"
    first = build(tmp, "wh-builder", "--cache-remote", registry, env=env)
    assert first.returncode == 0, first.stderr
    (cell,) = json.loads(first.stdout)
    cache_step = next(s for s in cell["steps"] if s["step"] == "cache")
    assert cache_step["status"] == "ok" and cache_step["artifacts"]["remotes"]["registry"]["digest"].startswith("sha256:")
    assert "pushed cuda-ext" in first.stderr
    assert next(s for s in cell["steps"] if s["step"] == "compile")["artifacts"]["reused"] is False
    # the same wheel into the index too, by key (people outside builder install it from there)
    entry = next((tmp / "wh-builder" / "cuda-ext").iterdir())
    pushed = cli("wheels", "push", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / "wh-builder"),
                 "--cache-remote", f"index:http://{idx.host}/simple", "--key", entry.name[:12], cwd=tmp, env=env)
    assert pushed.returncode == 0 and "1 pushed, 0 bad, of 1 entries" in pushed.stdout, pushed.stdout + pushed.stderr
    # plan on an empty wheelhouse: network-free says build; --remote says pull from the registry
    plan = cli("plan", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / "wh-ci"), cwd=tmp, env=env)
    assert re.search(r"build\s+cuda-ext==1\.0\.0", plan.stdout), plan.stdout
    plan = cli("plan", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / "wh-ci"), "--remote",
               "--cache-remote", registry, "--json", cwd=tmp, env=env)
    (pkg,) = json.loads(plan.stdout)["cells"][0]["packages"]
    assert pkg["action"] == "pull" and pkg["cached_in"] == "registry", pkg
    # each store alone, into an empty wheelhouse: zero compiles, the image built from the pulled wheel
    for store, spec in (("registry", registry), ("index", f"index:http://{idx.host}/simple")):
        res = build(tmp, f"wh-{store}", "--cache-remote", spec, env=env)
        assert res.returncode == 0, res.stderr
        (cell,) = json.loads(res.stdout)
        compile_ = next(s for s in cell["steps"] if s["step"] == "compile")
        assert compile_["artifacts"]["reused"] is True and compile_["artifacts"]["cached_in"] == store
        assert cell["built"] == [] and cell["result"] == "ok"
        assert "--target wheels-cuda-ext" not in (tmp / f"logs-wh-{store}" / f"{CELL}.log").read_text()
        assert f"pulled cuda-ext (key {entry.name[:16]})" in res.stderr
        assert Wheelhouse(tmp / f"wh-{store}").lookup("cuda-ext", entry.name, ARCHS).usable
        shown = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", REF, "-c",
                                "import importlib.metadata as m; print(m.version('cuda-ext'))"],
                               capture_output=True, text=True)
        version = shown.stdout.strip()
        assert version == "1.0.0" if store == "registry" else version.startswith("1.0.0+cu130.sm80.90.k"), version
    # wheels pull by cell selection into another empty wheelhouse, then verify it
    pulled = cli("wheels", "pull", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / "wh-pull"),
                 "--cache-remote", registry, cwd=tmp, env=env)
    assert pulled.returncode == 0 and "1 pulled" in pulled.stdout, pulled.stdout + pulled.stderr
    verified = cli("wheels", "verify", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(tmp / "wh-pull"), cwd=tmp)
    assert verified.returncode == 0 and "1 of 1 entries verified" in verified.stdout, verified.stdout
    assert not (tmp / "docker-config" / "config.json").exists()  # credentials are read, never written


def test_concurrent_pulls_of_one_key_leave_one_good_entry(registry_env, tmp_path):
    """Builds pulling the same key into one wheelhouse at once (the compile step's first look holds no lock):
    each gets verified wheels, one entry, nothing quarantined."""
    remote = f"registry:{registry_env.host}/builder/wheels"
    key = "a1" * 32
    stored_entry(tmp_path, remote, key=key)
    results, errors = [], []

    def pull(i):
        try:
            cache = cache_for(Wheelhouse(tmp_path / "shared"), [parse_spec(remote, "t", "")])
            hit = cache.lookup("cuda-ext", key, ARCHS)
            barrier.wait(timeout=30)
            results.append(cache.fetch(hit, tmp_path / f"dest{i}"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=pull, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and len(results) == 4, errors
    assert [p.name for p in (tmp_path / "shared" / "cuda-ext").iterdir()] == [key]
    assert Wheelhouse(tmp_path / "shared").lookup("cuda-ext", key, ARCHS).usable
    assert not (tmp_path / "shared" / ".quarantine").exists()  # no good entry was replaced by another pull
    assert all(r[0].read_bytes() == results[0][0].read_bytes() for r in results)
