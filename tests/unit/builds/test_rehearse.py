"""`builder rehearse` on the fixture package: its real CUDA kernel (csrc/saxpy.cu) captured from its own build
command in its build stage and compiled there by nvcc 13.0, measured, audited and projected; and the failures a user
fixes, each from a real compiler run: nvcc killed for memory under a container limit, a GCC below the engine's
floor (measured in the stage), a header the stage lacks. The real engines' units are in test_rehearse_real.py."""

from __future__ import annotations

import io
import json
import logging
import shlex
import subprocess
from pathlib import Path

import pytest

from builder import rehearse

from tests.helpers import REPO


@pytest.mark.pure
def test_units_are_read_from_compile_commands_and_the_heaviest_per_binary_is_chosen(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = ("/usr/local/cuda/bin/nvcc -DX -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a "
           "--threads=2 -c /src/{} -o CMakeFiles/_C.dir/{}.o")
    entries = [{"directory": "/src/build", "file": f"/src/{f}", "output": f"CMakeFiles/_C.dir/{f}.o",
                "command": cmd.format(f, f)} for f in ("a.cu", "b.cu")]
    entries.append({"directory": "/src/build", "file": "/src/c.cpp", "output": "c.o", "command": "c++ -c c.cpp"})
    entries.append({"directory": "/src/build", "file": "/src/d.cu", "output": "CMakeFiles/_moe_C.dir/d.cu.o",
                    "command": '/usr/local/cuda/bin/nvcc "--generate-code=arch=compute_90,code=[compute_90,sm_90]" '
                               "-c /src/d.cu -o CMakeFiles/_moe_C.dir/d.cu.o"})
    (out / "compdb-0.json").write_text(json.dumps({"build_dir": "/src/build", "entries": entries}))
    units = rehearse.units_from_capture(out, "pkg")
    assert [(u.binary, u.sass, u.nvcc_threads) for u in units] == [
        ("_C", ("sm_80", "sm_90a"), 2), ("_C", ("sm_80", "sm_90a"), 2), ("_moe_C", ("sm_90",), 1)]
    assert units[0].output == "/src/build/CMakeFiles/_C.dir/a.cu.o"
    picked = rehearse.pick(units, size={"/src/a.cu": 1, "/src/b.cu": 9}.get)
    assert [u.source for u in picked] == ["/src/b.cu", "/src/d.cu"]
    assert [u.source for u in rehearse.pick(units, ("*/a.cu",), size={"/src/a.cu": 1, "/src/b.cu": 9}.get)] == [
        "/src/b.cu", "/src/d.cu", "/src/a.cu"]


@pytest.mark.pure
def test_a_compile_recorded_twice_is_one_unit(tmp_path):
    """flash-attn 2.8.3's capture records each of its 72 compiles twice through the recording nvcc (torch's ninja
    form, then setuptools' own, same object): the build compiles each once, so the units and the projection count
    it once; the first record is kept."""
    out = tmp_path / "out"
    out.mkdir()
    gencode = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    recs = []
    for f in ("a", "b"):
        recs.append({"cwd": "/src", "argv": ["nvcc", "-Iinc", "-c", f"csrc/{f}.cu", "-o", f"build/{f}.o", *gencode]})
        recs.append({"cwd": "/src", "argv": ["nvcc", "-DX", *gencode, "-c", "-o", f"/src/build/./{f}.o", f"csrc/{f}.cu"]})
    (out / "nvcc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    units = rehearse.units_from_capture(out, "pkg")
    assert [u.source for u in units] == ["csrc/a.cu", "csrc/b.cu"]
    assert all(u.command.startswith("nvcc -Iinc") for u in units)


class _FakeDocker:
    """subprocess.run and subprocess.Popen for a rehearsal without Docker: every argv recorded; the capture
    container writes a compile database, the compile container its measurement, `gcc -dumpfullversion` answers."""

    def __init__(self, out: Path):
        self.out, self.ran = out, []

    def run(self, argv, **kw):
        argv = list(argv)
        self.ran.append(argv)
        stdout = ""
        if argv[-1] == "-dumpfullversion":
            stdout = "12.2.0\n"
        elif argv[:2] == ["docker", "run"] and "--rm" not in argv:  # the capture
            cmd = ("/usr/local/cuda/bin/nvcc -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 "
                   "-c /src/k.cu -o /src/build/k.o")
            (self.out / "compdb-0.json").write_text(json.dumps({"build_dir": "/src/build", "entries": [
                {"directory": "/src/build", "file": "/src/k.cu", "output": "k.o", "command": cmd}]}))
        elif argv[:2] == ["docker", "run"]:  # a unit's compile
            (self.out / "unit-0.json").write_text(json.dumps({"returncode": 0, "seconds": 1.5, "peak_bytes": 2**27,
                                                              "cgroup_peak_bytes": None, "oom_kills": 0}))
        return subprocess.CompletedProcess(argv, 0, stdout, "")

    def popen(self, argv, **kw):
        fake = self

        class Proc:
            pid, returncode = 0, 0

            def __init__(self):
                fake.ran.append(list(argv))
                self.stdout = io.StringIO("#1 DONE 0.1s\n")

            def wait(self, timeout=None):
                return 0

            def communicate(self, timeout=None):
                return "", ""

        return Proc()


@pytest.mark.pure
def test_every_docker_command_of_a_rehearsal_goes_through_docker_py_and_is_logged(tmp_path, monkeypatch, caplog):
    """The stage's gcc, the capture (run, commit, rm), a unit's compile under a memory limit, the object cache's
    seeding and the images' removal: each a docker command line of builder/docker.py, logged (`builder --debug`)
    exactly as it runs."""
    from builder import docker

    work, sccache = tmp_path / "work", tmp_path / "sccache"
    (work / "out").mkdir(parents=True)
    sccache.mkdir()
    fake = _FakeDocker(work / "out")
    monkeypatch.setattr(subprocess, "run", fake.run)
    monkeypatch.setattr(subprocess, "Popen", fake.popen)
    caplog.set_level(logging.DEBUG, logger="builder.commands")
    stage = rehearse.BuildStage("", "build-pkg", "pip wheel .", cuda_home=True)

    assert rehearse.measured_gcc("stage:1") == "12.2.0"
    snapshot, units = rehearse.capture("stage:1", stage, work, {"MAX_JOBS": "2"}, "pkg")
    m = rehearse.compile_unit(snapshot, units[0], 0, work, {"MAX_JOBS": "2"}, True, sccache, memory=40 * 2**20)
    assert (m.ok, m.seconds, m.unit.sass) == (True, 1.5, ("sm_80", "sm_90"))
    rehearse.seed_object_cache(sccache, "stage:1", work, "ns")
    docker.remove_image(snapshot)

    logged = [r.getMessage() for r in caplog.records if r.name == "builder.commands"]
    assert logged == [f"$ {shlex.join(argv)}" for argv in fake.ran]
    assert [argv[:3] for argv in fake.ran] == [
        ["docker", "run", "--rm"], ["docker", "run", "--name"], ["docker", "commit", fake.ran[1][3]],
        ["docker", "rm", "-f"], ["docker", "run", "--rm"], ["docker", "buildx", "build"],
        ["docker", "image", "rm"]]
    gcc, capture, _, _, compile_, seed, _ = fake.ran
    assert gcc[-4:] == ["--entrypoint", "gcc", "stage:1", "-dumpfullversion"] and "none" in gcc
    programs = f"{rehearse.PROGRAMS}:{rehearse.PROGRAMS_DIR}:ro"
    for argv in (capture, compile_):  # the programs read-only, the rehearsal directory writable, no network
        assert programs in argv and f"{work}:{rehearse.REHEARSAL_DIR}" in argv
        assert argv[argv.index("--network") + 1] == "none" and "MAX_JOBS=2" in argv
    assert f"{rehearse.PROGRAMS_DIR}/capture_site.py" in capture[-1] and f"{rehearse.PROGRAMS_DIR}/nvcc.py" in capture[-1]
    assert compile_[compile_.index("--memory") + 1] == compile_[compile_.index("--memory-swap") + 1] == str(40 * 2**20)
    assert f"python3 {rehearse.PROGRAMS_DIR}/measure.py" in compile_[-1] and "SCCACHE_RECACHE=1" in compile_
    assert "SCCACHE_NAMESPACE=ns" in seed and "type=cacheonly" in seed and seed[-1] == str(sccache)


@pytest.mark.pure
def test_the_in_container_programs_ship_in_the_package():
    """capture_site.py, nvcc.py and measure.py are modules of a package setuptools finds (pyproject.toml's
    packages.find), so an installed builder has them to mount, as it has deploy/smoke/probe.py."""
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(REPO), include=config["packages"]["find"]["include"])
    assert "builder.rehearsal" in packages and "builder.deploy.smoke" in packages
    assert rehearse.PROGRAMS == REPO / "builder" / "rehearsal"
    assert sorted(p.name for p in rehearse.PROGRAMS.iterdir() if p.suffix == ".py") == [
        "__init__.py", "capture_site.py", "measure.py", "nvcc.py"]
    assert sorted(p.name for p in rehearse.PROGRAMS.iterdir() if p.is_file() and p.suffix != ".py") == []


def test_an_interrupt_during_the_capture_commit_leaves_nothing_unnamed(tmp_path, monkeypatch):
    """An interrupt that lands while the capture's container is committed: the snapshot's name is already in the
    list rehearse removes in its `finally`, so an interrupted rehearsal leaves no image (it left a 523 MB one)."""
    from builder import docker

    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    fake = _FakeDocker(work / "out")
    monkeypatch.setattr(subprocess, "run", fake.run)
    monkeypatch.setattr(subprocess, "Popen", fake.popen)
    committed = []

    def interrupted(name: str, snapshot: str, docker_bin: str = "docker") -> None:
        committed.append(snapshot)  # the daemon made the image; the interrupt arrives as the commit returns
        raise KeyboardInterrupt

    monkeypatch.setattr(docker, "commit_container", interrupted)
    made: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        rehearse.capture("stage:1", rehearse.BuildStage("", "build-pkg", "pip wheel .", cuda_home=True), work,
                         {"MAX_JOBS": "2"}, "pkg", made=made)
    assert committed and made == committed
