"""The runtime installs the engine with the extras serving needs, from the compiled wheel and not from the index.

SGLang 0.3.2's wheel alone lacks its server dependencies (extra `srt`: fastapi, uvicorn, zmq, vllm==0.5.5, ...).
pip offers three spellings, and only one is sure to install the compiled wheel with its extras; this test runs it with
pip itself, offline, on stand-in wheels: an "index" copy of sglang 0.3.2 and the "compiled" one in /wheels.

- `sglang[srt]` with the wheel directory as --find-links: pip may take the index's sglang 0.3.2 (the same
  version), depending on link order;
- `sglang[srt]` next to the wheel file: refused as ResolutionImpossible by pip 23.2 in one setup here, accepted
  in another (pip's handling of a named requirement beside an explicit file has changed between releases);
- the wheel file itself with the extra, as the rendered runtime stage writes it: the file is the only candidate,
  with its extra, in every case. That is what this test runs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder import plan, render
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX


def _wheel(directory: Path, name: str, version: str, marker: str, extra: str = "", extra_req: str = "") -> Path:
    """A minimal pure-Python wheel: one module whose MARK says where it came from."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if extra:
        meta += [f"Provides-Extra: {extra}", f'Requires-Dist: {extra_req}; extra == "{extra}"']
    files = {f"{name}/__init__.py": f"MARK = {marker!r}\n", f"{info}/METADATA": "\n".join(meta) + "\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("extras")
    _wheel(root / "index", "sglang", "0.3.2", "index", "srt", "fakedep")
    _wheel(root / "index", "fakedep", "1.0", "index")
    _wheel(root / "wheels", "sglang", "0.3.2", "compiled", "srt", "fakedep")
    (root / "constraints.txt").write_text("sglang==0.3.2\n")
    return {"root": root, "index": root / "index", "wheels": root / "wheels"}


def _install(wheels, words: str, tmp_path: Path, find_links: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    links = " ".join(f"--find-links {p}" for p in (wheels["index"], *find_links))
    script = (f"{sys.executable} -m pip --python {venv}/bin/python install --no-index --isolated "
              f"--disable-pip-version-check {links} --constraint {wheels['root']}/constraints.txt {words} "
              f"&& {venv}/bin/python -c 'import sglang, fakedep; print(sglang.MARK)'")
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def _rendered_words() -> str:
    """The extras word of the shipped SGLang 0.3.2 runtime stage, exactly as rendered."""
    m = load(MATRIX)
    (cell,) = select(m, Selection(profiles=("cu121",), engines=("sglang",)))
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    line = next(ln for ln in text.split("AS runtime", 1)[1].splitlines() if "pip install" in ln and "/wheels/*.whl" in ln)
    word = re.search(r'"\$\(echo /wheels/sglang-\[0-9\]\*\.whl\)\[srt\]"', line)
    assert word, line
    return word.group(0)


def test_the_rendered_runtime_installs_the_compiled_wheel_with_its_extra(wheels, tmp_path):
    words = "/wheels/*.whl " + _rendered_words()
    proc = _install(wheels, words.replace("/wheels/", f"{wheels['wheels']}/"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "compiled"
