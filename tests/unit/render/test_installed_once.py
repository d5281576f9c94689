"""No file written twice: the runtime stage fails a cell whose installed distributions claim one path with different
contents (their RECORD files), naming both; identical files (the empty nvidia/__init__.py every CUDA wheel ships)
pass. The check is the rendered runtime stage's own command, run by a real Python in a venv made here. And the
SGLang 0.5.23 cell builds flash-attn 2.8.3 without the sdist's flash_attn/cute, so flash-attn-4's is the one left."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder import plan, render
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX


def rendered(pattern: str) -> str:
    m = load(MATRIX)
    (cell,) = [c for c in select(m, Selection(profiles=("all",))) if re.fullmatch(pattern, c.id)]
    return render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])


def check_command(text: str) -> str:
    (cmd,) = re.findall(r"&& (python -c 'import collections, csv.*?sys\.exit\(1 if clash else 0\)')", text)
    return cmd[len("python -c '"):-1]


def dist(site: Path, name: str, files: dict[str, str]) -> None:
    info = site / f"{name}.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("".join(f"{p},sha256={h},1\n" for p, h in files.items()) + f"{name}.dist-info/RECORD,,\n")


@pytest.fixture
def venv(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    py = tmp_path / "v" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    return py, site


def test_two_distributions_writing_one_path_fail_the_image_naming_both(venv):
    py, site = venv
    script = check_command(rendered(r"sglang-0\.5\.23-.*"))
    dist(site, "nvidia_cublas-13.0.0", {"nvidia/__init__.py": "e3b0"})
    dist(site, "nvidia_cudnn-9.0.0", {"nvidia/__init__.py": "e3b0"})  # the same bytes: harmless
    ok = subprocess.run([str(py), "-c", script], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    dist(site, "flash_attn-2.8.3", {"flash_attn/cute/interface.py": "aaaa", "flash_attn/cute/mask.py": "bbbb",
                                    "flash_attn/__init__.py": "cccc"})
    dist(site, "flash_attn_4-4.0.0b18", {"flash_attn/cute/interface.py": "dddd", "flash_attn/cute/mask.py": "eeee"})
    bad = subprocess.run([str(py), "-c", script], capture_output=True, text=True)
    assert bad.returncode == 1
    assert ("install 2 same paths with different contents (their RECORDs), which overwrite each other in no defined "
            "order: flash_attn-2.8.3.dist-info and flash_attn_4-4.0.0b18.dist-info; e.g. flash_attn/cute/interface.py, "
            "flash_attn/cute/mask.py") in bad.stderr


@pytest.mark.pure
@pytest.mark.parametrize("cell", [r"sglang-0\.5\.23-.*", r"vllm-0\.33\.0-.*", r"vllm-0\.6\.3\.post1-.*"])
def test_every_runtime_runs_the_check_and_flash_attn_2_8_leaves_cute_to_flash_attn_4(cell):
    text = rendered(cell)
    assert check_command(text)
    build = text[text.index("FROM torch AS build-flash-attn"):] if "AS build-flash-attn" in text else ""
    build = build[:build.index("\nFROM ")] if "\nFROM " in build else build
    if "flash-attn 2.8" in text or "flash_attn-2.8" in text or "flash-attn==2.8" in text:
        assert "RUN test -e flash_attn/cute && rm -rf flash_attn/cute" in build
    else:
        assert "flash_attn/cute" not in text  # 2.6.3 (cu121) has no such directory
