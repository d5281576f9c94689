"""Bounded against hostile remotes (builder/net.py): every answer read from a registry, an index or a download
has a size cap and a timeout from one place, enforced while it streams. The remotes are stand-ins on 127.0.0.1
(tests/hostile.py, test doubles: no real service misbehaves on demand) answering 500, garbage, nothing (hang),
a redirect loop, 401 forever, and 2 GB bodies with and without a Content-Length. Every verb that reads a remote
must end with exit 3 and one message naming the remote, no traceback, within the timeout, and under the 2 GB
body its peak RSS (measured by the kernel for the child: wait4's ru_maxrss) must stay under 300 MB."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from builder import net, redact
from builder.errors import UserError

from tests import hostile
from tests.hardening import cases as hc
from tests.helpers import REPO

RSS_LIMIT_MB = 300
TIMEOUT_S = 2


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    hc.make_fixture(tmp)
    shutil.copy(REPO / "matrix.toml", tmp / "real.toml")  # lock reads vLLM's and SGLang's pages from the index
    shutil.copy(REPO / "matrix.lock", tmp / "real.lock")
    return tmp


def verbs(tmp: Path, host: str) -> dict[str, list[str]]:
    m = ["--matrix", str(tmp / "fx" / "matrix.toml")]
    return {
        "plan --remote (registry)": ["plan", *m, "--remote", "--cache-remote", f"registry:{host}/w"],
        "plan --remote (index)": ["plan", *m, "--remote", "--cache-remote", f"index:http://{host}/simple"],
        "wheels pull (registry)": ["wheels", "pull", *m, "--cache-remote", f"registry:{host}/w"],
        "wheels pull (index)": ["wheels", "pull", *m, "--cache-remote", f"index:http://{host}/simple"],
        "lock --index": ["lock", "--matrix", str(tmp / "real.toml"), "--index", f"http://{host}/simple"],
    }


# The CLI is started by a small fresh interpreter that reports its child's peak RSS. Measured straight from this
# process, ru_maxrss would include this process's own RSS at the fork (Linux carries the pre-exec high-water mark
# over exec), i.e. pytest's size after hundreds of tests, not the CLI's.
MEASURE = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "builder.cli", *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("\\n__peak_rss_kb__ %d\\n" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[int, str, float, int]:
    """(exit code, stderr, seconds, peak RSS in MB) of the real CLI in a child process."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", MEASURE, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, cwd=cwd, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "BUILDER_REMOTE_TIMEOUT": str(TIMEOUT_S),
                               **(env or {})})
    err, _, rss = proc.stderr.rstrip("\n").rpartition("\n__peak_rss_kb__ ")
    return proc.returncode, err, time.monotonic() - t0, int(rss) // 1024


MODES = ["500", "garbage", "hang", "redirect", "401", "huge", "huge-declared"]


@pytest.mark.parametrize("mode", MODES)
def test_every_remote_reading_verb_survives_a_hostile_remote(fx, mode):
    with hostile.serve(mode) as (host, sent):
        for name, argv in verbs(fx, host).items():
            env = {"BUILDER_REGISTRY_USER": "u", "BUILDER_REGISTRY_PASSWORD": "p"} if mode == "401" else {}
            code, err, took, rss = run(argv, fx, env)
            lines = [line for line in err.splitlines() if line.startswith("error: ")]
            assert code == 3, f"{name} against {mode}: exit {code}\n{err[-2000:]}"
            assert "Traceback" not in err, f"{name} against {mode}:\n{err[-3000:]}"
            assert len(lines) == 1 and host in lines[0], f"{name} against {mode} does not name {host}:\n{err}"
            assert took < TIMEOUT_S * 4 + 5, f"{name} against {mode} took {took:.1f}s"
            assert rss < RSS_LIMIT_MB, f"{name} against {mode}: peak RSS {rss} MB"
            if mode.startswith("huge"):
                assert "cap" in lines[0], lines[0]
                assert sent and sent[-1] < 256 << 20, f"{name} read {sent[-1]} bytes of the 2 GB"


@pytest.mark.pure
def test_doctor_calls_a_garbage_server_no_registry():
    from builder import doctor

    with hostile.serve("garbage") as (host, _):
        check = doctor.check_registry(host)
    assert not check.ok and "not an OCI registry" in check.detail
    with hostile.serve("huge") as (host, _):  # answers /v2/ like a registry
        assert doctor.check_registry(host).ok


