"""builder snapshot against the real daemon and a real CRIU (issue 52 item 5): the stand-in engine (a TEST DOUBLE of
an OpenAI-compatible server; no GPU, so the CUDA step finds no CUDA process and says so) booted in a container with
the capabilities CRIU needs, asked smoke L3's request, dumped, killed, restored in a fresh container (a fresh PID
namespace), the same answer and its counters continued; and a restore whose key does not hold refused before
anything starts.

Why a container holding its own CRIU: this machine's (bookworm) is CRIU 3.17, whose `criu check` fails on kernel
6.18 ("vdso: Failed to fill self vdso symtable"), and trixie's 4.1.1 as released cannot dump a TCP socket on
Linux >= 6.16 ("sockets: Can't get 1:34 opt: Operation not supported"). tests/fixtures/snapshot/Dockerfile builds
trixie's CRIU 4.1.1 with the socket-option change of CRIU 4.2, FROM the local Debian base."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from builder import render
from tests.helpers import REPO, stand_in_cell, stand_in_digest

FIXTURES = REPO / "tests" / "fixtures"
MODEL = "stand-in-model"


@pytest.fixture(scope="module")
def image(local_bases) -> str:
    cell = stand_in_cell()
    tag = f"builder-test/snapshot-stand-in:{stand_in_digest()}"
    labels = render.labels(cell, {p.name: "test-double" for p in cell.packages})
    argv = ["docker", "buildx", "build", "--progress=plain", "--load", "-t", tag, "-f",
            str(FIXTURES / "snapshot" / "Dockerfile"), "--build-arg", f"BASE={local_bases['debian']}",
            "--build-context", f"criu-patches={REPO / 'builder' / 'data' / 'criu'}"]
    for k, v in labels:
        argv += ["--label", f"{k}={v}"]
    res = subprocess.run([*argv, str(FIXTURES)], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tag


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


def containers() -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.builder.snapshot=1"], capture_output=True,
                          text=True, check=True).stdout.split()


def complete(port: int, prompt: str = "The capital of France is") -> str:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0.0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def drafts(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        line = next(x for x in resp.read().decode().splitlines() if x.startswith("standin:spec_decode_num_drafts_total"))
    return float(line.rsplit(" ", 1)[1])


M = ["--matrix", str(FIXTURES / "smoke" / "matrix.toml")]


def test_the_stand_in_is_snapshotted_and_restored_with_the_same_answer_and_its_state(image, tmp_path):
    snap = tmp_path / "snap"
    took = builder("snapshot", "take", image, "--strategy", "MTP2", "--model", MODEL, "--out", str(snap), "--json", *M,
                   cwd=tmp_path)
    assert took.returncode == 0, took.stdout + took.stderr
    record = json.loads(took.stdout)
    assert "no CUDA process in the tree" in took.stderr  # no GPU here: the GPU step finds nothing, and says so
    assert record["cuda_pids"] == [] and record["processes"] >= 1 and record["images"]["bytes"] > 0
    # quiesced through the data's sleep mode (its route exists only with the env the data names), woken at restore
    assert record["slept"] and record["wake"] == "/wake_up"
    assert "asleep (/sleep?level=1)" in (snap / "engine.log").read_text()
    key = json.loads((snap / "key.json").read_text())
    assert key["criu"].startswith("4.") and key["gpus"] == ["none"] and key["subject"].startswith("sha256:")
    assert containers() == []  # the dump ended the engine, and its container is gone
    before = record["metrics"]["standin:spec_decode_num_drafts_total"]
    assert before > 0  # smoke L3's streamed request with MTP2 made drafts
    # its named semaphore (multiprocessing's, as vLLM's and SGLang's) was dumped through a link remap, which CRIU
    # leaves in the engine's /dev/shm; it is in the snapshot, since the restore's fresh container has none
    (remap,) = record["link_remaps"]
    assert re.fullmatch(r"/dev/shm/link_remap\.\d+", remap["path"]) and (snap / remap["file"]).is_file()

    restored = builder("snapshot", "restore", str(snap), "--json", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    result = json.loads(restored.stdout)
    try:
        port = result["port"]
        assert result["answer"] == record["answer"] == complete(port)  # the same greedy tokens as before the dump
        assert result["metrics"]["standin:spec_decode_num_drafts_total"] == before  # its state came back whole
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
                data=json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 8, "stream": True}).encode()),
                timeout=30) as resp:
            resp.read()
        assert drafts(port) > before  # and it goes on counting from there
        shm = subprocess.run(["docker", "exec", result["container"], "ls", "/dev/shm"], capture_output=True, text=True)
        assert shm.returncode == 0 and "link_remap" not in shm.stdout  # CRIU used it up
        print(f"dump {record['dump_s']} s, restore {result['criu_restore_s']} s, ready {result['ready_s']} s, "
              f"images {record['images']}")
    finally:
        subprocess.run(["docker", "rm", "-f", result["container"]], capture_output=True)
    # the restored engine wrote to its log; CRIU refuses a reopened file whose size changed, so a second restore
    # from the same snapshot works only because restore sets the log back (what was written is kept beside it)
    assert (snap / "engine.log").stat().st_size > record["log_bytes"]
    again = builder("snapshot", "restore", str(snap), "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads(again.stdout)
    try:
        assert second["answer"] == record["answer"] and (snap / "engine.log.1").stat().st_size > record["log_bytes"]
    finally:
        subprocess.run(["docker", "rm", "-f", second["container"]], capture_output=True)


def test_a_snapshot_pushed_to_a_registry_and_pulled_elsewhere_restores_with_the_same_answer(image, registry, tmp_path):
    """Issue 52 item 4, how a snapshot ships: taken, pushed beside its image as an OCI artifact, pulled into another
    directory (another host's, as far as this machine can stand for one) and restored from there."""
    snap = tmp_path / "taken"
    took = builder("snapshot", "take", image, "--strategy", "MTP2", "--model", MODEL, "--out", str(snap), "--json", *M,
                   cwd=tmp_path)
    assert took.returncode == 0, took.stdout + took.stderr
    record = json.loads(took.stdout)
    assert record["directory"] == "/snapshot"  # the container's mount: the pulled copy may live anywhere
    ref = f"{registry}/builder-test/snapshot-stand-in:mtp2-snapshot"
    pushed = builder("snapshot", "push", str(snap), ref, "--json", cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    shipped = json.loads(pushed.stdout)
    pulled = builder("snapshot", "pull", f"{ref.rsplit(':', 1)[0]}@{shipped['digest']}", "--out", str(tmp_path / "pulled"),
                     "--json", cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    (remap,) = record["link_remaps"]  # the semaphore's link remap travelled with it (without it: no restore)
    assert (tmp_path / "pulled" / remap["file"]).read_bytes() == (snap / remap["file"]).read_bytes()
    restored = builder("snapshot", "restore", str(tmp_path / "pulled"), "--json", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    result = json.loads(restored.stdout)
    try:
        assert result["restored"] and result["answer"] == record["answer"] == complete(result["port"])
        print(f"snapshot {shipped['unpacked_bytes']} bytes, pushed as {shipped['layer_bytes']} (zstd) in "
              f"{shipped['seconds']} s; pulled in {json.loads(pulled.stdout)['seconds']} s; ready {result['ready_s']} s")
    finally:
        subprocess.run(["docker", "rm", "-f", result["container"]], capture_output=True)
    assert containers() == []


def test_an_engine_whose_sleep_takes_a_body_releases_only_what_the_data_names(image, tmp_path):
    """SGLang's sleep mode is its memory saver: POST /release_memory_occupation with {"tags": [...]}, where no tags
    means the weights too, which come back empty. The stand-in plays that API (a TEST DOUBLE of SGLang's routes,
    read in its 0.5.17 / 0.5.23 wheels); the engine data of this test is the fixture's with SGLang's sleep entry
    shape. The take must send the data's body, the restore must send it to the wake route, and the restored engine
    answers as before (with the weights released too, it would not)."""
    data = (FIXTURES / "smoke" / "engines.toml").read_text()
    vllm_like = next(line for line in data.splitlines() if line.startswith("sleep = "))
    sglang_like = ('sleep = { flag = "--enable-memory-saver", path = "/release_memory_occupation", '
                   'wake = "/resume_memory_occupation", body = \'{"tags": ["kv_cache"]}\' }')
    (tmp_path / "engines.toml").write_text(data.replace(vllm_like, sglang_like))
    (tmp_path / "matrix.toml").write_text((FIXTURES / "smoke" / "matrix.toml").read_text())
    snap = tmp_path / "snap"
    took = builder("snapshot", "take", image, "--strategy", "MTP2", "--model", MODEL, "--out", str(snap), "--json",
                   "--matrix", str(tmp_path / "matrix.toml"), cwd=tmp_path)
    assert took.returncode == 0, took.stdout + took.stderr
    record = json.loads(took.stdout)
    assert record["slept"] and record["wake"] == "/resume_memory_occupation"
    assert record["sleep_body"] == '{"tags": ["kv_cache"]}'
    log = (snap / "engine.log").read_text()
    assert "'enable_memory_saver': True" in log and "released ['kv_cache']" in log and "memory saver off" not in log
    restored = builder("snapshot", "restore", str(snap), "--json", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    result = json.loads(restored.stdout)
    try:
        assert "resumed ['kv_cache']" in (snap / "engine.log").read_text()
        assert result["answer"] == record["answer"] == complete(result["port"])
    finally:
        subprocess.run(["docker", "rm", "-f", result["container"]], capture_output=True)


def host_container(image: str, tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """A container of the CRIU image standing for a GPU host without Docker (its own /dev/shm, shared by every
    process in it as a host's is), running builder from this checkout."""
    import sysconfig

    argv = ["docker", "run", "--rm", "--label", "io.builder.snapshot=1",
            *(f"--cap-add={c}" for c in ("SYS_ADMIN", "CHECKPOINT_RESTORE", "SYS_PTRACE", "NET_ADMIN", "SYS_TIME")),
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "-v", f"{REPO}:/src:ro", "-v", f"{sysconfig.get_paths()['purelib']}:/deps:ro", "-v", f"{tmp_path}:/work",
            "-w", "/src", "-e", "PYTHONPATH=/src:/deps:/src/tests/fixtures/smoke/stand_in",
            "-e", "PYTHONDONTWRITEBYTECODE=1", "--entrypoint", "sh", image, "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_the_process_route_restores_in_a_fresh_pid_namespace_where_no_docker_is(image, tmp_path):
    """`--launcher process` (a GPU host without Docker) as it runs there: builder on the host spawns the engine,
    sleeps it, dumps it with CRIU, then restores it under `unshare --pid --fork --mount-proc` and reaches it through
    nsenter. The "host" is a container of the CRIU image (this machine's own CRIU cannot run, see above), running
    builder from this checkout with the test environment's pure-Python packages; the restored engine must answer
    as before, woken, in a PID namespace of its own (its pid 1 is the namespace's init, not the engine)."""
    cell = stand_in_cell().id
    script = (f"python3 -m builder.cli snapshot take {cell} --matrix tests/fixtures/smoke/matrix.toml --launcher "
              "process --python python3 --strategy MTP2 --model stand-in-model --out /work/snap --json "
              "--cache-root /work/cache > /work/take.json || exit 10; ls /dev/shm > /work/shm-after-take.txt; "
              "python3 -m builder.cli snapshot restore /work/snap --launcher process --json > /work/restore.json "
              "|| exit 11; "
              # the restored engine, seen from the host: its NSpid line has two pids (the host's, the namespace's)
              "for d in /proc/[0-9]*; do grep -qa stand_in_engine.server $d/cmdline 2>/dev/null && "
              "grep NSpid $d/status; done > /work/nspid.txt; "
              "python3 -c \"import json,urllib.request as u;print(json.loads(u.urlopen(u.Request("
              "'http://127.0.0.1:8000/v1/completions',data=json.dumps({'model':'stand-in-model','prompt':"
              "'The capital of France is','max_tokens':16,'temperature':0}).encode(),headers={'Content-Type':"
              "'application/json'})).read())['choices'][0]['text'])\" > /work/again.txt; "
              # a second restore while the first one listens: refused before anything starts
              "python3 -m builder.cli snapshot restore /work/snap --launcher process 2> /work/busy.txt; "
              "echo $? > /work/busy.rc; "
              # ended as the result says, then restored again from the same images (its log set back first)
              "$(python3 -c \"import json;print(json.load(open('/work/restore.json'))['stop'])\"); sleep 0.5; "
              "python3 -m builder.cli snapshot restore /work/snap --launcher process --json > /work/restore2.json "
              "|| exit 12; "
              # a restore that fails part-way (its memory pages gone) leaves nothing, and --or-boot boots instead
              "$(python3 -c \"import json;print(json.load(open('/work/restore2.json'))['stop'])\"); sleep 0.5; "
              "rm /work/snap/images/pages-*.img; "
              "python3 -m builder.cli snapshot restore /work/snap --launcher process --or-boot --json "
              "> /work/fallback.json 2> /work/fallback.err || exit 13; "
              "for d in /proc/[0-9]*; do grep -qa stand_in_engine.server $d/cmdline 2>/dev/null && "
              "grep NSpid $d/status; done > /work/after.txt; exit 0")  # (the loop's status is its last grep's)
    run = host_container(image, tmp_path, script)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    took = json.loads((tmp_path / "take.json").read_text())
    restored = json.loads((tmp_path / "restore.json").read_text())
    assert took["slept"] and took["processes"] >= 1 and took["cuda_pids"] == []
    # --cache-root: the cell's compile caches under it in the engine's environment, as smoke and warm boot it
    assert {k: took["env"].get(k) for k in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")} == {
        "VLLM_CACHE_ROOT": "/work/cache/vllm", "TRITON_CACHE_DIR": "/work/cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/work/cache/inductor"}
    # the link remap CRIU made on this host's /dev/shm went into the snapshot: a restore puts it back, each time
    assert len(took["link_remaps"]) == 1 and "link_remap" not in (tmp_path / "shm-after-take.txt").read_text()
    assert restored["answer"] == took["answer"] == (tmp_path / "again.txt").read_text().rstrip("\n")
    assert restored["metrics"]["standin:spec_decode_num_drafts_total"] == \
        took["metrics"]["standin:spec_decode_num_drafts_total"]
    # one engine, in a PID namespace of its own, at the pid the snapshot recorded (CRIU gave it back its pid there)
    # (the container is a PID namespace too: the engine's line is "NSpid: <container's pid> <restore's pid>"; the
    # script's own shell, whose text names the engine, is pid 1 of the container alone)
    lines = [line.split()[1:] for line in (tmp_path / "nspid.txt").read_text().splitlines()]
    engines = [pids for pids in lines if len(pids) == 2]
    assert len(engines) == 1 and engines[0][1] == str(restored["pid"]) != engines[0][0], lines
    assert restored["stop"].startswith("kill -KILL ")
    assert (tmp_path / "busy.rc").read_text().strip() == "2"
    assert "port 8000 on 127.0.0.1 is in use" in (tmp_path / "busy.txt").read_text()
    assert json.loads((tmp_path / "restore2.json").read_text())["answer"] == took["answer"]
    fallback = json.loads((tmp_path / "fallback.json").read_text())
    assert fallback["restored"] is False and "criu restore failed" in fallback["why"], fallback
    assert "nothing restored is left running" in (tmp_path / "fallback.err").read_text()
    # one engine now: the one booted instead, in no PID namespace of builder's (its NSpid has the container's pid only)
    engines = [line.split()[1:] for line in (tmp_path / "after.txt").read_text().splitlines()]
    assert [pids for pids in engines if len(pids) > 1] == [] and len([p for p in engines if p != ["1"]]) == 1, engines
    assert containers() == []


def test_two_snapshots_with_the_same_link_remap_restore_at_once_on_one_host(image, tmp_path):
    """Two takes of the same engine on one host leave remaps of the same name (CRIU numbers them by the file's id
    in the dump: vLLM's was link_remap.428 on every H100). Restored at once, each must find its own remap, not the
    other's or none: builder holds the directory from putting a remap back until CRIU has consumed it. Both
    answer, each on its port, and no remap is left in /dev/shm."""
    cell = stand_in_cell().id
    take = (f"python3 -m builder.cli snapshot take {cell} --matrix tests/fixtures/smoke/matrix.toml --launcher process "
            "--python python3 --strategy MTP2 --model stand-in-model --json")
    restore = "python3 -m builder.cli snapshot restore /work/{0} --launcher process --json > /work/{0}-restore.json"
    script = (f"{take} --port 8000 --out /work/a > /work/a-take.json || exit 10; "
              f"{take} --port 8001 --out /work/b > /work/b-take.json || exit 11; "
              # each restore at once, three times over (each pair ended before the next)
              "for i in 1 2 3; do "
              f"({restore.format('a')}-$i 2> /work/a-restore-$i.err; echo $? > /work/a-$i.rc) & "
              f"({restore.format('b')}-$i 2> /work/b-restore-$i.err; echo $? > /work/b-$i.rc) & wait; "
              "ls /dev/shm | grep -c link_remap > /work/left-$i.txt; "
              "for s in a b; do $(python3 -c \"import json,sys;print(json.load(open(sys.argv[1])).get('stop') or "
              "'true')\" /work/$s-restore.json-$i); done; sleep 0.5; done; exit 0")
    run = host_container(image, tmp_path, script)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    took = {s: json.loads((tmp_path / f"{s}-take.json").read_text()) for s in "ab"}
    (ra,), (rb,) = took["a"]["link_remaps"], took["b"]["link_remaps"]
    assert ra["path"] == rb["path"], (ra, rb)  # the case: one name wanted by both
    for i in (1, 2, 3):
        for s in "ab":
            rc = (tmp_path / f"{s}-{i}.rc").read_text().strip()
            assert rc == "0", (tmp_path / f"{s}-restore-{i}.err").read_text()[-2000:]
            got = json.loads((tmp_path / f"{s}-restore.json-{i}").read_text())
            assert got["restored"] and got["answer"] == took[s]["answer"] and got["port"] == {"a": 8000, "b": 8001}[s]
        assert (tmp_path / f"left-{i}.txt").read_text().strip() == "0"
    assert containers() == []


def test_a_restore_whose_key_does_not_hold_is_refused_and_starts_nothing(image, tmp_path):
    snap = tmp_path / "snap"
    took = builder("snapshot", "take", image, "--strategy", "MTP2", "--model", MODEL, "--out", str(snap), *M,
                   cwd=tmp_path)
    assert took.returncode == 0, took.stderr
    key = json.loads((snap / "key.json").read_text())
    key["gpus"], key["driver"] = ["NVIDIA H200"], "580.159.04"  # taken on a GPU host: this one has none
    (snap / "key.json").write_text(json.dumps(key))
    refused = builder("snapshot", "restore", str(snap), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "gpus: the snapshot's NVIDIA H200, here none" in refused.stderr and "boot it warm" in refused.stderr
    assert "Traceback" not in refused.stderr and containers() == []
    other = builder("snapshot", "restore", str(snap), "--model", "another-model", cwd=tmp_path)
    assert other.returncode == 2 and "model: the snapshot's" in other.stderr and containers() == []
    # --or-boot: the engine booted instead with the snapshot's own launch line, ready, saying why
    other = builder("snapshot", "restore", str(snap), "--model", "another-model", "--or-boot", cwd=tmp_path)
    assert other.returncode == 2 and containers() == []  # another model: that launch line serves the snapshot's
    booted = builder("snapshot", "restore", str(snap), "--or-boot", "--json", cwd=tmp_path)
    assert booted.returncode == 0, booted.stderr
    result = json.loads(booted.stdout)
    try:
        assert result["restored"] is False and "gpus: the snapshot's NVIDIA H200, here none" in result["why"]
        assert complete(result["port"]) == json.loads((snap / "snapshot.json").read_text())["answer"]
        assert "not restored: the snapshot does not hold here" in booted.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", result["container"]], capture_output=True)
    assert containers() == []


def test_an_image_the_daemon_does_not_hold_is_refused_and_nothing_is_written(tmp_path):
    """Not local, and its registry (Docker Hub) unreachable here: exit 3 (the environment), as every verb that reads an
    image says it (deploy/subject.read), before any container or directory is made."""
    refused = builder("snapshot", "take", "builder-test/no-such-image:never", "--model", MODEL, "--out",
                      str(tmp_path / "o"), cwd=tmp_path)
    assert refused.returncode == 3 and "not a local image" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "o").exists() and containers() == []


def test_the_cuda_checkpoint_tool_builds_with_the_toolkit_header_and_takes_nvidias_command_line(local_bases):
    """builder's cuda-checkpoint (builder/deploy/snapshot/cuda_checkpoint.c) compiled in the local CUDA 13.0 devel base
    with its cuda.h alone: `-h` names --action (what CRIU's CUDA plugin looks for before it uses the tool), a bad
    argument exits 2 with the usage, and with no CUDA driver (this machine: no GPU) a real request says so in one
    line and exits 1. What it does on a GPU is the GPU session's (docs/snapshot.md)."""
    src = REPO / "builder" / "deploy" / "snapshot"
    script = ('H=$(dirname "$(find / -path /proc -prune -o -name cuda.h -path "*nvidia*include*" -print | head -1)"); '
              "cc -O2 -Wall -Werror -o /tmp/cuda-checkpoint /src/cuda_checkpoint.c -I\"$H\" -ldl || exit 9; "
              "/tmp/cuda-checkpoint -h; echo rc=$?; /tmp/cuda-checkpoint --pid; echo rc=$?; "
              "/tmp/cuda-checkpoint --get-state --pid 1; echo rc=$?")
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{src}:/src:ro", "--entrypoint", "sh",
                          local_bases["cuda_devel"], "-c", script], capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "--action lock|checkpoint|restore|unlock" in out.stdout and "rc=0" in out.stdout
    assert out.stdout.count("rc=2") == 1 and out.stdout.rstrip().endswith("rc=1"), text
    assert "no CUDA driver here (libcuda.so.1" in out.stderr, text


def test_an_image_builder_builds_with_criu_is_snapshotted_in_its_own_container(local_bases, tmp_path):
    """profiles.<name>.criu = true: the runtime image `builder build` makes carries CRIU (built from source on the
    devel base with the patch the data names, its libraries beside it) and `builder snapshot take IMAGE` runs that
    CRIU inside the image: the product's own image, not a test image, dumped and restored with the same answer.
    The engine is the stand-in (a TEST DOUBLE: no GPU here), built as a wheel from its local source by the pipeline."""
    from tests.helpers import HOST_CA, criu_matrix

    criu_matrix(tmp_path)
    built = builder("build", "--matrix", str(tmp_path / "matrix.toml"), "--wheelhouse", str(tmp_path / "wh"),
                    "--work-dir", str(tmp_path / "work"), "--log-dir", str(tmp_path / "logs"), "--pins-dir",
                    str(tmp_path / "pins"), "--ca-bundle", str(HOST_CA), "--no-smoke", "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (cell,) = json.loads(built.stdout)
    assert cell["cell"].endswith("-criu"), cell["cell"]  # another image than the cell without CRIU: its own id
    image = cell["image"]
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True,
                                        check=True).stdout)[0]
    assert inspect["Config"]["Labels"]["io.builder.criu"] == "4.1.1 (criu-4.1.1-sockopts-linux-6.16.patch)"
    linked = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c",
                             "criu --version && ldd /usr/local/sbin/criu"], capture_output=True, text=True)
    assert linked.returncode == 0 and "Version: 4.1.1" in linked.stdout and "not found" not in linked.stdout, \
        linked.stdout + linked.stderr
    assert "libprotobuf-c.so.1 => /opt/builder/criu/lib/" in linked.stdout  # its own, not a package of the image

    snap = tmp_path / "snap"
    took = builder("snapshot", "take", image, "--strategy", "MTP2", "--model", MODEL, "--out", str(snap), "--json",
                   "--matrix", str(tmp_path / "matrix.toml"), cwd=tmp_path)
    assert took.returncode == 0, took.stdout + took.stderr
    record = json.loads(took.stdout)
    assert json.loads((snap / "key.json").read_text())["criu"] == "4.1.1"
    restored = builder("snapshot", "restore", str(snap), "--json", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    result = json.loads(restored.stdout)
    try:
        assert result["answer"] == record["answer"] == complete(result["port"])
    finally:
        subprocess.run(["docker", "rm", "-f", result["container"]], capture_output=True)
    assert containers() == []
