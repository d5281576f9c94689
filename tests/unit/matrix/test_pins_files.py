"""Recorded pins files (builder/pins.py) are read line by line before a build uses them: a hash-locked file cut
short, or one carrying pip options, is refused naming the line; and every hash-locked pin is hash-checked by the
rendered pip command, an already installed one too (pip leaves a satisfied requirement unchecked without
--force-reinstall: shown here with real pip on a real wheel)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder import matrix as M
from builder import pins, plan as P, render as R, resolve
from builder.errors import UserError

from tests.helpers import MATRIX

H1, H2 = "a" * 64, "b" * 64
LOCKED = ("# Written by `builder build` from the first build of x; hash-locked requirements for the next ones.\n"
          f"anyio==4.16.0 --hash=sha256:{H1}\nidna==3.20 --hash=sha256:{H1} --hash=sha256:{H2}\n"
          f"nvidia-cutlass-dsl[cu13]==4.8.0 --hash=sha256:{H2}\n")
CONSTRAINTS = "# Written by `builder build`; constraints for the next ones (no hashes: no index).\nanyio==4.16.0\nidna==3.20\n"

BAD_PINS = {  # name: (file text, words of the refusal)
    "cut-mid-hash": (LOCKED[:-20], "ends in the middle of a line"),
    "cut-mid-hash-newline": (LOCKED[:-20] + "\n", "not a sha256"),
    "cut-after-name": (LOCKED.rsplit("\n", 2)[0] + "\nnvidia-cutlass-dsl[cu13]==4.8.0\n", "carries no --hash"),
    "header-only": (LOCKED.splitlines(keepends=True)[0], "holds no pin"),
    "announced-but-unhashed": (LOCKED.splitlines(keepends=True)[0] + "anyio==4.16.0\n", "announces hash-locked"),
    "empty": ("", "holds no pin"),
    "index-url": (LOCKED + "--index-url http://evil.example/simple\n", "pip option"),
    "extra-index-url": ("--extra-index-url=http://evil.example/simple\n" + LOCKED, "pip option"),
    "short-index": (CONSTRAINTS + "-i http://evil.example/simple\n", "pip option"),
    "requirement-file": (CONSTRAINTS + "-r /etc/other.txt\n", "pip option"),
    "constraint-file": (CONSTRAINTS + "-c other.txt\n", "pip option"),
    "editable": (CONSTRAINTS + "-e git+https://evil.example/x.git#egg=x\n", "pip option"),
    "find-links": (CONSTRAINTS + "--find-links /tmp/evil\n", "pip option"),
    "trusted-host": (CONSTRAINTS + "--trusted-host evil.example\n", "pip option"),
    "pre": (CONSTRAINTS + "--pre\n", "pip option"),
    "inline-option": (f"anyio==4.16.0 --hash=sha256:{H1} --config-settings=x=y\n", "pip option"),
    "inline-global": ("anyio==4.16.0 --global-option=build_ext\n", "pip option"),
    "url-pin": (CONSTRAINTS + "evil @ https://evil.example/evil-1.0.whl\n", "is not a pin"),
    "path-pin": (CONSTRAINTS + "/wheels/evil-1.0-py3-none-any.whl\n", "is not a pin"),
    "marker": (CONSTRAINTS + 'anyio==4.16.0; python_version < "3.13"\n', "is not a pin"),
    "range": (CONSTRAINTS + "anyio>=4\n", "is not a pin"),
    "continuation": (f"anyio==4.16.0 \\\n  --hash=sha256:{H1}\n", "is not a pin"),
    "bad-version": (CONSTRAINTS + "anyio==4.x.y\n", "not a version"),
    "md5": (f"anyio==4.16.0 --hash=md5:{'a' * 32}\n", "pip option"),
    "uppercase-hash": (f"anyio==4.16.0 --hash=sha256:{'A' * 64}\n", "not a sha256"),
    "mixed": (f"anyio==4.16.0 --hash=sha256:{H1}\nidna==3.20\n", "carries no --hash"),
    "nul": ("anyio==4.16.0\x00\n", "is not a pin"),
}


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(BAD_PINS))
def test_a_pins_file_cut_short_or_carrying_pip_options_is_refused_naming_the_line(name, tmp_path):
    text, words = BAD_PINS[name]
    path = tmp_path / "cell.txt"
    path.write_text(text)
    with pytest.raises(UserError) as exc:
        pins.read(path)
    assert words in str(exc.value) and str(path) in str(exc.value), str(exc.value)
    assert "--refresh-pins" in str(exc.value)


@pytest.mark.pure
def test_whole_pins_files_read_as_hash_locked_or_constraints(tmp_path):
    path = tmp_path / "cell.txt"
    path.write_text(LOCKED)
    assert pins.read(path) == (LOCKED, True)
    path.write_text(CONSTRAINTS)
    assert pins.read(path) == (CONSTRAINTS, False)
    with pytest.raises(UserError, match="build pins are hash-locked"):
        pins.read(path, need_hashes=True)


def _wheel(dest: Path, version: str) -> Path:
    info = f"hashpkg-{version}.dist-info"
    members = {"hashpkg/__init__.py": f"V = {version!r}\n", f"{info}/METADATA": f"Metadata-Version: 2.1\nName: hashpkg\nVersion: {version}\n",
               f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = dest / f"hashpkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in {**members, f"{info}/RECORD": "".join(f"{k},,\n" for k in members) + f"{info}/RECORD,,\n"}.items():
            z.writestr(k, v)
    return path


def _rendered_pip_installs() -> list[str]:
    """The hash-locked `pip install` commands of a rendered Dockerfile (runtime pins and build pins)."""
    m = M.load(MATRIX)
    cell = next(c for c in resolve.select(m, M.Selection(profiles=("all",))) if c.engine == "vllm")
    text = R.render(P.plan_cells([cell], None)[0], "https://pypi.org/simple")
    return re.findall(r"with-ca (pip install [^;\n\\]*--require-hashes[^;\n\\]*-r \S+)", text)


def test_the_rendered_hash_locked_installs_check_an_already_installed_pin_too(tmp_path):
    """In a venv that already holds hashpkg 1.0, a pins file naming hashpkg==1.0 with a wrong sha256 must stop
    each rendered command; without --force-reinstall pip says "already satisfied" and installs nothing."""
    commands = _rendered_pip_installs()
    assert len(commands) >= 2 and all("--force-reinstall" in c for c in commands), commands
    links = tmp_path / "links"
    links.mkdir()
    good = _wheel(links, "1.0")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--no-index", str(good)], check=True)
    wrong = tmp_path / "pins.txt"
    wrong.write_text(f"hashpkg==1.0 --hash=sha256:{'0' * 64}\n")
    right = tmp_path / "right.txt"
    right.write_text(f"hashpkg==1.0 --hash=sha256:{hashlib.sha256(good.read_bytes()).hexdigest()}\n")
    local = ["--no-index", "--find-links", str(links)]
    for command in commands:
        argv = shlex.split(command)[2:-2]  # the flags between `pip install` and `-r FILE`
        bad = subprocess.run([*pip, "install", *argv, *local, "-r", str(wrong)], capture_output=True, text=True)
        assert bad.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in bad.stdout + bad.stderr, command
        ok = subprocess.run([*pip, "install", *argv, *local, "-r", str(right)], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        unchecked = [a for a in argv if a != "--force-reinstall"]
        old = subprocess.run([*pip, "install", *unchecked, *local, "-r", str(wrong)], capture_output=True, text=True)
        assert old.returncode == 0 and "already satisfied" in old.stdout  # why the flag is there


@pytest.mark.pure
def test_a_pins_file_builder_wrote_without_pins_is_read_and_an_empty_one_without_its_header_is_refused(tmp_path):
    """An image whose packages are all the cell's own wheels gives a pins file of header lines only (the first
    build records the sha256 of no pin lines): the next build reads it; an empty file without that record, or
    whose record names pin lines it no longer has, was cut short."""
    empty = tmp_path / "empty.txt"
    empty.write_text("# Written by `builder build` from the first build of x; constraints for the next ones.\n"
                     + pins.origin_line("sha256:" + "a" * 64, "b" * 64, pins.lines_digest("")))
    assert pins.read(empty) == (empty.read_text(), False)
    cut = tmp_path / "cut.txt"
    cut.write_text("# Written by `builder build` from the first build of x; constraints for the next ones.\n"
                   + pins.origin_line("sha256:" + "a" * 64, "b" * 64, pins.lines_digest("torch==2.14.0\n")))
    for path in (cut, tmp_path / "bare.txt"):
        if not path.exists():
            path.write_text("# pins\n")
        with pytest.raises(UserError, match="holds no pin"):
            pins.read(path)


def _pure_wheel(dest: Path, name: str, requires: tuple[str, ...] = (), extras: tuple[str, ...] = ()) -> Path:
    """A py3-none-any wheel that pip installs, with its Requires-Dist and Provides-Extra."""
    di = f"{name}-1.0.dist-info"
    meta = (f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Provides-Extra: {e}\n" for e in extras)
            + "".join(f"Requires-Dist: {r}\n" for r in requires))
    path = dest / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{di}/METADATA", meta)
        zf.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{di}/RECORD", "")
    return path


def test_the_pins_of_a_resolve_come_from_pips_own_report_with_extras_and_the_files_it_took(tmp_path):
    """What the runtime-resolve stage exports is read as pip writes it: a real `pip install --dry-run --report`
    (local wheels, no index) and a real `pip inspect` of the venv the install starts from. Every distribution the
    runtime will hold is pinned, with the extra the closure asks of it and, with no index to ask, the sha256 of the
    very file pip took; a distribution already in the venv that the report cannot hash makes the pins versions
    only, and says why."""
    cell = resolve.select(M.load(MATRIX), M.Selection(engines=("vllm",)))[0]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _pure_wheel(wheels, "alpha", ("beta[fast]>=1",))
    _pure_wheel(wheels, "beta", ('gamma; extra == "fast"',), ("fast",))
    _pure_wheel(wheels, "gamma")
    _pure_wheel(wheels, "vllm")  # the cell's own wheel: never pinned from the index
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "--dry-run", "--quiet", "--ignore-installed", "--no-index", "--find-links",
                          str(wheels), "--report", str(tmp_path / "report.json"), "alpha", "vllm"], check=True)
    report = json.loads((tmp_path / "report.json").read_text())
    empty = tmp_path / "venv-site"
    empty.mkdir()
    venv = json.loads(subprocess.run(pip + ["inspect", "--path", str(empty)], capture_output=True, text=True,
                                     check=True).stdout)
    lines, why = pins.from_resolve(report, venv, cell, index_url=None)
    sha = {w.name.split("-")[0]: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels.iterdir()}
    assert (why, lines) == ("", [f"alpha==1.0 --hash=sha256:{sha['alpha']}", f"beta[fast]==1.0 --hash=sha256:{sha['beta']}",
                                 f"gamma==1.0 --hash=sha256:{sha['gamma']}"])
    text = pins.text_of(cell, lines, why)
    assert pins.hashed(text) and "hash-locked requirements for every build" in text
    # the same pins give the same file in the build context, whether just resolved or read back from the pins file
    pins.write(tmp_path / "pins.txt", pins.text_of(cell, lines, why, ("sha256:" + "a" * 64, "b" * 64)))
    back, locked = pins.read(tmp_path / "pins.txt")
    assert locked and pins.in_context(back, True, [("vllm.whl", "c" * 64)]) == pins.in_context(
        text, True, [("vllm.whl", "c" * 64)])
    # a distribution the venv holds already (pip's own tools) is pinned too; with no index and no file in the
    # report to hash it by, the pins are versions only, and say why
    held = dict(venv, installed=[{"metadata": {"name": "setuptools", "version": "80.9.0", "requires_dist": []}}])
    lines, why = pins.from_resolve(report, held, cell, index_url=None)
    assert lines == ["alpha==1.0", "beta[fast]==1.0", "gamma==1.0", "setuptools==80.9.0"] and why
    assert pins.in_context(pins.text_of(cell, lines, why), False, [])[1] == (
        "alpha==1.0\nbeta==1.0\ngamma==1.0\nsetuptools==80.9.0\n")  # constraints: no extras, no header
    with pytest.raises(Exception, match="no pip report"):
        pins.from_resolve({"install": []}, venv, cell)


@pytest.mark.pure
def test_pins_are_checked_against_the_installed_set():
    """The first build's image is checked against its pins before they are written: every installed
    distribution but the cell's own, at the pinned version, and nothing else (hashes on the lines are not part of
    the version)."""
    cell = resolve.select(M.load(MATRIX), M.Selection(engines=("vllm",)))[0]
    freeze = ("pip==26.1.2\nsetuptools==80.9.0\nwheel==0.45.1\nmodel-hosting-container-standards==0.1.16\n"
              "torch==2.14.0\nvllm==0.33.0\n")
    everything = [f"{l} --hash=sha256:{'d' * 64}" for l in freeze.split() if not l.startswith("vllm")]
    dists = [{"name": n, "version": v, "requires": []} for n, _, v in (l.partition("==") for l in freeze.split())]
    pins.complete(everything, {"env": {}, "dists": dists}, cell, "img")  # the cell's own vllm is not pinned: fine
    from builder.errors import BuilderError

    with pytest.raises(BuilderError, match=r"installed but not pinned: setuptools==80\.9\.0 \(no pins file written\)"):
        pins.complete([l for l in everything if not l.startswith("setuptools")], {"env": {}, "dists": dists}, cell, "img")
    with pytest.raises(BuilderError, match=r"installed but not pinned: wheel==0\.45\.1; pinned but not installed: "
                                           r"wheel==0\.44\.0"):
        pins.complete([l.replace("wheel==0.45.1", "wheel==0.44.0") for l in everything],
                      {"env": {}, "dists": dists}, cell, "img")
    with pytest.raises(BuilderError, match=r"pinned but not installed: gone==1\.0"):
        pins.complete(everything + ["gone==1.0"], {"env": {}, "dists": dists}, cell, "img")