@pytest.mark.pure
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "1e999", ""])
def test_remote_timeout_must_be_a_finite_positive_number(monkeypatch, value):
    monkeypatch.setenv("BUILDER_REMOTE_TIMEOUT", value)
    with pytest.raises(UserError, match="BUILDER_REMOTE_TIMEOUT"):
        net.timeouts()


@pytest.mark.pure
def test_lock_honours_the_remote_timeout(monkeypatch):
    from builder.pypi import SimpleIndex

    monkeypatch.setenv("BUILDER_REMOTE_TIMEOUT", "7")
    assert SimpleIndex("http://127.0.0.1:1/simple").timeout == 7


@pytest.mark.pure
def test_redaction_of_credentials_in_urls():
    assert redact.redact("GET http://user:s3cret@127.0.0.1:8080/simple failed") == "GET http://***@127.0.0.1:8080/simple failed"
    assert redact.redact("--registry 'bob:s3cret@ghcr.io/acme'") == "--registry '***@ghcr.io/acme'"
    assert redact.redact("debian:12@sha256:" + "a" * 64) == "debian:12@sha256:" + "a" * 64
    assert redact.redact("docker.io/x@sha256:aa and a@b.c") == "docker.io/x@sha256:aa and a@b.c"
    # a URL's query values (tokens, signatures), a registry reference's too; the names stay
    assert redact.redact("redis://h:6379/0?password=s3cret&db=1") == "redis://h:6379/0?password=***&db=***"
    assert redact.redact("'127.0.0.1:9/cache?token=s3cret' is not") == "'127.0.0.1:9/cache?token=***' is not"
    assert redact.redact("it takes no ?query or #fragment; is this a registry?") == "it takes no ?query or #fragment; is this a registry?"
    # a URL joined into a path (one slash), a password holding an @
    assert redact.redact("/here/https:/bob:s3cret@h/ca.pem") == "/here/https:/***@h/ca.pem"
    assert redact.redact("https://bob:p@ss@h/x") == "https://***@h/x"


@pytest.mark.pure
def test_a_value_is_redacted_before_it_is_cut(monkeypatch):
    """Issue 28: reprlib's cut left `'bob:s3cr3t-m...'` (no @ any more: the redaction missed it)."""
    from builder import redact as redact_mod

    secret = "s3cr3t-marker-pw"
    for value in (f"bob:{secret}@127.0.0.1:5000/builder-test", f"https://bob:{secret * 4}@mirror.example/simple/x/y",
                  f"redis://127.0.0.1:6379/0?password={secret}", [f"https://bob:{secret}@m/x"] * 3,
                  {f"bob:{secret}@m/x": f"https://:{secret}@h"}):
        for width in (20, 30, 80):
            shown = redact_mod.describe(value, width)
            assert not any(secret[i:i + 4] in shown for i in range(len(secret) - 3)), (value, width, shown)
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "plain-" + secret)
    assert redact.redact(f"a message with plain-{secret} in it") == "a message with *** in it"


