"""An unchanged cell from the registry (builder/image/reuse.py), against a real registry on 127.0.0.1 and the real
engine: the fixture cell is built and published once; then a fresh runner — the cell's tag and image gone from
the daemon, the wheelhouse and its image ledger empty, only the committed runtime pins kept — builds nothing: the
wheel comes from the registry's wheel cache, the image is pulled by the registry's digest because builder's
ledger record in the image's repository names it. A derived image that inherits the label, an image given a
copy of the label, a tampered or corrupt record: a build, said in one line. `publish` of the unchanged cell
pushes nothing and pulls nothing: only the aliases move."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from builder.image import labels, ledger, reuse
from builder.registry_api import Endpoint, RegistryPath

from tests.helpers import CUDA_EXT_CELL as CELL
from tests.helpers import commit_image
from tests.registry_runs import TAG, Run, builder, digest_in, forget_locally, local_id, push_under_tag

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
def _published(tmp: Path, registry: str):
    """The fixture cell compiled, built, smoked and published to a repository of its own, its wheel in the registry's
    wheel cache."""
    suffix = uuid.uuid4().hex[:8]
    run = Run(tmp, f"127.0.0.1:5000/builder-test-rr{suffix}", f"{registry}/rr{suffix}")
    try:
        res, steps, _ = run.run("publish")
        yield run, res, steps
    finally:
        forget_locally(run.ref)


@pytest.fixture(scope="module")
def published(registry, local_bases, docker_engine, tmp_path_factory):
    """One publish for the tests that read it (each leaves the repository as it found it: a test that forges the
    ledger record puts the genuine one back); a test that replaces what the registry serves takes its own."""
    yield from _published(tmp_path_factory.mktemp("published"), registry)


@pytest.fixture
def published_alone(registry, local_bases, docker_engine, tmp_path):
    yield from _published(tmp_path, registry)


# slow: a second runner's pull and publish; the default tier pulls the published image in
# test_a_teammates_plain_build_takes_the_cell_ci_published_to_the_matrix_registry
@pytest.mark.slow
def test_a_fresh_runner_pulls_the_published_image_and_publish_only_moves_aliases(published):
    run, res, steps = published
    digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
    assert digest_in(*run.repo.split("/", 1), TAG) == digest
    key = steps[f"image:{CELL}"]["artifacts"]["content_key"]
    assert labels.content_key(json.loads(subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", run.ref], capture_output=True,
        text=True, check=True).stdout)) == key
    # the ledger record went to the image's repository, and names the pushed digest and tag
    with reuse.Client(RegistryPath(run.registry, Endpoint(run.registry.split("/")[0], tls_verify=False))) as client:
        entry, problem = client.record(run.repo, key)
    assert not problem and entry is not None and digest in entry.images
    assert entry.published == {f"{run.repo}:{TAG}": digest}

    # a fresh runner: the daemon no longer holds the image by any name this test gave it
    forget_locally(run.ref)
    res, steps, where = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    image = steps[f"image:{CELL}"]["artifacts"]
    assert image["reused"] is True and image["pulled"] is True and image["digest"] == digest, image
    assert local_id(run.ref) == digest  # the registry's digest, under the cell's tag
    compile_ = steps["compile:cuda-ext"]["artifacts"]
    assert compile_["reused"] is True  # the wheel from the registry's wheel cache: nothing compiled
    assert not (where / "work" / CELL / "image.oci.tar").exists()  # no build, no OCI export
    said = [l for l in res.stderr.splitlines() if "from the registry" in l]
    assert len(said) == 1 and f"reuse {run.repo}:{TAG} ({digest}) from the registry" in said[0], res.stderr
    assert "no build" in said[0] and f"(the registry's unsigned record {run.repo}:builder-ledger-" in said[0]
    # the matrix names no ledger_public_key: the registry's word, said once, with how to sign
    trust = [l for l in res.stderr.splitlines() if "registry reuse takes the registry's word" in l]
    assert len(trust) == 1 and "BUILDER_LEDGER_SIGNING_KEY" in trust[0] and "ledger_public_key" in trust[0], trust
    # and what the registry merely says is not written into this runner's ledger as what builder built
    assert not (where / "wheelhouse" / ".images" / f"{key}.json").exists()
    print(f"\nregistry reuse of the fixture cell (build, pull included): {res.seconds:.1f}s wall, "
          f"image step {steps[f'image:{CELL}']['seconds']:.1f}s")

    # publish of the unchanged cell on a fresh runner: nothing pushed, nothing pulled, the aliases move
    forget_locally(run.ref)
    moved = subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                            f"docker://{run.repo}:{reuse.record_tag(key)}", f"docker://{run.repo}:1.0.0"],
                           capture_output=True, text=True)  # the alias elsewhere: publish must move it back
    assert moved.returncode == 0 and digest_in(*run.repo.split("/", 1), "1.0.0") != digest, moved.stderr
    res, steps, where = run.run("publish")
    assert steps[f"image:{CELL}"]["artifacts"].get("pulled") is False, res.stderr[-3000:]
    assert steps[f"publish:{CELL}"]["artifacts"]["pushed"] is False
    assert steps[f"publish:{CELL}"]["artifacts"]["digest"] == digest
    assert "no push" in res.stderr and f"already serves {digest}" in res.stderr
    assert not local_id(run.ref)  # not pulled
    assert digest_in(*run.repo.split("/", 1), "1.0.0") == digest
    assert digest_in(*run.repo.split("/", 1), "latest-cu130") == digest
    images = json.loads((where / "images.json").read_text())
    assert images["images"][CELL]["digest"] == digest and images["images"][CELL]["aliases"] == ["1.0.0", "latest-cu130"]


@pytest.mark.slow  # three builds (~65 s); the default tier keeps the fresh-runner reuse, the forged record (a digest the record does not name) and the local derived-image / moved-tag case (test_build.py)
def test_a_derived_image_a_copied_label_and_a_moved_tag_are_built(published_alone, local_bases):
    """The registry's tag replaced by an image that carries the key but not a digest builder recorded: built,
    said in one line; and a tag moved to an image of other inputs: built."""
    run, _, steps = published_alone
    digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
    first_key = steps[f"image:{CELL}"]["artifacts"]["content_key"]
    host, repo = run.repo.split("/", 1)
    dest = f"{run.repo}:{TAG}"
    # an image built FROM the published one plus one layer (it inherits the label of the cell's first build),
    # pushed over the cell's tag: the pins file was read from the published image, not from this one
    derived = commit_image(run.ref, f"{run.ref}-derived")
    assert derived != digest
    push_under_tag(f"{run.ref}-derived", dest)
    forget_locally(f"{run.ref}-derived")
    served = digest_in(host, repo, TAG)
    assert served not in (None, digest)
    res, steps2, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    assert steps2[f"image:{CELL}"]["artifacts"]["reused"] is False
    assert (f"registry: {dest} carries the content key of this cell's first build, but {CELL}.txt was not read "
            f"from it ({served})") in res.stderr

    # publish --no-cache builds and pushes the image of today's key (the pins file is in it now)
    res, steps3, _ = run.run("publish", "--no-cache")
    key, digest2 = steps3[f"image:{CELL}"]["artifacts"]["content_key"], steps3[f"publish:{CELL}"]["artifacts"]["digest"]
    assert key != first_key and digest_in(host, repo, TAG) == digest2
    record = f"{run.repo}:builder-ledger-{key}"

    # derived from that one: the label is this build's key, only the ledger record tells it apart
    derived = commit_image(run.ref, f"{run.ref}-derived")
    push_under_tag(f"{run.ref}-derived", dest)
    forget_locally(f"{run.ref}-derived")
    served = digest_in(host, repo, TAG)
    res, steps4, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    image = steps4[f"image:{CELL}"]["artifacts"]
    assert image["reused"] is False and image["digest"] not in (served, derived), image
    assert (f"registry: {dest} carries content key {key} but its digest {served} is not the one builder "
            f"recorded for it ({digest2}) (the registry's unsigned record {record}): building") in res.stderr

    # the CUDA base given a copy of the label, pushed over the cell's tag
    copied_ref = f"{run.ref}-copied"
    commit_image(local_bases["cuda_base"], copied_ref, f"LABEL {labels.CONTENT_KEY}={key}", add_file=False)
    push_under_tag(copied_ref, dest)
    forget_locally(copied_ref)
    served = digest_in(host, repo, TAG)
    res, steps5, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    assert steps5[f"image:{CELL}"]["artifacts"]["reused"] is False
    assert (f"registry: {dest} carries content key {key} but its digest {served} is not the one builder "
            f"recorded for it ({digest2})") in res.stderr

    # the tag moved to an image of other inputs
    other = "f" * 64
    commit_image(local_bases["cuda_base"], copied_ref, f"LABEL {labels.CONTENT_KEY}={other}", add_file=False)
    push_under_tag(copied_ref, dest)
    forget_locally(copied_ref)
    res, steps6, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    assert steps6[f"image:{CELL}"]["artifacts"]["reused"] is False
    assert f"registry: {dest} was built from other inputs (content key {other[:16]}…" in res.stderr
    # and back to builder's image: reused again
    moved = subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false", "--dest-tls-verify=false",
                            f"docker://{run.repo}@{digest2}", f"docker://{dest}"], capture_output=True, text=True)
    assert moved.returncode == 0, moved.stderr
    res, steps7, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    assert steps7[f"image:{CELL}"]["artifacts"]["pulled"] is True
    assert steps7[f"image:{CELL}"]["artifacts"]["digest"] == digest2


def _forge_records(client, run, key: str, digest: str) -> None:
    """Tampered, corrupt and foreign records under the cell's record tag: none vouches, each says why."""
    # tampered: the record lists another digest only
    forged = ledger.Entry(key, {"sha256:" + "e" * 64: {"cell": CELL, "recorded": "2026-01-01T00:00:00Z"}})
    client.push_record(run.repo, forged)
    back, problem = client.record(run.repo, key)
    ok, why = ledger.vouches(back, digest)
    assert not problem and not ok and f"its digest {digest} is not the one builder recorded" in why

    def raw_record(body: bytes, artifact: str = reuse.RECORD_TYPE) -> None:
        layer = client.upload(run.repo, body)
        client.upload(run.repo, reuse.EMPTY)
        manifest = {"schemaVersion": 2, "mediaType": reuse.OCI_MANIFEST, "artifactType": artifact,
                    "config": {"mediaType": reuse.EMPTY_TYPE, "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(),
                               "size": 2},
                    "layers": [{"mediaType": reuse.RECORD_TYPE, "digest": layer, "size": len(body)}]}
        resp = client.send("PUT", client.url(run.repo, "manifests", reuse.record_tag(key)), run.repo, push=True,
                            data=json.dumps(manifest).encode(), headers={"Content-Type": reuse.OCI_MANIFEST})
        assert resp.status_code == 201, resp.status_code

    cases = {
        b"not json {": "not JSON",
        json.dumps({"format": 1, "content_key": "a" * 64, "images": {digest: {"cell": CELL, "recorded":
                    "2026-01-01T00:00:00Z"}}}).encode(): f"not the {key} its name says",
        json.dumps({"format": 1, "content_key": key, "images": {digest: "yes"}}).encode(): "images",
        json.dumps({"format": 2, "content_key": key, "images": {}}).encode(): "format 2",
        b"[" * 100000 + b"]" * 100000: "nested too deeply",
    }
    for body, words in cases.items():
        raw_record(body)
        entry, problem = client.record(run.repo, key)
        assert entry is None and words in problem, (body[:60], problem)
    raw_record(json.dumps(forged.to_json()).encode(), artifact="application/vnd.other+json")
    entry, problem = client.record(run.repo, key)
    assert entry is None and "is not a builder ledger record" in problem


