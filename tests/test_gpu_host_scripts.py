"""The GPU-host route as scripts: scripts/gpu-host-bundle (repacks the engine wheel without the members a spec
strips, checks the set's requirements against each other, splits one tar into parts with SHA256SUMS) and
scripts/gpu-host-run (joins the parts that arrived over several calls, checks every sha256, installs, writes
the interpreter wrapper). Exercised here on small wheels made in the test; no network."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from .helpers import REPO


def load(script: str):
    loader = importlib.machinery.SourceFileLoader(script.replace("-", "_"), str(REPO / "scripts" / script))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def wheel(dest: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {**files, f"{info}/METADATA": meta, f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in members) + f"{info}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in {**members, f"{info}/RECORD": record}.items():
            z.writestr(k, v)
    return path


def test_repack_leaves_out_the_stripped_members_and_their_record_lines(tmp_path):
    bundle = load("gpu-host-bundle")
    w = wheel(tmp_path, "eng", "1.0", {"eng/__init__.py": "", "eng/_fa2_C.abi3.so": "x" * 1000, "eng/keep.so": "y"})
    (tmp_path / "out").mkdir()
    out, removed = bundle.repack(w, ["eng/_fa2_C*.so"], tmp_path / "out")
    assert removed == ["eng/_fa2_C.abi3.so"]
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        record = z.read("eng-1.0.dist-info/RECORD").decode()
    assert "eng/_fa2_C.abi3.so" not in names and "eng/keep.so" in names
    assert "_fa2_C" not in record and "eng/keep.so" in record


def test_the_bundle_refuses_a_wheel_set_whose_requirements_do_not_hold(tmp_path):
    bundle = load("gpu-host-bundle")
    a = wheel(tmp_path, "aaa", "1.0", {"aaa/__init__.py": ""}, ("bbb>=2", "ccc>=9; python_version < '3.0'"))
    b = wheel(tmp_path, "bbb", "1.5", {"bbb/__init__.py": ""})
    assert bundle.conflicts([a, b], "3.12") == [f"{a.name} requires bbb>=2, the bundle has bbb 1.5"]
    b2 = wheel(tmp_path, "bbb", "2.1", {"bbb/__init__.py": ""})
    assert bundle.conflicts([a, b2], "3.12") == []


def test_run_joins_parts_from_several_calls_checks_every_sha256_and_installs(tmp_path):
    store = tmp_path / "store"
    name = "unit-bundle-test"
    w = wheel(tmp_path, "purepkg", "1.0", {"purepkg/__init__.py": "VALUE = 42\n"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(w, arcname=f"wheels/{w.name}")
    blob = buf.getvalue()
    parts_dir = store / name
    parts_dir.mkdir(parents=True)
    sums = [f"{hashlib.sha256(blob).hexdigest()}  bundle.tar"]
    size = len(blob) // 3 + 1
    for i in range(0, len(blob), size):  # as if stashed by earlier calls
        p = parts_dir / f"part-{i // size:02d}"
        p.write_bytes(blob[i:i + size])
        sums.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}")
    (parts_dir / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    env = {**os.environ, "BUILDER_CARRY_STORE": str(store)}
    run = lambda: subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-host-run"), "install", name],
                                 capture_output=True, text=True, env=env, timeout=300)
    good = (parts_dir / "part-01").read_bytes()
    (parts_dir / "part-01").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    bad = run()
    assert bad.returncode != 0 and "part-01: sha256 differs" in bad.stderr
    (parts_dir / "part-01").write_bytes(good)
    (parts_dir / "part-02").unlink()
    missing = run()
    assert missing.returncode != 0 and "parts part-02 have not arrived" in missing.stderr
    (parts_dir / "part-02").write_bytes(blob[2 * size:])
    ok = run()
    assert ok.returncode == 0, ok.stderr
    py = store / f"py-{name}"
    out = subprocess.run([str(py), "-c", "import purepkg; print(purepkg.VALUE)"], capture_output=True, text=True)
    assert out.stdout.strip() == "42", out.stderr