def test_a_push_the_registry_did_not_keep_is_not_reported_as_pushed(tmp_path):
    """Issue: `wheels push` to a server answering 200 to anything said "1 pushed" and recorded an empty digest.
    Now the artifact is read back after the push; a server that keeps nothing is exit 3 and nothing is recorded."""
    from builder.cache.local import MANIFEST, Wheelhouse

    from tests.helpers import a_wheel
    from builder.cache import file_records

    wh = Wheelhouse(tmp_path / "wh")
    whl = a_wheel(tmp_path / "out")
    key = "e" * 64
    wh.store("demo", key, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]}, "compiled": False})
    before = (wh.entry_dir("demo", key) / MANIFEST).read_bytes()
    for mode in ("liar", "garbage"):
        with hostile.serve(mode) as (host, _):
            code, err, took, _ = run(["wheels", "push", "--matrix", str(REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml"),
                                      "--wheelhouse", str(wh.root), "--cache-remote", f"registry:{host}/w",
                                      "--key", f"demo:{key}"], tmp_path)
        assert code == 3 and "Traceback" not in err, err
        assert host in err and ("reading it back" if mode == "liar" else "is this an OCI registry") in err, err
        assert (wh.entry_dir("demo", key) / MANIFEST).read_bytes() == before  # no digest recorded


@pytest.mark.parametrize("mode", ["500", "garbage", "hang"])
def test_publish_checks_the_registry_before_any_work(fx, tmp_path, mode):
    """Issue: publish with the registry down or answering 500 built and smoked first, then exited 1. Now it is
    exit 3 before anything is built: no work, log or wheelhouse directory appears."""
    with hostile.serve(mode) as (host, _):
        code, err, took, _ = run(["publish", "--matrix", str(fx / "fx" / "matrix.toml"), "--registry", f"{host}/x", "--retries", "0",
                                  "--work-dir", str(tmp_path / "w"), "--log-dir", str(tmp_path / "l"),
                                  "--wheelhouse", str(tmp_path / "wh"), "--images-json", str(tmp_path / "images.json")],
                                 tmp_path)
    assert code == 3 and "Traceback" not in err and host in err and "nothing was built" in err, err
    assert mode in ("garbage",) or "does not answer" in err
    assert not any((tmp_path / d).exists() for d in ("w", "l", "wh", "images.json"))


def test_no_secret_reaches_a_message_or_a_file(fx, tmp_path):
    """Secrets stay secret: passwords carrying a unique marker (the environment's registry and index
    credentials, a user:password@ written into URLs) against a registry and an index that refuse them, with
    --debug (every command line logged): the marker is in no output and no file builder wrote."""
    import uuid

    marker = f"builder-secret-{uuid.uuid4().hex}"
    env = {"BUILDER_REGISTRY_USER": "ci", "BUILDER_REGISTRY_PASSWORD": marker,
           "BUILDER_INDEX_USER": "ci", "BUILDER_INDEX_PASSWORD": marker}
    m = ["--matrix", str(fx / "fx" / "matrix.toml")]
    seen = []
    with hostile.serve("401") as (host, _):
        for argv in (["--debug", "plan", *m, "--remote", "--cache-remote", f"registry:{host}/w"],
                     ["--debug", "wheels", "pull", *m, "--cache-remote", f"index:http://{host}/simple"],
                     ["--debug", "publish", *m, "--registry", f"{host}/x", "--retries", "0", "--work-dir", str(tmp_path / "w"),
                      "--log-dir", str(tmp_path / "l"), "--images-json", str(tmp_path / "i.json")],
                     ["lock", "--matrix", str(fx / "real.toml"), "--index", f"http://ci:{marker}@{host}/simple"],
                     ["wheels", "pull", *m, "--cache-remote", f"index:http://ci:{marker}@{host}/simple"],
                     ["publish", *m, "--registry", f"ci:{marker}@{host}/x"],
                     ["doctor", "--registry", f"ci:{marker}@{host}"]):
            proc = subprocess.run([sys.executable, "-m", "builder.cli", *argv], capture_output=True, text=True,
                                  cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=120)
            out = proc.stdout + proc.stderr
            seen.append((argv[1] if argv[0] == "--debug" else argv[0], proc.returncode))
            assert marker not in out, f"{argv}: the secret is in the output:\n{out[-2000:]}"
            assert argv[0] == "--debug" or "Traceback" not in out, out[-3000:]  # --debug keeps tracebacks
    written = [p for p in tmp_path.rglob("*") if p.is_file() and marker.encode() in p.read_bytes()]
    assert not written, written
    assert all(code in (2, 3) for _, code in seen), seen


# -- one deadline per request, body included ---------------------------------------------------------------
DRIP_MARGIN_S = 4.0  # the interpreter's start and imports, and the other requests a verb makes before the drip


def _pushable_entry(tmp: Path) -> tuple[Path, str]:
    """A wheelhouse holding one entry (demo, key eee…) that `wheels push` would send."""
    from builder.cache import file_records
    from builder.cache.local import Wheelhouse

    from tests.helpers import a_wheel

    wh = Wheelhouse(tmp / "wh")
    key = "e" * 64
    if not wh.entry_dir("demo", key).exists():
        whl = a_wheel(tmp / "out")
        wh.store("demo", key, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]}, "compiled": False})
    return wh.root, key