def test_a_tampered_or_corrupt_ledger_record_is_ignored(published):
    """Read through the same client a build uses, against the real registry: a record that lists other
    digests does not vouch; one that is not JSON, names another key, has the wrong shape or is not builder's
    artifact is ignored with the reason; a record pushed by builder reads back as pushed."""
    run, _, steps = published
    digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
    key = steps[f"image:{CELL}"]["artifacts"]["content_key"]
    source = RegistryPath(run.registry, Endpoint(run.registry.split("/")[0], tls_verify=False))
    with reuse.Client(source) as client:
        found = client.image(run.repo, TAG)
        assert found.digest == digest and labels.content_key(found.labels) == key
        genuine, _ = client.record(run.repo, key)
        assert ledger.vouches(genuine, digest)[0]
        try:
            _forge_records(client, run, key, digest)
            # and a build says so in one line, and builds
            res, steps2, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
            assert steps2[f"image:{CELL}"]["artifacts"]["reused"] is False
            assert f"registry: {run.repo}:{TAG} carries content key {key} but its ledger record is ignored (" \
                in res.stderr
        finally:  # the module's other tests read the same publish: the genuine record back
            client.push_record(run.repo, genuine)
        assert ledger.vouches(client.record(run.repo, key)[0], digest)[0]
    # a registry that does not answer: the reason, no traceback
    from tests.helpers import free_port

    nobody = f"127.0.0.1:{free_port()}/x"
    with pytest.raises(reuse.Unusable, match="did not answer"):
        with reuse.Client(RegistryPath(nobody, Endpoint(nobody.split("/")[0], tls_verify=False))) as client:
            client.image(f"{nobody}/cuda-ext", TAG)


