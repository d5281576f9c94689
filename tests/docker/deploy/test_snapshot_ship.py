"""builder snapshot push / pull against a real registry (Debian's docker-registry on 127.0.0.1, the `registry`
fixture): a snapshot directory as an OCI artifact (its key the config, its files one tar+zstd layer), pulled whole
or not at all, judged before its layer is fetched. The snapshot directories here are written by the test (files of
CRIU's names and sizes, no process behind them); tests/docker/deploy/test_snapshot.py pushes, pulls and restores a
real one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from builder import registry_api
from builder.deploy.snapshot import key as key_mod
from builder.deploy.snapshot import ship
from tests.helpers import REPO

pytestmark = pytest.mark.docker


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


def snapshot_dir(path: Path, gpus=("none",), driver="none", subject="sha256:" + "5" * 64, log_extra=b"") -> Path:
    """A snapshot directory as take leaves it: CRIU's images (incompressible pages among them), the key, the
    record, the engine's log (grown after the dump by `log_extra`, as a restored engine's is), and what a restore
    leaves beside it (restore.pid, engine.log.1), which is not shipped."""
    (path / "images").mkdir(parents=True)
    (path / "images" / "inventory.img").write_bytes(b"inventory")
    (path / "images" / "pages-1.img").write_bytes(os.urandom(3 << 20) + b"\0" * (5 << 20))
    (path / "images" / "core-1.img").write_bytes(b"core" * 1000)
    key_mod.Key(gpus=tuple(gpus), driver=driver, subject=subject, model="stand-in-model", model_config_sha256="",
                engine_args=("python3", "-m", "standin", "--port", "8000"), tp=1, criu="4.1.1").write(path)
    log = b"booted\nasleep\n"
    (path / "engine.log").write_bytes(log + log_extra)
    (path / "engine.log").chmod(0o644)
    (path / "images" / "pages-1.img").chmod(0o600)
    (path / "snapshot.json").write_text(json.dumps({"answer": " Paris", "served_model": "stand-in-model",
                                                    "log_bytes": len(log), "directory": "/snapshot"}))
    (path / "restore.pid").write_text("123")
    (path / "engine.log.1").write_text("what a restored engine wrote")
    return path


def registry_log(tmp_path_factory) -> Path:
    return next(Path(tmp_path_factory.getbasetemp()).glob("registry*/registry.log"))


def test_a_snapshot_is_pushed_as_an_artifact_and_pulled_whole(registry, tmp_path):
    snap = snapshot_dir(tmp_path / "snap", log_extra=b"written after the restore\n")
    ref = f"{registry}/builder-test/snapshots:standin-mtp2"
    pushed = builder("snapshot", "push", str(snap), ref, "--json", cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    done = json.loads(pushed.stdout)
    assert done["files"] == 6 and 0 < done["layer_bytes"] < done["unpacked_bytes"]  # zstd took the zero pages
    assert list(snap.glob(".push-*")) == []  # the packed layer was a temporary file
    # the manifest: an OCI artifact whose config is the key, byte for byte
    with registry_api.Client(registry_api.endpoint(registry)) as c:
        body, media, digest = c.manifest(f"{registry}/builder-test/snapshots", "standin-mtp2", accept=ship.MANIFEST_MEDIA)
        doc = json.loads(body)
        assert digest == done["digest"] and doc["artifactType"] == ship.ARTIFACT
        assert doc["config"]["mediaType"] == ship.KEY_MEDIA and doc["layers"][0]["mediaType"] == ship.LAYER_MEDIA
        assert c.blob(f"{registry}/builder-test/snapshots", doc["config"]["digest"]) == (snap / "key.json").read_bytes()
    out = tmp_path / "pulled"
    pulled = builder("snapshot", "pull", f"{registry}/builder-test/snapshots@{done['digest']}", "--out", str(out), "--json",
                     cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["layer_bytes"] == done["layer_bytes"]
    shipped = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert shipped == ["engine.log", "images/core-1.img", "images/inventory.img", "images/pages-1.img", "key.json",
                       "snapshot.json"]  # not what a restore left beside it
    for name in shipped[1:]:
        assert (out / name).read_bytes() == (snap / name).read_bytes(), name
    assert (out / "engine.log").read_bytes() == b"booted\nasleep\n"  # at its size at the dump, as CRIU checks it
    for name in ("engine.log", "images/pages-1.img"):  # and its mode (CRIU: "has bad mode") and time
        assert (out / name).stat().st_mode == (snap / name).stat().st_mode, name
        assert int((out / name).stat().st_mtime) == int((snap / name).stat().st_mtime), name
    assert [p.name for p in tmp_path.iterdir() if ".pull-" in p.name] == []
    # pushing the same snapshot again uploads no blob twice and names the same manifest
    again = builder("snapshot", "push", str(snap), ref, "--json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["digest"] == done["digest"], again.stderr


def test_a_snapshot_of_another_gpu_is_refused_before_its_layer_is_fetched(registry, tmp_path, tmp_path_factory):
    snap = snapshot_dir(tmp_path / "snap", gpus=("NVIDIA H200",), driver="580.159.04")
    ref = f"{registry}/builder-test/snapshots:h200"
    assert builder("snapshot", "push", str(snap), ref, cwd=tmp_path).returncode == 0
    layer = "sha256:" + hashlib.sha256(b"").hexdigest()
    with registry_api.Client(registry_api.endpoint(registry)) as c:
        layer = json.loads(c.manifest(f"{registry}/builder-test/snapshots", "h200", accept=ship.MANIFEST_MEDIA)[0]
                           )["layers"][0]["digest"]
    log = registry_log(tmp_path_factory)
    fetched_before = log.read_text(errors="replace").count(f"GET /v2/builder-test/snapshots/blobs/{layer}")
    out = tmp_path / "o"
    refused = builder("snapshot", "pull", ref, "--out", str(out), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "taken on NVIDIA H200 (driver 580.159.04), here none (driver none)" in refused.stderr
    assert "nothing fetched" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists() and [p for p in tmp_path.iterdir() if ".pull-" in p.name] == []
    assert log.read_text(errors="replace").count(f"GET /v2/builder-test/snapshots/blobs/{layer}") == fetched_before
    # --any-gpu: fetched for another host, whole
    carried = builder("snapshot", "pull", ref, "--out", str(out), "--any-gpu", cwd=tmp_path)
    assert carried.returncode == 0, carried.stderr
    assert (out / "images" / "pages-1.img").read_bytes() == (snap / "images" / "pages-1.img").read_bytes()
    assert log.read_text(errors="replace").count(f"GET /v2/builder-test/snapshots/blobs/{layer}") > fetched_before


def test_a_process_route_snapshot_lands_only_at_the_path_it_was_taken_at(registry, tmp_path):
    snap = snapshot_dir(tmp_path / "snap", subject="venv /opt/venv 0123456789abcdef")
    record = json.loads((snap / "snapshot.json").read_text())
    record["directory"] = str(tmp_path / "taken-here")
    (snap / "snapshot.json").write_text(json.dumps(record))
    ref = f"{registry}/builder-test/snapshots:process"
    assert builder("snapshot", "push", str(snap), ref, cwd=tmp_path).returncode == 0
    elsewhere = builder("snapshot", "pull", ref, "--out", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert elsewhere.returncode == 2 and f"restores only at the path it was taken at, {tmp_path / 'taken-here'}" in \
        elsewhere.stderr, elsewhere.stderr
    assert not (tmp_path / "elsewhere").exists()
    there = builder("snapshot", "pull", ref, "--out", str(tmp_path / "taken-here"), cwd=tmp_path)
    assert there.returncode == 0 and (tmp_path / "taken-here" / "images" / "inventory.img").is_file(), there.stderr


def _push_raw(registry: str, tag: str, key: bytes, layer: bytes, media: str = ship.LAYER_MEDIA) -> str:
    repo = f"{registry}/builder-test/snapshots"
    with registry_api.Client(registry_api.endpoint(registry)) as c:
        kd, ld = c.upload(repo, key), c.upload(repo, layer)
        body = json.dumps({"schemaVersion": 2, "mediaType": ship.MANIFEST_MEDIA, "artifactType": ship.ARTIFACT,
                           "config": {"mediaType": ship.KEY_MEDIA, "digest": kd, "size": len(key)},
                           "layers": [{"mediaType": media, "digest": ld, "size": len(layer)}]}).encode()
        c.put_manifest(repo, tag, body, ship.MANIFEST_MEDIA)
    return f"{repo}:{tag}"


def _tar_zst(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


@pytest.mark.parametrize("case", ["symlink", "dotdot", "absolute", "stray-name", "not-zstd", "key-differs",
                                  "not-a-snapshot-manifest"])
def test_a_hostile_or_damaged_artifact_is_refused_and_leaves_nothing(registry, tmp_path, case):
    key = (snapshot_dir(tmp_path / "src") / "key.json").read_bytes()
    good = [_file("key.json", key), _file("snapshot.json", b'{"answer": "x", "served_model": "m"}'),
            _file("images/inventory.img", b"inv")]
    link = tarfile.TarInfo("images/pages-1.img")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    layer = {"symlink": _tar_zst([*good, (link, b"")]),
             "dotdot": _tar_zst([*good, _file("images/../../escaped", b"x")]),
             "absolute": _tar_zst([*good, _file("/tmp/escaped", b"x")]),
             "stray-name": _tar_zst([*good, _file("bin/sh", b"x")]),
             "not-zstd": b"not a zstd frame at all",
             "key-differs": _tar_zst([_file("key.json", key.replace(b"4.1.1", b"4.1.2")), *good[1:]]),
             "not-a-snapshot-manifest": _tar_zst(good)}[case]
    ref = _push_raw(registry, case, key, layer,
                    "application/vnd.oci.image.layer.v1.tar+gzip" if case == "not-a-snapshot-manifest" else ship.LAYER_MEDIA)
    out = tmp_path / "out"
    got = builder("snapshot", "pull", ref, "--out", str(out), cwd=tmp_path)
    assert got.returncode == 3, got.stderr
    assert {"symlink": "a link or device", "dotdot": "outside a snapshot", "absolute": "outside a snapshot",
            "stray-name": "outside a snapshot", "not-zstd": "does not unpack", "key-differs": "not its config's",
            "not-a-snapshot-manifest": "not a builder snapshot"}[case] in got.stderr, got.stderr
    assert "nothing was written" in got.stderr and "Traceback" not in got.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if ".pull-" in p.name] == []
    assert not Path("/tmp/escaped").exists()


def test_bad_input_is_refused_in_one_line_before_any_request(tmp_path):
    snap = snapshot_dir(tmp_path / "snap")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for argv, says in ((["push", str(snap), "127.0.0.1:9/x/y@sha256:" + "a" * 64], "name a tag"),
                       (["push", str(tmp_path / "nope"), "127.0.0.1:9/x/y:t"], "no snapshot directory"),
                       (["push", str(tmp_path / "full"), "127.0.0.1:9/x/y:t"], "missing"),
                       (["push", str(snap), "snapshots:t"], "name the registry"),
                       (["pull", "127.0.0.1:9/x/y:t", "--out", str(tmp_path / "full")], "not an empty directory"),
                       (["pull", "127.0.0.1:9/x/y:t", "--out", str(tmp_path / "no" / "such" / "dir")], "is no directory"),
                       (["pull", "127.0.0.1:9/x/y:t t", "--out", str(tmp_path / "o")], "white space")):
        got = builder("snapshot", *argv, cwd=tmp_path)
        assert got.returncode == 2 and says in got.stderr and "Traceback" not in got.stderr, (argv, got.stderr)
    # a registry that does not answer: exit 3, no tag, nothing written
    got = builder("snapshot", "pull", "127.0.0.1:9/x/y:t", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert got.returncode == 3 and "nothing was written" in got.stderr and not (tmp_path / "o").exists(), got.stderr
    got = builder("snapshot", "push", str(snap), "127.0.0.1:9/x/y:t", cwd=tmp_path)
    assert got.returncode == 3 and "no tag was written" in got.stderr and list(snap.glob(".push-*")) == [], got.stderr


class SlowProxy:
    """A TCP forwarder on 127.0.0.1 to `target` that passes bytes at `rate` a second each way: an upload or a
    download through it lasts long enough for a signal to land in it, whatever this machine's speed."""

    def __init__(self, target: str, rate: int):
        import socket
        import threading

        host, _, port = target.rpartition(":")
        self.target, self.rate = (host, int(port)), rate
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src, dst):
        import time

        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
                time.sleep(len(chunk) / self.rate)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self):
        self.server.close()