def drip_verbs(tmp: Path, host: str, mode: str) -> dict[str, list[str]]:
    wh, key = _pushable_entry(tmp)
    push = ["wheels", "push", "--matrix", str(tmp / "fx" / "matrix.toml"), "--wheelhouse", str(wh), "--key", f"demo:{key}"]
    out = {**verbs(tmp, host),
           "wheels push (registry)": [*push, "--cache-remote", f"registry:{host}/w"],
           "wheels push (index)": [*push, "--cache-remote", f"index:http://{host}/simple"]}
    if mode == "drip-uploads":  # nothing to read: only an upload meets the drip
        return {k: v for k, v in out.items() if k.startswith("wheels push")}
    if mode != "drip":  # doctor reads GET /v2/ only, which `drip` answers at once
        out["doctor --registry"] = ["doctor", "--registry", host]
    return out


# drip-v2 and drip-headers meet the same one deadline per request as drip at another point of the answer: slow
@pytest.mark.parametrize("mode", ["drip", pytest.param("drip-v2", marks=pytest.mark.slow),
                                  pytest.param("drip-headers", marks=pytest.mark.slow), "drip-uploads"])
def test_a_dripping_remote_is_cut_at_one_deadline_per_request(fx, mode):
    """Issue 28: a remote that sends its headers (or its status line) and then one byte a second kept `plan
    --remote`, `wheels pull` and `wheels push` running past BUILDER_REMOTE_TIMEOUT (the deadline was checked per
    1 MiB chunk, which never filled). Every request now has one deadline, connect to last byte: each verb ends
    with exit 3 naming the remote within the timeout plus a small margin."""
    took_by_verb = {}
    with hostile.serve(mode) as (host, _):
        for name, argv in drip_verbs(fx, host, mode).items():
            t0 = time.monotonic()
            try:
                proc = subprocess.run([sys.executable, "-m", "builder.cli", *argv], capture_output=True, text=True,
                                      cwd=fx, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                                               "BUILDER_REMOTE_TIMEOUT": str(TIMEOUT_S)})
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} against {mode}: still running after 60 s (BUILDER_REMOTE_TIMEOUT={TIMEOUT_S})")
            took = took_by_verb[name] = time.monotonic() - t0
            out = proc.stdout + proc.stderr
            assert proc.returncode == 3, f"{name} against {mode}: exit {proc.returncode}\n{out[-2000:]}"
            assert "Traceback" not in out, f"{name} against {mode}:\n{out[-3000:]}"
            said = [line for line in out.splitlines() if line.startswith(("error: ", "FAIL"))]
            assert said and host in said[0], f"{name} against {mode} does not name {host}:\n{out}"
            assert took < TIMEOUT_S + DRIP_MARGIN_S, f"{name} against {mode} took {took:.1f} s:\n{out[-2000:]}"
    print(f"{mode}: " + ", ".join(f"{n} {t:.1f} s" for n, t in took_by_verb.items()))