REAL_CELL = "vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-index"
REAL_CALL_S = 5400  # one build of the ~15 GB image: 21 min on a quiet 2-core machine, its OCI export alone ~16 min
REAL_FREE_GB = 30  # the image in the daemon (10.2 GB unpacked, 4.2 GB of zstd layers), its OCI archive, the registry's copy


@pytest.mark.slow
@pytest.mark.network
def test_the_real_vllm_0_33_index_cell_is_built_published_as_built_and_taken_from_the_registry(
        registry, local_bases, docker_engine, tmp_path):
    """Slow (a ~15 GB image built once, pushed once, pulled once), issue 51 on the real vLLM 0.33.0 index cell: a
    build from nothing resolves the runtime pins before it installs and installs them hash-locked; `publish` right
    after on the same runner (same wheelhouse, work dir and pins) smokes and pushes that very image — no buildx
    call, no second export; a fresh runner (the tag and image gone from the daemon, an empty wheelhouse) takes it
    from the registry by digest. One digest for all three; the seconds of each are printed (figures, not asserted:
    the goals are publish <= 5 min and the fresh runner <= its pull)."""
    from tests.helpers import real_vllm_index_matrix

    free = shutil.disk_usage(tmp_path).free / 1e9
    if free < REAL_FREE_GB:
        pytest.fail(f"this test needs about {REAL_FREE_GB} GB free on {tmp_path} (the image, its OCI archive and the "
                    f"registry's copy); {free:.0f} GB are", pytrace=False)
    suffix = uuid.uuid4().hex[:8]
    names = f"127.0.0.1:5000/builder-test-rrv{suffix}"
    reg = f"{registry}/rrv{suffix}"
    (tmp_path / "fx").mkdir()
    matrix = tmp_path / "fx" / "matrix.toml"
    # jit prebuilt: the image publish smokes carries its JIT modules (a first-request cell's smoke compiles them on the
    # runner: 1,294 s of a 1,329 s publish, docs/evidence/2026-12-05-publish-as-built.md)
    matrix.write_text(real_vllm_index_matrix(names, jit="prebuilt"))
    cell_id = f"{REAL_CELL}-jitprebuilt"  # the cell's id names its jit mode
    tag = cell_id.removeprefix("vllm-")
    ref = f"{names}/vllm:{tag}"
    res = builder("lock", "--matrix", str(matrix), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr

    def run(verb: str, where: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict, float]:
        argv = [verb, "--matrix", str(matrix), "--wheelhouse", str(tmp_path / where / "wheelhouse"), "--work-dir",
                str(tmp_path / where / "work"), "--log-dir", str(tmp_path / where / f"logs-{verb}"), "--pins-dir",
                str(tmp_path / where / "pins"), "--ca-bundle", str(HOST_CA), "--quiet", "--json", *extra]
        started = time.monotonic()
        res = builder(*argv, cwd=tmp_path, timeout=REAL_CALL_S)
        seconds = time.monotonic() - started
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
        (cell,) = json.loads(res.stdout[:res.stdout.rindex("]") + 1])
        return res, {r["step"]: r for r in cell["steps"]}, seconds

    forget_locally(ref)
    try:
        _, steps, built = run("build", "first", "--no-smoke")  # publish smokes it: what it pushes is what smoke ran
        digest = steps["image"]["artifacts"]["digest"]
        log = (tmp_path / "first" / "logs-build" / f"{cell_id}.log").read_text()
        assert log.index("--target runtime-resolved") < log.index("--target runtime ") and "--require-hashes" in log
        pins_file = tmp_path / "first" / "pins" / f"{cell_id}.txt"
        pinned = {l.partition(" ")[0].partition("[")[0].split("==")[0]: l.partition(" ")[0].split("==")[1]
                  for l in pins_file.read_text().splitlines() if l and not l.startswith("#")}
        assert {"pip", "setuptools", "torch"} <= set(pinned), sorted(pinned)
        freeze = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", ref, "-m", "pip",
                                 "freeze", "--all"], capture_output=True, text=True, check=True).stdout
        # pins name distributions canonically (huggingface-hub), freeze as they spell themselves (huggingface_hub)
        installed = {canonicalize_name(n): v for n, v in (l.split("==", 1) for l in freeze.splitlines() if "==" in l)}
        differ = {n: (v, installed.get(n)) for n, v in pinned.items() if installed.get(n) != v}
        assert not differ, differ  # every pin installed at its version (vllm itself is the cell's audited wheel)
        archive = tmp_path / "first" / "work" / cell_id / "image.oci.tar"
        exported = archive.stat().st_mtime_ns

        _, steps, published = run("publish", "first", "--registry", reg, "--images-json", str(tmp_path / "images.json"),
                                  "--no-aliases")
        assert steps["image"]["artifacts"]["reused"] is True and steps["publish"]["artifacts"]["digest"] == digest
        log = (tmp_path / "first" / "logs-publish" / f"{cell_id}.log").read_text()
        assert "docker buildx build" not in log and archive.stat().st_mtime_ns == exported
        smoke_s, push_s = steps["smoke"]["seconds"], steps["publish"]["seconds"]

        forget_locally(ref)
        res, steps, fresh = run("build", "fresh", "--no-smoke", "--reuse-from", reg)
        image = steps["image"]["artifacts"]
        assert image["pulled"] is True and image["digest"] == digest and local_id(ref) == digest, image
        print(f"\nreal vLLM 0.33.0 index cell, one digest {digest}: built from nothing in {built:.0f} s "
              f"({archive.stat().st_size / 1e9:.2f} GB OCI archive); published as built in {published:.0f} s "
              f"(smoke {smoke_s:.0f} s, push {push_s:.0f} s); a fresh runner took it from the "
              f"registry in {fresh:.0f} s (image step {steps['image']['seconds']:.1f} s, pull included)")
    finally:
        forget_locally(ref)


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live descendant of `pid`, from /proc."""
    parent: dict[int, int] = {}
    lines: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                lines[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for child, par in parent.items():
            if par == p:
                out.append((child, lines.get(child, "")))
                todo.append(child)
    return out


def test_a_pull_interrupted_half_way_names_nothing(published):
    """SIGINT while `docker pull` of the reused image runs: the build stops (exit 130) and the cell's tag is not
    made; whatever the daemon finished is named only by its own digest. The next build pulls and tags it."""
    import signal

    run, _, steps = published
    digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
    for attempt in range(10):  # the fixture's pull takes about a second: catch it while it runs
        where = run.fresh()
        subprocess.run(["docker", "image", "rm", f"{run.repo}@{digest}"], capture_output=True)
        proc = subprocess.Popen([sys.executable, "-m", "builder.cli",
                                 *run.args("build", where, "--no-smoke", "--reuse-from", run.registry)],
                                cwd=run.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
        caught = False
        while proc.poll() is None:
            if any(" pull --quiet " in line for _, line in _children(proc.pid)):
                proc.send_signal(signal.SIGINT)
                caught = True
                break
            time.sleep(0.005)
        out, err = proc.communicate(timeout=300)
        if caught:
            break
    assert caught, "the pull was never caught running in 10 attempts"
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    assert "interrupted by SIGINT during image" in err, err[-3000:]
    assert not local_id(run.ref)  # no tag: neither the cell's nor a run's name
    names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                            run.ref.rsplit(":", 1)[0]], capture_output=True, text=True).stdout.split()
    assert not [n for n in names if n.startswith(run.ref)], names
    assert local_id(f"{run.repo}@{digest}") in ("", digest)
    res, steps2, _ = run.run("build", "--no-smoke", "--reuse-from", run.registry)
    assert steps2[f"image:{CELL}"]["artifacts"]["pulled"] is True and local_id(run.ref) == digest
    subprocess.run(["docker", "image", "rm", f"{run.repo}@{digest}"], capture_output=True)


def test_a_teammates_plain_build_takes_the_cell_ci_published_to_the_matrix_registry(registry, local_bases,
                                                                                     docker_engine, tmp_path):
    """The matrix names the registry CI publishes to: a fresh runner's plain `builder build` (no --reuse-from, an
    empty wheelhouse, the image gone from the daemon) takes the published cell from there instead of building it;
    `--reuse-from none` builds."""
    repo = f"{registry}/rrd{uuid.uuid4().hex[:8]}"
    run = Run(tmp_path, repo, repo)  # the matrix's registry is where publish pushes
    try:
        _, steps, _ = run.run("publish")
        digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
        res, steps, _ = run.run("build", "--no-smoke")
        image = steps[f"image:{CELL}"]["artifacts"]
        assert image["reused"] is True and image["pulled"] is True and image["digest"] == digest, image
        assert local_id(run.ref) == digest
        res, steps, _ = run.run("build", "--no-smoke", "--reuse-from", "none")
        assert steps[f"image:{CELL}"]["artifacts"]["reused"] is False
    finally:
        forget_locally(run.ref)