def test_a_pull_interrupted_while_it_fetches_leaves_nothing(registry, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once the layer is being fetched: exit 130, no
    --out, no temporary directory beside it."""
    import signal

    snap = snapshot_dir(tmp_path / "snap")
    (snap / "images" / "pages-2.img").write_bytes(os.urandom(64 << 20))  # incompressible
    ref = f"{registry}/builder-test/snapshots:big"
    assert builder("snapshot", "push", str(snap), ref, cwd=tmp_path).returncode == 0
    proxy = SlowProxy(registry, 16 << 20)  # 16 MB/s: the 64 MB layer's fetch takes about 4 s
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "snapshot", "pull",
                             f"{proxy.address}/builder-test/snapshots:big", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    line = proc.stderr.readline()
    assert "fetching" in line, line
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    proxy.close()
    assert proc.returncode == 130, line + err
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if ".pull-" in p.name] == []


def test_a_push_interrupted_while_it_uploads_tags_nothing_and_leaves_no_packed_file(registry, tmp_path):
    import signal

    snap = snapshot_dir(tmp_path / "snap")
    (snap / "images" / "pages-2.img").write_bytes(os.urandom(64 << 20))
    proxy = SlowProxy(registry, 16 << 20)  # 16 MB/s: the 64 MB layer's upload takes about 4 s
    ref = f"{proxy.address}/builder-test/snapshots:interrupted-push"
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "snapshot", "push", str(snap), ref], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    line = proc.stderr.readline()
    assert line.startswith("packed "), line  # the layer is packed; its upload begins
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, line + err
    assert list(snap.glob(".push-*")) == []
    proxy.close()
    with registry_api.Client(registry_api.endpoint(registry)) as c:
        assert c.manifest(f"{registry}/builder-test/snapshots", "interrupted-push", accept=ship.MANIFEST_MEDIA) is None
