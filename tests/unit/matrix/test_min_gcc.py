"""GCC floors in the engine data (min_gcc), checked against the devel base's OS before anything is built: vLLM 0.33's
CMakeLists stops its configure with "GCC >= 13 is required", which Debian 12's gcc 12.2 hits for real."""

from __future__ import annotations

import pytest

from builder.engines import load_knowledge

from tests.helpers import run_cli, write_matrix
from tests.support.min_gcc import LOCAL


@pytest.mark.pure
def test_the_engine_data_knows_the_floor_and_each_base_os_compiler():
    kn = load_knowledge()
    assert kn.recipe("vllm", "0.33.0").min_gcc == "13"
    assert kn.recipe("vllm", "0.26.0").min_gcc == ""
    assert kn.base_gcc("bookworm") == "12.2" and kn.base_gcc("ubuntu24.04") == "13" and kn.base_gcc("trixie") == "14.2"
    assert kn.base_gcc("plan9") == ""


def test_plan_and_build_refuse_vllm_0_33_on_a_gcc_12_base(tmp_path):
    res = run_cli("plan", "--matrix", str(LOCAL), "--profile", "local")
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if "vllm==0.33.0" in ln]
    assert "REFUSED: vllm 0.33.0 needs GCC >= 13" in line and "GCC 12.2" in line
    # flash-attn in the same cell has no floor
    assert "REFUSED" not in next(ln for ln in res.output.splitlines() if "flash-attn==2.8.3" in ln)
    dry = run_cli("build", "--matrix", str(LOCAL), "--profile", "local", "--dry-run", "--allow-unpinned",
                  "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "w"), "--log-dir", str(tmp_path / "l"))
    assert dry.exit_code == 2, dry.output
    assert "the devel base's compiler is too old" in dry.output and "vllm 0.33.0 needs GCC >= 13" in dry.output


def test_the_shipped_cells_and_a_trixie_base_pass(tmp_path):
    res = run_cli("plan", "--profile", "all")
    assert res.exit_code == 0 and "REFUSED" not in res.output, res.output
    text = LOCAL.read_text().replace('os = "bookworm"\npython = "3.11"\nflash_attn = "2.8.3"',
                                     'os = "trixie"\npython = "3.13"\nflash_attn = "2.8.3"', 1)
    assert text != LOCAL.read_text()
    path = write_matrix(tmp_path, text, lock_from=LOCAL.with_name("matrix.lock"))
    res = run_cli("plan", "--matrix", str(path), "--profile", "local")
    assert res.exit_code == 0 and "vllm==0.33.0" in res.output and "REFUSED" not in res.output, res.output
