"""Hardening (issue 8): every input checked, every fault a clear message, nothing trusted that was not verified.

The bad inputs are a table (tests/hardening/cases.py, shared with benchmarks/hardening.py); each runs the real
CLI on a private copy of the cuda-ext fixture and must exit with its code, name the problem in its message,
print no traceback and write nothing. The faults below are real: a tmpfs that is full or read-only, a
docker daemon that is not there, SIGTERM / SIGINT sent to a build while BuildKit compiles.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from builder import docker, grammar
from builder.audit import audit
from builder.errors import UserError
from builder.globs import Glob
from builder.matrix import matches

from tests.hardening import cases as hc
from tests.helpers import REPO, run_cli

CASE_IDS = [c.id for c in hc.CASES]
IN_PROCESS = [c for c in hc.CASES if hc.runs_in_process(c)]
AS_A_PROCESS = [c for c in hc.CASES if not hc.runs_in_process(c)]


@pytest.mark.pure
def test_the_table_covers_every_class_and_verb_with_over_three_hundred_inputs():
    classes = {c.cls for c in hc.CASES}
    assert classes >= {"inject", "shape", "audit-corrupt", "audit-proof", "late", "fs", "selector", "wheels", "remote",
                       "smoke", "serve", "publish", "build", "repro", "lock", "audit", "doctor", "fine"}
    assert len(hc.CASES) >= 300 and len(set(CASE_IDS)) == len(CASE_IDS)
    verbs = {c.args[0] if c.args[0] != "wheels" else " ".join(c.args[:2]) for c in hc.CASES}
    assert verbs >= {"plan", "render", "build", "publish", "verify-repro", "serve", "smoke", "audit", "lock", "doctor",
                     "wheels prune", "wheels verify", "wheels ls", "wheels push", "wheels pull"}
    # the round-three inputs (bench, doctor --host, pins files, reuse, DOCKER_CONFIG, credentials, remotes), each
    # module its own: at least 300 new ones over those verbs and classes
    third = [c for c in hc.CASES if c.cls in {"bench", "bench-workload", "bench-diff", "bench-plot", "doctor-host", "pins",
                                              "reuse", "docker-config", "secret"}
             or c.id.startswith("r3-")]
    assert len(third) >= 300 and classes >= {"bench", "bench-workload", "bench-diff", "bench-plot", "doctor-host", "pins",
                                             "reuse", "docker-config", "secret"}
    # round six (tests/hardening/warm_serve.py): at least 300 new inputs over warm, serve --kubernetes, --tp and the
    # signing keys
    sixth = [c for c in hc.CASES if c.id.startswith("w6-")]
    assert len(sixth) >= 300 and {c.cls for c in sixth} >= {"warm", "warm-capture", "warm-resume", "warm-push",
                                                            "serve-kube", "serve-kube-image", "tp", "signing"}
    assert "warm" in verbs and len({tuple(c.args) for c in sixth}) >= 300
    # the table stays in the fast tier: only what runs as another user or must start a program (docker, a
    # credential helper, the nvidia-smi test double) leaves it
    assert len(AS_A_PROCESS) < 60 and all(c.as_nobody or c.needs_programs for c in AS_A_PROCESS)


@pytest.mark.pure
@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_bad_input_is_refused_clearly_and_writes_nothing(case):
    """In-process through builder.cli:main: a case that starts any program before it answers fails here
    (run_in_process refuses and records it, and the pure guard stands behind it)."""
    verdict, left = hc.check_case(case, in_process=True)
    assert verdict.clear, verdict.why
    assert not left, f"left behind: {left}"


@pytest.mark.parametrize("case", AS_A_PROCESS, ids=[c.id for c in AS_A_PROCESS])
def test_bad_input_as_another_user_or_needing_docker_is_refused_clearly_and_writes_nothing(case):
    """The cases run as uid 65534 or that answer only after starting docker / skopeo: the real entry point
    (`python -m builder.cli`) in its own process, judged the same way."""
    verdict, left = hc.check_case(case)
    assert verdict.clear, verdict.why
    assert not left, f"left behind: {left}"


@pytest.mark.pure
def test_the_in_process_run_refuses_and_records_a_program_it_starts(tmp_path):
    """What would let a docker call before a refusal slip through in-process: the runner itself refuses it."""
    case = hc.Case("probe-docker", "fine", ["audit", "example/some:image", "--arch", "80"], code=3)
    res = hc.run_in_process(case, hc.make_fixture(tmp_path, case))
    assert res.calls and res.calls[0].startswith("docker "), res.calls
    verdict = hc.judge(case, res, {}, {})
    assert not verdict.clear and "before refusing" in verdict.why


@pytest.mark.pure
def test_case_modules_beside_the_table_plug_in_without_an_edit(tmp_path):
    """A tests/hardening/*.py module with its own CASES joins the table (here one in a temp dir)."""
    import sys
    import uuid

    stem = f"hardening_cases_plugin{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{stem}.py").write_text(
        "from tests.hardening.cases import PLAN, Case\n\n"
        "CASES = [Case('plugin-base-newline', 'plugin', [*PLAN, '--base-devel', 'a\\nb'], expect=('--base-devel',))]\n")
    try:
        (case,) = hc.plugged_in(tmp_path)
        assert case.id == "plugin-base-newline" and isinstance(case, hc.Case)
        verdict, left = hc.check_case(case, in_process=True)
        assert verdict.clear and not left, verdict.why
        (tmp_path / "hardening_cases_zbroken.py").write_text("CASES = ['not a case']\n")
        with pytest.raises(TypeError, match="hardening_cases_zbroken.py: CASES must be a list"):
            hc.plugged_in(tmp_path)
    finally:
        for name in [n for n in sys.modules if n.endswith((stem, "hardening_cases_zbroken"))]:
            del sys.modules[name]


@pytest.mark.docker
def test_no_refused_input_ever_tagged_an_image():
    """Every case's cells live under a registry prefix of their own: no image may exist there. It asks for no Docker
    fixture, so scripts/test's scheduler runs it on the worker that ran the cases above, after them."""
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}"], capture_output=True, text=True, check=True)
    assert not [r for r in out.stdout.splitlines() if r.startswith(hc.REGISTRY)]


# -- 1. what is rendered cannot start a new instruction, and buildx's CSV options stay one value -----------------

@pytest.mark.pure
def test_a_value_that_skipped_a_check_is_still_refused_by_render(tmp_path):
    """The render guard: a newline anywhere in the render context is refused, naming where it is."""
    import dataclasses

    from builder import matrix, plan, render, resolve

    m = matrix.load(hc.make_fixture(tmp_path) / "fx" / "matrix.toml")
    (p,) = plan.plan_cells(resolve.select(m, matrix.Selection()), None)
    bad = dataclasses.replace(p, cell=dataclasses.replace(p.cell, base_devel="debian\nRUN id"))
    with pytest.raises(UserError, match=r"refusing to render .*context\.cell\.base_devel.*newline"):
        render.render(bad, m.defaults["index"])
    assert "RUN id" not in render.render(p, m.defaults["index"])


@pytest.mark.pure
def test_csv_options_keep_a_hostile_path_one_value():
    assert docker.csv_options(type="local", dest="/w/a") == "type=local,dest=/w/a"
    assert docker.csv_options(type="local", dest="/w,dest=/etc") == 'type=local,"dest=/w,dest=/etc"'
    assert docker.csv_options(id="ca", src='/a"b') == 'id=ca,"src=/a""b"'
    with pytest.raises(ValueError, match="newline"):
        docker.csv_options(dest="/a\nb")


def test_a_work_dir_with_a_comma_and_dest_keeps_the_wheel_inside_it(docker_engine, tmp_path):
    """Real buildx: an output dir named `out,dest=<elsewhere>` receives the export; <elsewhere> gets nothing
    (unquoted, buildx would read a second dest= and write there). A named context with a comma works too."""
    ctx, named = tmp_path / "ctx", tmp_path / "named,ctx"
    ctx.mkdir()
    named.mkdir()
    (ctx / "f.txt").write_text("from the context")
    (named / "g.txt").write_text("from the named context")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY f.txt /\nCOPY --from=other g.txt /\n")
    elsewhere = tmp_path / "elsewhere"
    out = tmp_path / f"work,dest={elsewhere}"
    call = docker.BuildxCall(dockerfile=ctx / "Dockerfile", context=ctx, target="",
                             output=docker.csv_options(type="local", dest=out), contexts=(("other", str(named)),))
    argv = [a for a in call.argv() if a not in ("--target", "")]
    res = subprocess.run(argv, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (out / "f.txt").read_text() == "from the context" and (out / "g.txt").is_file()
    assert not elsewhere.exists()


def test_dry_run_quotes_a_work_dir_holding_a_comma(tmp_path):
    tmp = hc.make_fixture(tmp_path)
    work = tmp / "a,dest=/tmp/elsewhere"
    res = run_cli("build", "--matrix", str(tmp / "fx" / "matrix.toml"), "--work-dir", str(work), "--wheelhouse",
                  str(tmp / "wh"), "--dry-run", cwd=tmp)
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if "--target wheels-cuda-ext" in l)
    assert f"--output 'type=local,\"dest={work}/" in line
    assert not work.exists()


@pytest.mark.pure
@pytest.mark.parametrize("rule, value", [
    (grammar.image_ref, "nvidia/cuda:13.0.3-devel-ubuntu24.04"),
    (grammar.image_ref, "127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90"),
    (grammar.image_ref, "localhost:5000/a/b@sha256:" + "a" * 64),
    (grammar.image_ref, "[::1]:5000/x:y"),
    (grammar.image_name, "mirror.example.com/nvidia/cuda"),
    (grammar.url, "https://pypi.org/simple"),
    (grammar.url, "http://127.0.0.1:8080/simple/"),
    (grammar.registry_host, "127.0.0.1:5000"),
    (grammar.registry_host, "registry.example.com"),
    (grammar.os_tag, "ubuntu24.04"),
    (grammar.version, "0.6.3.post1"),
    (grammar.git_url, "https://github.com/sgl-project/sglang"),
    (grammar.git_url, "/srv/git/repo.git"),
])
def test_the_grammars_accept_what_real_configurations_use(rule, value):
    assert rule(value) == value


# -- 3 / 4. the audit: corrupt input is an error, and nothing proven is not OK -------------------------------

@pytest.mark.pure
def test_audit_allows_a_pure_python_target_only_when_asked(tmp_path):
    hc.wheel({"p/__init__.py": b""})(tmp_path / "p-1.0-py3-none-any.whl")
    plain = run_cli("audit", str(tmp_path / "p-1.0-py3-none-any.whl"), "--arch", "80")
    assert plain.exit_code == 1 and "NOTHING PROVEN" in plain.output and "OK:" not in plain.output
    allowed = run_cli("audit", str(tmp_path / "p-1.0-py3-none-any.whl"), "--arch", "80", "--allow-no-device-code")
    assert allowed.exit_code == 0, allowed.output
    as_json = run_cli("audit", str(tmp_path), "--arch", "80", "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.output.split("\nerror:")[0])["proven"] is False


@pytest.mark.pure
def test_a_wheel_whose_library_fails_its_crc_is_an_error_in_the_report(tmp_path):
    whl = tmp_path / "bad-1.0-py3-none-any.whl"
    hc.wheel({"bad/_C.so": hc.HOST_ELF * 4}, corrupt=True)(whl)
    report = audit(whl, [80])
    (b,) = report.binaries
    assert not report.ok and b.status == "ERROR" and report.errors == [b]
    assert "bad/_C.so" in b.error and ("CRC" in b.error or "decompress" in b.error)


# -- 6. filesystem faults: refused up front, or the cell fails with the path and the OS error ----------------

@pytest.fixture
def tmpfs(tmp_path):
    """A real tmpfs of 1 MiB (full soon) mounted for the test, unmounted after."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert res.returncode == 0, f"mounting a tmpfs failed (tests run as root on the CI machines): {res.stderr}"
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_read_only_wheelhouse_is_refused_before_anything_runs(tmpfs, tmp_path):
    tmp = hc.make_fixture(tmp_path / "t")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    res = subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(tmp / "fx" / "matrix.toml"),
                          "--wheelhouse", str(tmpfs / "wh"), "--work-dir", str(tmp / "w"), "--log-dir", str(tmp / "l"),
                          "--pins-dir", str(tmp / "p")], capture_output=True, text=True, cwd=tmp)
    assert res.returncode == 2, res.stderr
    assert f"--wheelhouse: cannot write to {tmpfs / 'wh'} (in {tmpfs}): Read-only file system" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp / "w").exists() and not (tmp / "l").exists()


def test_a_disk_that_fills_during_the_cache_store_fails_the_cell_with_the_path(tmpfs, local_bases, tmp_path):
    """A real build of the fixture whose wheelhouse is a tmpfs with no free block left: the up-front check
    passes (an empty file still fits), the compile and audit run, the store hits ENOSPC. The cell fails naming
    the path and the OS error, the closing table is printed, nothing is tagged, no entry is left."""
    tmp = hc.make_fixture(tmp_path / "t")
    subprocess.run(["dd", "if=/dev/zero", f"of={tmpfs / 'filler'}", "bs=64k"], capture_output=True)  # until ENOSPC
    ref = f"{hc.REGISTRY}/cuda-ext:1.0.0-cu130-py311-sm80.90"
    res = subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(tmp / "fx" / "matrix.toml"),
                          "--wheelhouse", str(tmpfs / "wh"), "--work-dir", str(tmp / "w"), "--log-dir", str(tmp / "l"),
                          "--pins-dir", str(tmp / "p"), "--ca-bundle", str(hc.HOST_CA), "--quiet"],
                         capture_output=True, text=True, cwd=tmp)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "No space left on device" in res.stdout and str(tmpfs / "wh") in res.stdout, res.stdout
    assert re.search(r"cuda-ext-1\.0\.0-cu130-py311-sm80\.90\s+FAILED.*\(not tagged\)", res.stdout)
    assert "Traceback" not in res.stdout + res.stderr
    assert subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0
    assert not list((tmpfs / "wh").rglob("*.whl")) if (tmpfs / "wh").exists() else True


@pytest.mark.pure
def test_a_work_dir_that_turns_into_a_file_fails_the_cell_not_the_run(tmp_path):
    """A fault after the up-front checks (the work dir's cell dir replaced by a file): the cell fails with the
    path and the OS error, with a closing table, instead of a traceback."""
    from builder import matrix, plan, report, resolve, runner
    from builder.cache.local import Wheelhouse
    from builder.resources import Host
    from builder.steps import BuildOptions

    from tests.helpers import FakeCompile, FakeImage

    tmp = hc.make_fixture(tmp_path / "t")
    m = matrix.load(tmp / "fx" / "matrix-two.toml")
    wh = Wheelhouse(tmp / "wh")
    plans = plan.plan_cells(resolve.select(m, matrix.Selection()), wh)
    (tmp / "work").mkdir()
    (tmp / "work" / plans[0].cell.id).write_text("a file where the cell's directory goes")
    opts = BuildOptions(work_dir=tmp / "work", log_dir=tmp / "logs", index_url="https://pypi.org/simple", keep_going=True)
    first, second = runner.run_cells(plans, wh, opts, lambda s: None, Host(cores=2, free_gb=16.0),
                                     steps=(FakeCompile(), FakeImage()))
    assert not first.ok and first.results[0].step == "prepare"
    assert f"{tmp / 'work' / plans[0].cell.id}" in first.error and "Not a directory" in first.error
    assert second.results and second.results[0].step == "compile"  # --keep-going: the next cell ran
    assert "cannot prepare the cell" in report.format_table([first, second], 2)


# -- 7. signals: a real build interrupted by SIGTERM / SIGINT ---------------------------------------------------

SLOW_SETUP = '''
import os, subprocess, time
from setuptools import setup
# the "compile": a process with a unique name BuildKit runs inside the build, for the test to find and wait on
subprocess.run(["sleep", "{marker}"])
setup(name="sleeper", version="1.0.0", py_modules=[])
'''

SLOW_KNOWLEDGE = '''
[packages.sleeper]
pypi = "sleeper"
kind = "engine"
template = "pip-wheel"
torch_pin = "none"
mem_gb_per_nvcc_thread = 1.0

[[packages.sleeper.rules]]
versions = ">=1.0"
source = "local"
source_subdir = "src"
min_cuda = "12.0"
launch = ["python", "-c", "pass"]
'''


def _processes() -> list[tuple[int, str]]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError):
                continue
            out.append((int(entry), cmd))
    return out


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


# SIGTERM: slow (a second interrupted compile); the default tier interrupts with SIGINT
@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGTERM, 143, id="SIGTERM", marks=pytest.mark.slow),
                                       pytest.param(signal.SIGINT, 130, id="SIGINT")])
def test_a_signal_stops_the_buildx_child_and_its_compile_and_says_what_was_interrupted(sig, code, local_bases, tmp_path):
    """A real build on the local bases whose compile step runs `sleep <unique>` inside BuildKit. The signal
    goes to builder only (as `timeout` or a CI runner sends it); builder forwards it to buildx's process group,
    waits, prints the table naming the interrupted step, and exits 128 + the signal. Afterwards no docker /
    buildx process of this build is left, and BuildKit stopped the compile itself."""
    marker = f"{9000 + uuid.uuid4().int % 999}.{uuid.uuid4().int % 10**6:06d}"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "setup.py").write_text(SLOW_SETUP.replace("{marker}", marker))
    (tmp_path / "engines.toml").write_text(SLOW_KNOWLEDGE)
    (tmp_path / "matrix.toml").write_text(
        (hc.FIXTURE / "matrix.toml").read_text().replace("cuda-ext", "sleeper").replace("builder-test", f"hardening-{hc.RUN_ID}"))
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "build", "--matrix", str(tmp_path / "matrix.toml"),
                             "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(work), "--log-dir", str(tmp_path / "logs"),
                             "--pins-dir", str(tmp_path / "pins"), "--ca-bundle", str(hc.HOST_CA), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        _wait_for(lambda: [p for p, cmd in _processes() if cmd.startswith(f"sleep {marker}")], 600,
                  "the compile step to start inside BuildKit")
        ours = lambda: [(p, c) for p, c in _processes() if "buildx" in c and str(work) in c]  # noqa: E731
        assert ours(), "the docker buildx child is running"
        proc.send_signal(sig)  # to builder alone, not its process group
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, stdout + stderr
    name = signal.Signals(sig).name
    assert f"interrupted by {name} during compile of sleeper: stopped docker buildx build ... --target wheels-sleeper" in stderr
    assert re.search(r"exited [\d.]+s after SIGINT|killed after", stderr), stderr
    assert "Traceback" not in stdout + stderr
    assert "sleeper-1.0.0-cu130-py311-sm80.90" in stdout and "FAILED" in stdout and "(not tagged)" in stdout  # the table
    assert not ours(), f"buildx processes left behind: {ours()}"
    _wait_for(lambda: not [p for p, cmd in _processes() if cmd.startswith(f"sleep {marker}")], 60,
              "BuildKit to stop the interrupted compile")
    assert not list((tmp_path / "wh").rglob("*.whl")) if (tmp_path / "wh").exists() else True
    log = next((tmp_path / "logs").glob("*.log")).read_text()
    assert "# interrupted: stopped docker buildx build" in log


def test_a_signal_outside_a_build_step_is_exit_143_with_one_line_and_writes_nothing(tmp_path):
    """`builder lock` waiting on an index that accepts and never answers (a socket on 127.0.0.1): SIGTERM
    ends it at once with exit 143 and one line, no traceback, and matrix.lock is not rewritten."""
    import shutil
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(1)), daemon=True).start()
    shutil.copy(REPO / "matrix.toml", tmp_path / "matrix.toml")
    shutil.copy(REPO / "matrix.lock", tmp_path / "matrix.lock")
    before = (tmp_path / "matrix.lock").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "lock", "--matrix", str(tmp_path / "matrix.toml"),
                             "--profile", "cu130", "--engine", "vllm", "--index", f"http://127.0.0.1:{server.getsockname()[1]}/simple"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO), "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"})
    try:
        _wait_for(lambda: held, 60, "lock to connect to the index")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.close()
    assert proc.returncode == 143, out + err
    assert time.monotonic() - t0 < 10
    assert err.strip().splitlines() == ["error: interrupted by SIGTERM"], err
    assert (tmp_path / "matrix.lock").read_bytes() == before


def test_label_and_env_values_are_escaped_for_the_dockerfile_parser(docker_engine, tmp_path):
    """What render writes inside LABEL k="..." / ENV K="...": BuildKit reads back exactly the value."""
    from builder.render import dockerfile_quoted

    value = 'a "quoted" \\ back$slash ${HOME}'
    (tmp_path / "Dockerfile").write_text(
        f'FROM scratch\nLABEL io.test="{dockerfile_quoted(value)}"\nENV T="{dockerfile_quoted("x $y", expand=True)}"\n')
    tag = f"builder-hardening-label:{uuid.uuid4().hex[:12]}"
    res = subprocess.run(["docker", "buildx", "build", "-q", "--load", "-t", tag, str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    try:
        labels = json.loads(subprocess.run(["docker", "image", "inspect", tag, "--format", "{{json .Config.Labels}}"],
                                           capture_output=True, text=True, check=True).stdout)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    assert labels["io.test"] == value


# -- 8. selectors ------------------------------------------------------------------------------------------------

@pytest.mark.pure
def test_globs_with_many_brace_groups_match_in_linear_time():
    pattern = "vllm-" + "{0,1}" * 22 + "*"
    t0 = time.monotonic()
    assert not Glob(pattern).match("vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90")
    assert Glob("*" + "{a,b}" * 22 + "*").match("x" + "ab" * 11 + "y")
    assert not Glob("*a" * 40 + "b").match("a" * 200)  # a backtracking matcher takes forever here
    assert time.monotonic() - t0 < 1.0


@pytest.mark.pure
@pytest.mark.parametrize("pattern, cell, hit", [
    ("vllm-*", "vllm-0.33.0-cu130", True),
    ("*-{cu121,cu130}-*", "vllm-0.33.0-cu130-x", True),
    ("*-{cu121,cu130}-*", "vllm-0.33.0-cu124-x", False),
    ("{vllm,sglang-{0.3,0.5}*}-*", "sglang-0.5.23-cu130", True),
    ("{vllm,sglang-{0.3,0.5}*}-*", "sglang-0.4.0-cu130", False),
    ("v?lm-[0-9]*", "vllm-0.33.0", True),
    ("v?lm-[!0-9]*", "vllm-0.33.0", False),
    ("{,x}vllm", "vllm", True),
    ("[", "[", True),
])
def test_globs_mean_what_fnmatch_with_braces_means(pattern, cell, hit):
    assert matches(cell, (pattern,)) is hit


# -- reproducible wheels by default ------------------------------------------------------------------------------

def test_plan_says_where_source_date_epoch_comes_from(tmp_path):
    tmp = hc.make_fixture(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    plan = lambda *a, **kw: subprocess.run([sys.executable, "-m", "builder.cli", "plan", *a], capture_output=True,  # noqa: E731
                                           text=True, cwd=tmp, env={**env, **kw})
    outside_git = plan("--matrix", str(tmp / "fx" / "matrix.toml"))
    assert "SOURCE_DATE_EPOCH=315532800 for every build (reproducible wheels), from a fixed default" in outside_git.stdout
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example", "GIT_COMMITTER_DATE": "@1650000000 +0000", "GIT_AUTHOR_DATE": "@1650000000 +0000"}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "fixture"]):
        subprocess.run(["git", "-C", str(tmp / "fx"), *argv], check=True, env={**env, **git}, capture_output=True)
    in_repo = plan("--matrix", str(tmp / "fx" / "matrix.toml"))
    assert "SOURCE_DATE_EPOCH=1650000000 for every build (reproducible wheels), from the last commit" in in_repo.stdout
    m = tmp / "fx" / "matrix.toml"
    m.write_text(m.read_text().replace("[defaults]\n", "[defaults]\nsource_date_epoch = 1700000000\n"))
    from_matrix = plan("--matrix", str(m), "--json")
    assert json.loads(from_matrix.stdout)["source_date_epoch"] == {"value": 1700000000,
                                                                   "from": "defaults.source_date_epoch in matrix.toml"}
    from_env = plan("--matrix", str(m), SOURCE_DATE_EPOCH="1600000000")
    assert "SOURCE_DATE_EPOCH=1600000000 for every build (reproducible wheels), from the SOURCE_DATE_EPOCH environment" in from_env.stdout


def test_build_passes_the_epoch_to_every_buildx_call(tmp_path):
    tmp = hc.make_fixture(tmp_path)
    m = tmp / "fx" / "matrix.toml"
    m.write_text(m.read_text().replace("[defaults]\n", "[defaults]\nsource_date_epoch = 1700000000\n"))
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    res = subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(m), "--dry-run",
                          "--wheelhouse", str(tmp / "wh"), "--work-dir", str(tmp / "w")], capture_output=True, text=True,
                         cwd=tmp, env=env)
    lines = [l for l in res.stdout.splitlines() if l.startswith("docker buildx build")]
    assert len(lines) == 3 and all("--build-arg SOURCE_DATE_EPOCH=1700000000" in l for l in lines), res.stdout + res.stderr


# slow: two full compiles; the default tier holds reproducibility in tests/docker/project/test_infra.py (identical
# digests) and tests/docker/image/test_repro.py (nvcc objects)
@pytest.mark.slow
def test_two_compiles_of_the_same_sources_give_the_same_wheel_bytes(local_bases, tmp_path):
    """The wheel stage compiled twice (different --max-jobs: BuildKit cannot reuse the first compile) into two
    empty wheelhouses, SOURCE_DATE_EPOCH from the matrix: byte-identical wheels, zip timestamps included."""
    tmp = hc.make_fixture(tmp_path)
    m = tmp / "fx" / "matrix.toml"
    registry = f"127.0.0.1:5000/hardening-repro-{uuid.uuid4().hex[:10]}"  # its own: this test does tag an image
    m.write_text(m.read_text().replace("[defaults]\n", f"[defaults]\nsource_date_epoch = {1_700_000_000 + uuid.uuid4().int % 10**6}\n")
                 .replace(hc.REGISTRY, registry))
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    digests = []
    tagged = [f"{registry}/cuda-ext:1.0.0-cu130-py311-sm80"]
    try:
        _build_twice(tmp, m, env, digests)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", *tagged], capture_output=True)
    assert digests[0] == digests[1], _zip_differences(*(next((tmp / f"wh{j}").rglob("*.whl")) for j in ("1", "2")))


def _build_twice(tmp: Path, m: Path, env: dict, digests: list) -> None:
    for jobs in ("1", "2"):
        res = subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(m), "--arch", "80",
                              "--wheelhouse", str(tmp / f"wh{jobs}"), "--work-dir", str(tmp / f"w{jobs}"),
                              "--log-dir", str(tmp / f"l{jobs}"), "--pins-dir", str(tmp / f"p{jobs}"), "--max-jobs", jobs,
                              "--ca-bundle", str(hc.HOST_CA), "--quiet", "--json", "--no-smoke"],
                             capture_output=True, text=True, cwd=tmp, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        (cell,) = json.loads(res.stdout)
        compile_ = next(s for s in cell["steps"] if s["step"] == "compile")
        assert compile_["artifacts"]["reused"] is False
        digests.append(compile_["artifacts"]["wheels"])


def _zip_differences(a: Path, b: Path) -> str:
    """Which members of two wheels differ, and how (content, timestamp, order): what a mismatch is made of."""
    import zipfile

    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia, ib = za.infolist(), zb.infolist()
        out = [] if [i.filename for i in ia] == [i.filename for i in ib] else \
            [f"member order/names: {[i.filename for i in ia]} vs {[i.filename for i in ib]}"]
        for x in ia:
            y = next((i for i in ib if i.filename == x.filename), None)
            if y is None:
                continue
            for attr in ("CRC", "date_time", "external_attr", "compress_type", "file_size"):
                if getattr(x, attr) != getattr(y, attr):
                    out.append(f"{x.filename}: {attr} {getattr(x, attr)} vs {getattr(y, attr)}")
    return "wheels differ: " + ("; ".join(out) or "only in the zip structure")


# -- issue 34: every number and path flag of every verb, and the helper scripts' inputs ----------------------------
from tests.hardening import inputs as inputs4  # noqa: E402 (its CASES are in hc.CASES already: plugged in)


@pytest.mark.pure
def test_every_number_and_path_flag_of_every_verb_has_its_cases():
    """The generated cases come from click's command tree: each number flag has inf/-inf/nan/1e400/1e20, each
    path flag a FIFO, a symlink loop, a socket and a device; a flag added later is covered by its type."""
    ids = {c.id for c in hc.CASES}
    params = inputs4.generated_params()
    assert len(params) >= 70 and {"number", "path"} == {kind for *_, kind in params}
    for path, flag, kind in params:
        stem = f"i4-{'num' if kind == 'number' else 'path'}-{'-'.join(path)}-{flag.lstrip('-').lower()}"
        wanted = ("inf", "neg-inf", "nan", "1e400", "1e20") if kind == "number" else ("fifo", "loop", "socket", "device")
        assert {f"{stem}-{w}" for w in wanted} <= ids, (path, flag)
    assert len(inputs4.CASES) + len(inputs4.SCRIPT_CASES) >= 150
    assert {c.script for c in inputs4.SCRIPT_CASES} == set(inputs4.SCRIPTS)


def test_no_flag_is_an_unbounded_number_or_an_unchecked_path():
    """Every number flag is flags.Number (bounded, finite) and every path flag flags.FsPath (no FIFO, socket, device
    or symlink loop): a flag declared with click's plain int, float or Path would escape the generated cases above."""
    import click

    from builder.cli import flags
    from builder.cli.app import main

    def walk(cmd, path=()):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, path + (name,))

    plain = [f"{' '.join(path)} {p.opts[0] if p.opts else p.name}" for path, cmd in walk(main) for p in cmd.params
             if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType, click.File))
             or (isinstance(p.type, click.Path) and not isinstance(p.type, flags.FsPath))]
    assert plain == []


@pytest.mark.parametrize("case", inputs4.SCRIPT_CASES, ids=[c.id for c in inputs4.SCRIPT_CASES])
def test_a_helper_script_refuses_bad_input_in_one_line_and_leaves_nothing_half_done(case):
    """scripts/gpu-host-run, gpu-host-bundle and gen-reference, in-process from a private copy: the exit code,
    one `error: ` line naming the problem, no traceback, no hang, nothing half-done (an earlier bundle, install
    or page left as it was)."""
    verdict = inputs4.check_script(case)
    assert verdict.verdict == "clear", verdict.why