def test_no_credential_in_any_accepted_place_reaches_a_debug_line_a_message_or_a_file(tmp_path):
    """Issue 28: a password in defaults.mirrors or defaults.registry was printed in the refusal (the value was cut
    to `bob:s3cr3t-m...` before the redaction, which then no longer saw a user:password@), a compile-cache URL's
    ?query was echoed, defaults.index showed part of the password. Now every value is redacted before it is cut
    (redact.describe), and a URL's query values and the secret variables' values are redacted wherever they
    appear. Every place a URL or a registry is accepted (matrix defaults: index, mirrors, registry, cache remotes,
    the compile cache and its scheduler; the flags; the environment), each run with --debug (every command line
    and the traceback printed): the marker is in no output and in no file builder wrote."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.hardening import remotes as r3

    cases = [c for c in r3.CASES if c.cls == "secret"]
    assert len(cases) >= 50

    def one(case):
        tmp = Path(tempfile.mkdtemp(prefix="builder-secret-", dir=tmp_path))
        hc.make_fixture(tmp, case)
        proc = subprocess.run([sys.executable, "-m", "builder.cli", "--debug", *hc.argv(case, tmp)], capture_output=True,
                              text=True, cwd=tmp, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO), "DOCKER_HOST": "unix:///nonexistent/x.sock",
                                   **case.env})
        out = proc.stdout + proc.stderr
        written = [str(p) for p in tmp.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size < 64 << 20
                   and hc.SECRET.encode() in p.read_bytes() and "fx/" not in str(p.relative_to(tmp))
                   and not str(p.relative_to(tmp)).startswith(("dc/", "bin/"))]
        return case.id, proc.returncode, hc.SECRET in out, written, out

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, cases))
    leaks = [(cid, out[-1500:]) for cid, _, echoed, _, out in results if echoed]
    files = [(cid, w) for cid, _, _, w, _ in results if w]
    assert not leaks, leaks[:3]
    assert not files, files
    assert all(code in (2, 3) for _, code, _, _, _ in results), [(cid, code) for cid, code, *_ in results if code not in (2, 3)]


@pytest.mark.pure
@pytest.mark.parametrize("mode", ["drip-v2", "drip-headers"])
def test_one_deadline_cuts_a_drip_whichever_client_reads_it(monkeypatch, mode):
    """The primitive itself (net.Deadline), in-process: a requests session of `with_timeouts` (what oras, the
    cache stores and twine use), streamed or read whole, and urllib through `net.urlopen` (lock, doctor) each
    stop a drip at the deadline — though every socket read returns within its own timeout."""
    import requests

    monkeypatch.setenv("BUILDER_REMOTE_TIMEOUT", "1")
    with hostile.serve(mode) as (host, _):
        url = f"http://{host}/v2/x/manifests/latest"
        reads = {
            "requests, whole": lambda: net.with_timeouts(requests.Session()).get(url),
            "requests, streamed": lambda: net.read_document(net.with_timeouts(requests.Session()).get(url, stream=True), url),
            "urllib": lambda: net.read_urllib(net.urlopen(url), url),
        }
        for name, read in reads.items():
            t0 = time.monotonic()
            with pytest.raises(net.TooSlow, match="did not answer within 1 s") as caught:
                read()
            took = time.monotonic() - t0
            assert host in str(caught.value), caught.value
            assert 0.9 < took < 1.6, f"{name} against {mode}: {took:.2f} s"


# -- hostile registry documents (issue 34): every shape refused in one line naming the field and its cause ------
def _registry_documents(manifest, config=None, media: str = "application/vnd.oci.image.manifest.v1+json",
                        said: str | None = None, inner=None) -> dict:
    """The documents of a registry stand-in (hostile.shaped): tag `t` → `manifest` (an object dumped, or bytes),
    the config blob by its digest, an index's inner manifest by its digest."""
    import hashlib
    import json as json_mod

    def raw(doc) -> bytes:
        return doc if isinstance(doc, bytes) else json_mod.dumps(doc).encode()

    docs = {"t": (raw(manifest), media, said)}
    for doc, kind in ((config, "application/octet-stream"), (inner, "application/vnd.oci.image.manifest.v1+json")):
        if doc is not None:
            docs["sha256:" + hashlib.sha256(raw(doc)).hexdigest()] = (raw(doc), kind, None)
    return docs


def _digest_of(doc) -> str:
    import hashlib
    import json as json_mod

    return "sha256:" + hashlib.sha256(doc if isinstance(doc, bytes) else json_mod.dumps(doc).encode()).hexdigest()


GOOD_CONFIG = {"architecture": "amd64", "os": "linux", "config": {"Labels": {"io.builder.engine": "vllm"}}}
CONFIG_DESC = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest_of(GOOD_CONFIG), "size": 1}
INDEX = "application/vnd.oci.image.index.v1+json"
BIG_CONFIG = b'{"x": "' + b"a" * (5 << 20) + b'"}'


def _manifest(**over) -> dict:
    return {"schemaVersion": 2, "config": CONFIG_DESC, "layers": [], **over}


