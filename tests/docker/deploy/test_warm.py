"""builder warm against the stand-in engine server (tests/fixtures/smoke/stand_in: a TEST DOUBLE for a GPU engine,

The Docker half of tests/unit/deploy/test_warm.py: its docstring says the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder import render

from tests.helpers import REPO, SMOKE_MATRIX as MATRIX
from tests.helpers import build_stand_in, stand_in_cell, stand_in_digest
from tests.registry_runs import digest_in

KERNELS = sorted(f"{d}/standin-{v}/k2/kernel-{i}.bin" for d, v in (("vllm", "vllm_cache_root"),
                                                                   ("triton", "triton_cache_dir"),
                                                                   ("inductor", "torchinductor_cache_dir"))
                 for i in range(3))
LOCKS = ["inductor/standin.lock", "triton/standin.lock", "vllm/standin.lock"]
# saved again with the same bytes at every boot (a cache hit that re-saves its entry): captured once, never a compile
AUTOTUNE = ["inductor/standin-autotune.json", "triton/standin-autotune.json", "vllm/standin-autotune.json"]
CAPTURED = sorted(KERNELS + LOCKS + AUTOTUNE)  # what a cold boot writes under the root


@pytest.fixture(scope="module")
def cold_image(local_bases) -> str:
    cell = stand_in_cell()
    tag = f"builder-test/warm-stand-in:{stand_in_digest()}"
    build_stand_in(tag, render.labels(cell, {p.name: "test-double" for p in cell.packages}), local_bases["debian"])
    return tag


def builder(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "BUILDER_CACHE_DIR": str(cwd / "cache"),
                                                "PYTHONPATH": str(REPO), **(env or {})})


def inspect(ref: str) -> dict:
    out = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]


@pytest.fixture(scope="module")
def warmed(cold_image, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("warm")
    res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--gpus", "none", "--model", "tiny",
                  "--json", cwd=work)
    assert res.returncode == 0, res.stdout + res.stderr
    return {**json.loads(res.stdout), "work": work}


def test_the_capture_holds_exactly_what_the_boot_compiled_under_the_root(warmed):
    capture = warmed["work"] / warmed["capture"]
    tree = capture / "tree"
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()) == CAPTURED
    assert (tree / KERNELS[0]).read_text().endswith("compiled for k=2 (TEST DOUBLE)\n")
    facts = json.loads((capture / "warm.json").read_text())
    assert facts["cache_root"] == "/opt/jit-cache" and facts["strategy"] == "MTP2"
    assert facts["written-outside"] == []  # nothing outside the cache root: no HOME, no /tmp
    assert facts["cold-boot-s"] > 0 and facts["warm-boot-s"] > 0


def test_the_warm_image_is_the_cold_image_plus_one_layer_with_its_labels(warmed, cold_image):
    warm, cold = inspect(warmed["image"]), inspect(cold_image)
    assert warm["RootFS"]["Layers"][:-1] == cold["RootFS"]["Layers"]
    assert len(warm["RootFS"]["Layers"]) == len(cold["RootFS"]["Layers"]) + 1
    labels = warm["Config"]["Labels"]
    assert labels["io.builder.warm"] == "1" and labels["io.builder.warm.of"] == warmed["of"] == cold["Id"]
    assert labels["io.builder.warm.strategy"] == "MTP2" and labels["io.builder.warm.gpu-arch"] == "none"
    assert labels["io.builder.warm.files"] == str(len(CAPTURED))
    assert float(labels["io.builder.warm.cold-boot-s"]) > 0 and float(labels["io.builder.warm.warm-boot-s"]) > 0
    assert warmed["image"].endswith("-warm-mtp2-nogpu")
    # the layer's files, at the image's own paths
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "find", warmed["image"], "/opt/jit-cache", "-type",
                          "f"], capture_output=True, text=True, check=True).stdout.split()
    assert sorted(out) == sorted(f"/opt/jit-cache/{f}" for f in CAPTURED)


def test_packing_the_same_capture_again_gives_the_same_digest(warmed, cold_image):
    capture = warmed["work"] / warmed["capture"]
    res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--from-dir", str(capture), "--json",
                  cwd=warmed["work"])
    assert res.returncode == 0, res.stdout + res.stderr
    again = json.loads(res.stdout)
    assert (again["digest"], again["layer"]) == (warmed["digest"], warmed["layer"])


def test_smoke_of_the_warm_image_passes_and_fails_when_the_boot_compiles(warmed):
    work = warmed["work"]
    common = ["smoke", warmed["image"], "--matrix", str(MATRIX), "--gpus", "none", "--layers", "L3", "--strategy", "MTP2",
              "--json"]
    ok = builder(*common, "--report-dir", str(work / "r1"), cwd=work)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    l3 = next(r for r in json.loads(ok.stdout)["results"] if r["layer"] == "L3")
    # the lock files (in the allowance); the autotune files the boot saved again with the image's bytes are no compile
    assert l3["figures"]["cache_files_written"] == 3 and sorted(l3["figures"]["cache_written"]) == LOCKS
    bad = builder(*common, "--env", "STAND_IN_MODE=compiles", "--report-dir", str(work / "r2"), cwd=work)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    l3 = next(r for r in json.loads(bad.stdout)["results"] if r["layer"] == "L3")
    assert l3["status"] == "fail" and "has a warm layer, yet its boot compiled 1 file(s)" in l3["reason"]
    assert "triton/recompiled-" in l3["reason"]
    # judged before the boot (every part of the stand-in's key is the layer's), measured after it: the judge's
    # hit that compiled is named as a part the key data lacks
    assert l3["figures"]["warm_judgement"]["holds"] is True and l3["figures"]["compiled_per_cache"] == {"triton": 1}
    assert "the judge was wrong for triton (judged a hit, compiled 1" in l3["reason"], l3["reason"]


def test_a_capture_that_is_not_one_is_refused_with_one_line(cold_image, tmp_path):
    (tmp_path / "nothing").mkdir()
    res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--from-dir",
                  str(tmp_path / "nothing"), cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "not a warm capture" in res.stderr
    res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP9", "--gpus", "none", cwd=tmp_path)
    assert res.returncode == 2, res.stderr



def test_a_capture_holding_a_hard_link_to_a_host_file_is_refused_before_anything_is_built(cold_image, tmp_path):
    """Issue 46 item 2: `warm --from-dir` packed a hard-linked host file's bytes into the warm image. Now the verb
    refuses the capture in one line, before BuildKit is called: no warm image, no tag."""
    tree = tmp_path / "cap" / "tree" / "triton"
    tree.mkdir(parents=True)
    (tree / "k.cubin").write_bytes(b"sass")
    (tmp_path / "host-secret").write_text("a host file\n")
    os.link(tmp_path / "host-secret", tree / "k2.cubin")
    (tmp_path / "cap" / "warm.json").write_text(json.dumps({"cache_root": "/opt/jit-cache", "strategy": "MTP2"}))
    repo = cold_image.rsplit(":", 1)[0]  # the warm image would be REPO:<tag>-warm-...
    # sorted: docker lists images by creation time, and reproducible images share one (SOURCE_DATE_EPOCH),
    # so the order of equal times changes from one listing to the next
    images = lambda: sorted(subprocess.run(["docker", "image", "ls", "--no-trunc", "--format",  # noqa: E731
                                            "{{.Tag}} {{.ID}}", repo],
                                           capture_output=True, text=True, check=True).stdout.splitlines())
    before = images()
    res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--from-dir",
                  str(tmp_path / "cap"), cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "hard link to a file outside" in res.stderr
    assert images() == before


def test_no_file_of_the_cold_image_is_newer_than_the_warm_layers_files(warmed, cold_image):
    """ninja (FlashInfer's JIT) rebuilds an output older than one of its inputs: with the layer's times at 0, the
    H200's restored first boot rebuilt a module (docs/evidence/2026-12-02-h200-warm-layer.md). The layer's files carry
    the cold image's creation time, and nothing in the image is newer."""
    script = ('f=$(find /opt/jit-cache -type f | head -n1); stat -c %Y "$f"; '
              'find / -xdev -newer "$f" -not -path "/opt/jit-cache/*" -not -path "/proc/*" -not -path "/sys/*" '
              '-not -path "/dev/*" | head -n 40')
    made_by_docker_run = {"/", "/etc", "/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/etc/mtab", "/proc", "/dev",
                          "/sys", "/.dockerenv"}
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", warmed["image"], "-c", script],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    from datetime import datetime

    created = inspect(cold_image)["Created"]
    assert int(out[0]) == int(datetime.fromisoformat(created.split(".")[0].rstrip("Z") + "+00:00").timestamp())
    assert [line for line in out[1:] if line and line not in made_by_docker_run] == []


def test_a_process_capture_is_packed_only_when_it_was_made_at_the_image_paths(cold_image, tmp_path):
    facts = {"cache_root": "/opt/jit-cache", "strategy": "MTP2", "captured-on": "process", "gpu-arch": "sm90"}
    (tmp_path / "cap" / "tree" / "triton").mkdir(parents=True)
    (tmp_path / "cap" / "tree" / "triton" / "k.cubin").write_bytes(b"sass")
    for layout, words in ((None, "no --image-paths"),
                          ({"prefix": "/usr", "purelib": "/usr/lib/python3/dist-packages", "cuda_home": "",
                            "model_root": "/models"}, "prefix '/usr' (the image's: '/opt/venv')")):
        (tmp_path / "cap" / "warm.json").write_text(json.dumps({**facts, "layout": layout}))
        res = builder("warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--from-dir",
                      str(tmp_path / "cap"), cwd=tmp_path)
        assert res.returncode == 2 and words in res.stderr, res.stderr


# slow: a publish and a push; the default tier records the warm table in tests/unit/image/test_publish.py
@pytest.mark.slow
def test_push_puts_the_warm_image_beside_its_published_cold_image_and_lists_both(warmed, cold_image, registry,
                                                                                tmp_path):
    """`warm --push REGISTRY` is refused (exit 2, before any boot or push) while REGISTRY does not serve the cold image
    by the digest it was warmed from; once the cold image is there (pushed by docker, as publish's push keeps the
    digest too), the warm image goes beside it by digest, under its warm tag, and images.json's `warm` table lists it
    with the cold image it is FROM, next to the cells publish wrote (kept as they were). Real registry, 127.0.0.1."""
    capture = str(warmed["work"] / warmed["capture"])
    images = tmp_path / "images.json"
    published = {"format": 1, "images": {"some-cell": {"digest": "sha256:" + "0" * 64}}, "aliases": {}}
    images.write_text(json.dumps(published))
    prefix = f"{registry}/warm-push-{os.getpid()}"
    repository = f"{prefix}/stand-in-engine"  # PATH/<engine>, as publish names it
    name = repository.removeprefix(registry + "/")
    cold_tag = cold_image.split(":")[-1]
    warm_tag = warmed["image"].split(":")[-1]
    args = ["warm", cold_image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--from-dir", capture, "--push", prefix,
            "--images-json", str(images), "--json"]

    refused = builder(*args, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"does not serve the cold image {warmed['of']}" in refused.stderr and "builder publish" in refused.stderr
    assert digest_in(registry, name, warm_tag) is None
    assert json.loads(images.read_text()) == published

    subprocess.run(["docker", "tag", cold_image, f"{repository}:{cold_tag}"], check=True, capture_output=True)
    try:
        pushed = subprocess.run(["docker", "push", f"{repository}:{cold_tag}"], capture_output=True, text=True)
    finally:
        subprocess.run(["docker", "image", "rm", f"{repository}:{cold_tag}"], capture_output=True)
    assert pushed.returncode == 0, pushed.stderr
    assert digest_in(registry, name, warmed["of"]) == warmed["of"]  # the daemon pushed it by its digest

    from tests.support.ledger_signing import pair

    pem, pub = pair()  # CI's signing key: the warm image's SBOM and warm provenance are signed with it
    (tmp_path / "ci.pub").write_bytes(pub)
    res = builder(*args, cwd=tmp_path, env={"BUILDER_LEDGER_SIGNING_KEY": pem})
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["pushed"] == out["digest"] == warmed["digest"]
    # builder verify: signed, about this digest, and its warm provenance names the labels' cold image, key and layer
    checked = builder("verify", f"{repository}@{warmed['digest']}", "--key", str(tmp_path / "ci.pub"), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "warm: warm layer" in builder("verify", f"{repository}@{warmed['digest']}", "--key", str(tmp_path / "ci.pub"),
                                         "--json", cwd=tmp_path).stdout
    assert digest_in(registry, name, warm_tag) == warmed["digest"]
    assert digest_in(registry, name, warmed["digest"]) == warmed["digest"]
    data = json.loads(images.read_text())
    assert data["images"] == published["images"]
    entry = data["warm"][f"{repository}:{warm_tag}"]
    assert entry["digest"] == warmed["digest"] and entry["of"] == f"{repository}@{warmed['of']}"
    assert entry["pull"] == f"docker pull {repository}@{warmed['digest']}"
    assert (entry["strategy"], entry["gpu-arch"], entry["files"]) == ("MTP2", "none", len(CAPTURED))
    assert entry["cold-boot-s"] > 0 and entry["warm-boot-s"] > 0
    assert sorted(a["kind"] for a in entry["referrers"]) == ["provenance", "sbom"]
    from builder.deploy.runtime.warmkey import Record  # the key the judge reads, listed for whoever reads the table

    assert Record.from_label(entry["key"]).caches == {"inductor": 5, "triton": 5, "vllm": 5}


FAKE_CLIENT = '''#!/bin/sh
# TEST DOUBLE of `python -m vllm.entrypoints.cli.main bench serve` (not vLLM): writes a fixed result file
dir=""; file=""
while [ $# -gt 0 ]; do
  case "$1" in --result-dir) dir="$2"; shift ;; --result-filename) file="$2"; shift ;; esac
  shift
done
printf '{"duration": 1.0, "completed": 4, "request_throughput": 2, "p99_ttft_ms": 10}' > "$dir/$file"
'''


# slow: two bench runs; the default tier reads the boot state into bench rows in tests/unit/deploy/test_warm.py
@pytest.mark.slow
def test_bench_measures_the_boot_state_cold_for_the_cold_image_restored_for_the_warm_one(warmed, cold_image, tmp_path):
    """bench's boot_state is what the container's cache root held at boot and what the run wrote there (the
    stand-in server, a TEST DOUBLE, compiles into each cache it is given; the load generator is a TEST DOUBLE): the
    cold image's root is empty and the run compiles; the warm image's holds its layer and the run writes only the
    lock files."""
    fake = tmp_path / "client"
    fake.write_text(FAKE_CLIENT)
    fake.chmod(0o755)
    for image, state, at_boot in ((cold_image, "cold", 0), (warmed["image"], "restored", len(CAPTURED))):
        out = tmp_path / state
        res = builder("bench", image, "--matrix", str(MATRIX), "--strategy", "MTP2", "--gpus", "none", "--model", "tiny",
                      "--workload", "quick", "--repeats", "1", "--no-warmup", "--no-lossless", "--client-python",
                      str(fake), "--out-dir", str(out), "--boot-timeout", "60", cwd=warmed["work"])
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        row = json.loads(next(out.glob("*/bench.json")).read_text())["rows"][0]
        assert (row["boot_state"], row["cache_files_at_boot"], row["cache_root"]) == (state, at_boot, "/opt/jit-cache")
        written = sorted(row["cache_written"])
        assert written == (CAPTURED if state == "cold" else LOCKS), written


def base_by_digest(cold_image: str, tmp_path: Path) -> str:
    """The cold image as warm.pack's `FROM`: by digest, resolvable by BuildKit from the daemon's store."""
    from builder import docker

    base = f"builder-test/warm-stand-in@{docker.image_id(cold_image)}"
    code, out = docker.make_local_digest_resolvable(base, cold_image, tmp_path / "resolve")
    assert code == 0, out
    return base


def test_two_captures_of_the_same_sizes_but_other_bytes_give_other_layers(cold_image, tmp_path):
    """BuildKit sends a build context's file again only when its size, mode or time changed. The capture's files
    all got the cold image's epoch as their time, so a second capture whose files had the same names and sizes
    (a path of the same length in FlashInfer's build.ninja, a cubin of the same size) was packed with the first
    one's bytes: a stale layer, found by the ninja test below restoring another run's build.ninja."""
    import hashlib

    from builder.image import oci
    from builder.deploy.warm import layer as warm_mod

    base = base_by_digest(cold_image, tmp_path)
    layers = {}
    for run, text in (("a", "run-1\n"), ("b", "run-2\n")):
        tree = tmp_path / run / "jit-cache"
        (tree / "triton" / "k").mkdir(parents=True)
        (tree / "triton" / "k" / "k.cubin").write_text(text)  # same name, same size, other bytes
        packed = warm_mod.pack(tree, "/opt/jit-cache", base, [], tmp_path / "work",  # the same work dir, as `warm`
                               "builder-test/warm-sizes:1", warm_mod.image_epoch(cold_image))
        with oci.Archive(packed.archive) as a:
            assert a.image().layers[-1]["mediaType"].endswith("+zstd")  # the matrix default; the cold layers stay
            entries = a.layer_entries({"digest": packed.layer})
        cubin = entries["/opt/jit-cache/triton/k/k.cubin"]
        layers[run] = (packed.layer, cubin.sha256)
    assert layers["a"][1] == hashlib.sha256(b"run-1\n").hexdigest(), layers
    assert layers["b"][1] == hashlib.sha256(b"run-2\n").hexdigest(), layers
    assert layers["a"][0] != layers["b"][0]


def test_a_restored_warm_layer_leaves_ninja_nothing_to_rebuild(cold_image, tmp_path):
    """FlashInfer JIT-builds its modules with ninja (deps = gcc), which rebuilds an output older than one of its
    inputs or newer than the time its deps log recorded. On the H200 a restore that stamped the layer's files with
    the restore time made the first boot rebuild fp8_blockscale_gemm_90 ("stored deps info out of date"). Here a real
    ninja and gcc build a module at a capture, warm.pack makes the layer with BuildKit, and scripts/gpu-host-run
    restores it on a "fresh host" (the bundle installed after the capture, its files newer than it): ninja has
    nothing to do, at that boot and the next one."""
    import shutil

    from builder.image import launchline, oci
    from builder.deploy.runtime import hostenv
    from builder.deploy.warm import layer as warm_mod
    from builder.deploy.warm import restore as restore_mod

    ninja = shutil.which("ninja")
    assert ninja, "ninja (Debian's ninja-build) is part of the test machine: FlashInfer's JIT is what this models"
    store = hostenv.Store(tmp_path / "store", REPO)
    py = "%d.%d" % sys.version_info[:2]
    paths = launchline.ImagePaths(prefix=str(tmp_path / "venv"), purelib=f"{tmp_path}/venv/lib/python{py}/site-packages",
                                  cuda_home="", cache_root=str(tmp_path / "jit-cache"))

    def install_bundle() -> None:  # the engine's package, installed on this host just now (its files' time: now)
        site = tmp_path / "store" / "site-eng"
        shutil.rmtree(site, ignore_errors=True)
        (site / "eng" / "include").mkdir(parents=True)
        (site / "eng" / "csrc").mkdir()
        (site / "eng" / "include" / "k.h").write_text("#define K 3\n")
        (site / "eng" / "csrc" / "k.c").write_text('#include "k.h"\nint k(void) { return K; }\n')

    def explain() -> str:
        res = subprocess.run([ninja, "-C", str(build), "-n", "-d", "explain"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return res.stdout + res.stderr

    # capture host: the module built at the cache root, as the engine's first boot builds it
    install_bundle()
    hostenv.image_venv(store, ["eng"], paths)
    build = Path(paths.cache_root) / "flashinfer" / "k"
    build.mkdir(parents=True)
    src = Path(paths.purelib) / "eng"
    (build / "build.ninja").write_text(
        "rule cc\n  command = gcc -MD -MF $out.d -I" + str(src / "include") + " -c $in -o $out\n"
        "  deps = gcc\n  depfile = $out.d\n"
        f"build k.o: cc {src / 'csrc' / 'k.c'}\n")
    subprocess.run([ninja, "-C", str(build)], check=True, capture_output=True)
    assert "no work to do" in explain()

    # the layer, by BuildKit, FROM the cold image by digest
    base = base_by_digest(cold_image, tmp_path)
    packed = warm_mod.pack(Path(paths.cache_root), paths.cache_root, base, [], tmp_path / "work",
                           "builder-test/ninja-warm:1", warm_mod.image_epoch(cold_image))
    layer = tmp_path / "layer.tar.zst"  # the blob as a registry serves it (zstd: restore reads it as it is)
    with oci.Archive(packed.archive) as a:
        layer.write_bytes(a.blob(packed.layer))
        assert any(p.endswith("flashinfer/k/.ninja_deps") for p in a.layer_entries({"digest": packed.layer}))

    # a fresh host: nothing at the cache root, the bundle installed and the venv made after the capture
    shutil.rmtree(paths.cache_root)
    install_bundle()
    hostenv.image_venv(store, ["eng"], paths, restore_mod.layer_time(layer))
    restore_mod.restore(layer, paths.cache_root)
    assert explain().strip().endswith("ninja: no work to do.")

    # the next boot on that host, no layer: the venv is kept with its times (on the H200 a venv made anew here made
    # ninja rebuild the module), as an image's venv is between two boots
    hostenv.image_venv(store, ["eng"], paths)
    assert explain().strip().endswith("ninja: no work to do.")

    # the two faults this guards against: the venv's files left at their install time (another bundle installed,
    # the venv made anew), the layer's at this moment
    install_bundle()
    (tmp_path / "store" / "installed-eng.sha256").write_text("0" * 64 + "\n")
    hostenv.image_venv(store, ["eng"], paths)
    assert "older than most recent input" in explain()
    hostenv.image_venv(store, ["eng"], paths, restore_mod.layer_time(layer))
    os.utime(build / "k.o")
    assert "stored deps info out of date" in explain()


def test_a_warm_killed_outright_in_its_cold_boot_leaves_no_container_running(cold_image, tmp_path):
    """Issue 46 item 8: `builder warm` SIGKILLed in its cold boot left the engine's container running (on a GPU host,
    holding the GPUs) until some later run reaped it. Its watchdog (builder/deploy/runtime/watchdog.py) removes it
    as soon as builder's process is gone."""
    from builder.image.labels import OWNER

    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "warm", cold_image, "--matrix", str(MATRIX),
                             "--strategy", "MTP2", "--gpus", "none", "--model", "tiny", "--boot-timeout", "300",
                             "--env", "STAND_IN_MODE=never-ready"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "BUILDER_CACHE_DIR": str(tmp_path / "cache"),
                                                             "PYTHONPATH": str(REPO)})

    def running() -> list[str]:
        out = subprocess.run(["docker", "ps", "--filter", f"label={OWNER}", "--format",
                              f'{{{{.ID}}}} {{{{.Label "{OWNER}"}}}}'], capture_output=True, text=True, check=True)
        return [line.split()[0] for line in out.stdout.splitlines() if line.split()[1].startswith(f"{proc.pid}@")]

    try:
        deadline = time.monotonic() + 120
        while not (ours := running()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ours, "the cold boot's container never ran"
        time.sleep(1)  # mid-boot: the engine is up, never ready
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert running() == [], "the engine's container outlived builder's SIGKILL"
    finally:
        proc.kill()
        proc.wait()
        for cid in running():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


# -- issue 45: the key recorded, judged before the boot, and a miss that converges ---------------------------------
def _tiny_target(work: Path) -> Path:
    return next((work / "cache").glob("**/tiny-qwen3.5-fp8-*/target"))


def test_the_warm_image_records_its_whole_key(warmed):
    from builder.deploy.runtime.warmkey import LABEL, Record, of_knowledge

    labels = inspect(warmed["image"])["Config"]["Labels"]
    record = Record.from_label(labels[LABEL])
    assert record is not None, labels[LABEL]
    assert record.caches == {"inductor": 5, "triton": 5, "vllm": 5}  # 3 kernels, the lock, the autotune file each
    from builder.engines import load_knowledge

    flags = of_knowledge(load_knowledge((str(MATRIX.parent / "engines.toml"),))).flags_of("stand-in-engine", "1.0.0")
    parts = record.side(flags).parts
    assert json.loads(parts["speculative"]) == [["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']]
    assert parts["model-path"] == "/models/target" and parts["tp"] == "1"
    assert parts["model-config"] == __import__("hashlib").sha256(
        (_tiny_target(warmed["work"]) / "config.json").read_bytes()).hexdigest()
    assert record.gpu_name is None and record.arch is None  # --gpus none: no GPU, said as unknown


def _serve(warmed, strategy: str, port: int, name: str) -> subprocess.CompletedProcess[str]:
    return builder("serve", warmed["image"], "--matrix", str(MATRIX), "--strategy", strategy, "--model",
                   str(_tiny_target(warmed["work"])), "--gpus", "none", "--port", str(port), "--name", name,
                   cwd=warmed["work"])


def _run_until_healthy(argv: list[str], name: str, timeout: float = 120) -> str:
    """Run the serve line detached from this test (it is a foreground `docker run --rm`), wait for docker's health
    check to say healthy, stop it and return the container's log."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, status = time.monotonic() + timeout, ""
        while time.monotonic() < deadline and status != "healthy":
            time.sleep(1)
            status = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", name], capture_output=True,
                                    text=True).stdout.strip()
        log = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stdout
        assert status == "healthy", f"not healthy within {timeout}s ({status!r}):\n{log[-2000:]}"
        return log
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        proc.wait(timeout=60)


def test_served_on_its_key_the_warm_image_gets_the_warm_budget_and_no_volume(warmed):
    from tests.helpers import free_port

    res = _serve(warmed, "MTP2", free_port(), "builder-test-warm-onkey")
    assert res.returncode == 0, res.stderr
    assert "every cache's key matches; the first boot reuses it" in res.stderr, res.stderr
    assert "builder-jit-" not in res.stdout and "off its warm key" not in res.stderr
    warm_s = float(inspect(warmed["image"])["Config"]["Labels"]["io.builder.warm.warm-boot-s"])
    assert f"--health-start-period {int(-(-(warm_s + 120) // 1))}s" in res.stdout


def test_served_off_its_key_the_warm_image_gets_the_cold_budget_and_a_volume_and_converges(warmed):
    """Issue 45 item 3. The stand-in (TEST DOUBLE) keys its caches on K: the layer was made for MTP2, this serve is
    MTP7. The judge says so before the boot; the line gets the cold budget measured where the layer was made and a
    named volume at the cache root, which docker fills from the image's warm layer. The first run compiles K=7 into
    the volume and becomes healthy; a second run of the same line compiles nothing: it converged, where a warm budget
    and no volume would kill the boot and start it from the layer again."""
    from tests.helpers import free_port

    name = "builder-test-warm-offkey"
    res = _serve(warmed, "MTP7", free_port(), name)
    assert res.returncode == 0, res.stderr
    assert "vllm (5 files): compile: speculative" in res.stderr and "off its warm key" in res.stderr, res.stderr
    labels = inspect(warmed["image"])["Config"]["Labels"]
    cold_s = float(labels["io.builder.warm.cold-boot-s"])
    assert f"--health-start-period {int(-(-(cold_s + max(cold_s, 120)) // 1))}s" in res.stdout
    argv = __import__("shlex").split(res.stdout.strip().splitlines()[-1])
    volume = next(v.split(":")[0] for v in argv if v.startswith("builder-jit-"))
    subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
    try:
        first = _run_until_healthy(argv, name)
        compiled = [ln for ln in first.splitlines() if ln.startswith("compiled ")]
        assert len(compiled) == 9 and all("/k7/" in ln for ln in compiled), first  # 3 kernels x 3 caches, K=7 only
        again = _run_until_healthy(argv, name)
        assert not [ln for ln in again.splitlines() if ln.startswith("compiled ")], again
        listed = subprocess.run(["docker", "run", "--rm", "--entrypoint", "find", "-v", f"{volume}:/c", warmed["image"],
                                 "/c", "-name", "kernel-*.bin"], capture_output=True, text=True, check=True).stdout
        assert sum("/k2/" in p for p in listed.split()) == 9 and sum("/k7/" in p for p in listed.split()) == 9
        # docker filled the volume from the warm layer with its files' times (ninja, FlashInfer's JIT, reads them)
        stat = ["stat", "-c", "%Y %n"]
        in_image = subprocess.run(["docker", "run", "--rm", "--entrypoint", stat[0], warmed["image"], *stat[1:],
                                   f"/opt/jit-cache/{KERNELS[0]}"], capture_output=True, text=True, check=True).stdout
        in_volume = subprocess.run(["docker", "run", "--rm", "--entrypoint", stat[0], "-v", f"{volume}:/opt/jit-cache",
                                    warmed["image"], *stat[1:], f"/opt/jit-cache/{KERNELS[0]}"], capture_output=True,
                                   text=True, check=True).stdout
        assert in_volume == in_image, (in_image, in_volume)
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