# name → (documents, the words of the refusal, its cause)
SHAPES = {
    "config-is-a-list": (_registry_documents(_manifest(config=[CONFIG_DESC]), GOOD_CONFIG),
                         "manifest: config is a list, not an object", "shape"),
    "config-is-a-string": (_registry_documents(_manifest(config="sha256:abc"), GOOD_CONFIG),
                           "manifest: config is a string, not an object", "shape"),
    "config-digest-is-a-number": (_registry_documents(_manifest(config={"digest": 5}), GOOD_CONFIG),
                                  "config: digest is a number, not a string", "shape"),
    "config-digest-not-sha256": (_registry_documents(_manifest(config={"digest": "md5:00"}), GOOD_CONFIG),
                                 "config: digest is not sha256", "shape"),
    "no-config": (_registry_documents({"schemaVersion": 2, "layers": []}), "no config descriptor", "shape"),
    "layers-is-a-number": (_registry_documents(_manifest(layers=7), GOOD_CONFIG),
                           "manifest: layers is a number, not a list", "shape"),
    "layers-is-a-string": (_registry_documents(_manifest(layers="x"), GOOD_CONFIG),
                           "manifest: layers is a string, not a list", "shape"),
    "layer-is-a-number": (_registry_documents(_manifest(layers=[1]), GOOD_CONFIG),
                          "manifest: layers[0] is a number, not an object", "shape"),
    "manifest-is-a-list": (_registry_documents([1, 2]), "its manifest is a list, not a JSON object", "shape"),
    "manifest-is-not-json": (_registry_documents(b"{not json"), "its manifest is not JSON", "not-json"),
    "manifest-nested-deeply": (_registry_documents(b"[" * 100000 + b"]" * 100000), "its manifest is not JSON", "not-json"),
    "index-manifests-is-a-number": (_registry_documents({"schemaVersion": 2, "manifests": 3}, media=INDEX),
                                    "index: manifests is a number, not a list", "shape"),
    "index-manifests-is-an-object": (_registry_documents({"schemaVersion": 2, "manifests": {}}, media=INDEX),
                                     "index: manifests is an object, not a list", "shape"),
    "index-entry-is-a-string": (_registry_documents({"schemaVersion": 2, "manifests": ["x"]}, media=INDEX),
                                "index: manifests[0] is a string, not an object", "shape"),
    "index-platform-is-a-string": (_registry_documents({"schemaVersion": 2, "manifests": [
        {"digest": _digest_of(_manifest()), "platform": "linux/amd64"}]}, media=INDEX, inner=_manifest()),
        "manifests[0]: platform is a string, not an object", "shape"),
    "index-annotations-is-a-list": (_registry_documents({"schemaVersion": 2, "manifests": [
        {"digest": _digest_of(_manifest()), "annotations": []}]}, media=INDEX, inner=_manifest()),
        "manifests[0]: annotations is a list, not an object", "shape"),
    "index-inner-config-is-a-list": (_registry_documents({"schemaVersion": 2, "manifests": [
        {"digest": _digest_of(_manifest(config=[]))}]}, media=INDEX, inner=_manifest(config=[])),
        "manifest: config is a list, not an object", "shape"),
    "image-config-is-not-json": (_registry_documents(_manifest(config={"digest": _digest_of(b"{nope")}),
                                                     b"{nope"), "its image config is not JSON", "not-json"),
    "image-config-is-a-list": (_registry_documents(_manifest(config={"digest": _digest_of([1])}), [1]),
                               "its image config is a list, not a JSON object", "shape"),
    "image-config-config-is-a-list": (_registry_documents(_manifest(config={"digest": _digest_of({"config": []})}),
                                                          {"config": []}),
                                      "image config: config is a list, not an object", "shape"),
    "image-config-labels-is-a-string": (_registry_documents(
        _manifest(config={"digest": _digest_of({"config": {"Labels": "x"}})}), {"config": {"Labels": "x"}}),
        "image config: config: Labels is a string, not an object", "shape"),
    "digest-mismatch": (_registry_documents(_manifest(), GOOD_CONFIG, said="sha256:" + "0" * 64),
                        "the registry names it sha256:000", "digest"),
    "oversized-config": (_registry_documents(_manifest(config={"digest": _digest_of(BIG_CONFIG)}), BIG_CONFIG),
                         "is larger than 4194304 bytes", "too-large"),
    "oversized-manifest": (_registry_documents(b'{"x": "' + b"a" * (5 << 20) + b'"}'),
                           "is larger than 4194304 bytes", "too-large"),
}


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_odd_registry_document_is_unusable_naming_its_field_never_another_exception(name):
    """Issue 34: a manifest whose config is a list or a string, or whose layers / manifests is a number, raised
    TypeError / AttributeError out of the registry client (tracebacks in serve and doctor --host, a failed cell
    under --reuse-from). Now each is registry_api.Unusable in one line naming the field: what a reuse catches
    (steps/image.py _from_registry: the cell is built) and the deployer's read reports with its cause."""
    from builder import registry_api

    documents, words, cause = SHAPES[name]
    with hostile.shaped(documents) as host:
        with registry_api.Client(registry_api.Endpoint(host, tls_verify=False)) as client:
            with pytest.raises(registry_api.Unusable) as caught:
                client.image(f"{host}/team/vllm", "t", platform="linux/amd64")
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert caught.value.cause == cause, (caught.value.cause, str(caught.value))


@pytest.mark.pure
def test_the_stand_in_serves_a_good_image_which_reads():
    """The shapes above differ from a good image only where named: the good one reads."""
    from builder import registry_api

    with hostile.shaped(_registry_documents(_manifest(), GOOD_CONFIG)) as host:
        with registry_api.Client(registry_api.Endpoint(host, tls_verify=False)) as client:
            found = client.image(f"{host}/team/vllm", "t")
    assert found.labels == {"io.builder.engine": "vllm"}


# the causes of the probe, each a distinct line in the deployer's read (deploy/subject.read_registry)
DEPLOYER_CAUSES = {  # name → (hostile.serve mode or SHAPES name, the cause's words)
    "credentials-refused": ("401", "access refused (credentials)"),
    "http-500": ("500", "the registry failed (HTTP 5xx)"),
    "timeout": ("hang", "did not answer in time"),
    "redirect-loop": ("redirect", "redirects in a loop"),
    "garbage": ("garbage", "not JSON"),
    "huge-manifest": ("huge", "too large"),
    "digest-mismatch": ("digest-mismatch", "do not match their digest"),
    "oversized-config": ("oversized-config", "too large"),
    "config-is-a-list": ("config-is-a-list", "wrong shape"),
    "layers-is-a-number": ("layers-is-a-number", "wrong shape"),
    "image-config-not-json": ("image-config-is-not-json", "not JSON"),
    "oversized-manifest": ("oversized-manifest", "too large"),
    "nobody-listens": ("nobody", "cannot be reached"),
}


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(DEPLOYER_CAUSES))
def test_the_deployers_read_names_each_cause_apart(name, monkeypatch, tmp_path):
    """Causes that all said "not readable from its registry": each is now its own one line, exit 3 (a registry
    nobody listens on too)."""
    from builder.deploy import subject
    from builder.errors import EnvironmentProblem

    monkeypatch.setenv("BUILDER_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    source, words = DEPLOYER_CAUSES[name]
    import contextlib

    from tests.helpers import free_port

    server = hostile.shaped(SHAPES[source][0]) if source in SHAPES else \
        contextlib.nullcontext(f"127.0.0.1:{free_port()}") if source == "nobody" else hostile.serve(source)
    with server as served:
        host = served if isinstance(served, str) else served[0]
        with pytest.raises(EnvironmentProblem) as caught:
            subject.read_registry(f"{host}/team/vllm:t")
    line = str(caught.value)
    assert words in line and host in line and "\n" not in line, line


@pytest.mark.parametrize("name", ["config-is-a-list", "layers-is-a-number", "index-manifests-is-a-number"])
def test_serve_and_doctor_host_refuse_an_odd_manifest_in_one_line(name, tmp_path):
    (tmp_path / "model").mkdir()
    gpus = tmp_path / "gpus.json"
    gpus.write_text('[{"index": 0, "name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0", "brand": "NVIDIA"}]')
    with hostile.shaped(SHAPES[name][0]) as host:
        image = f"{host}/team/vllm:t"
        for argv in (["serve", image, "--strategy", "MTP2", "--model", str(tmp_path / "model")],
                     ["doctor", "--host", image, "--gpus-file", str(gpus)]):
            proc = subprocess.run([sys.executable, "-m", "builder.cli", *argv], capture_output=True, text=True,
                                  cwd=tmp_path, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                                                 "DOCKER_CONFIG": str(tmp_path)})
            out = proc.stdout + proc.stderr
            assert "Traceback" not in out, out[-3000:]
            said = [line for line in out.splitlines() if SHAPES[name][1] in line]
            assert proc.returncode == 3 and said and host in said[0], (argv[0], proc.returncode, out[-2000:])
