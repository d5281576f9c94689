"""GCC floors in the engine data (min_gcc), checked against the devel base's OS before anything is built: vLLM 0.33's

The Docker half of tests/unit/matrix/test_min_gcc.py: its docstring says the rest."""

from __future__ import annotations

import pytest

from tests.helpers import REPO, run_cli, write_matrix
from tests.support.min_gcc import LOCAL


def test_doctor_measures_the_gcc_of_a_local_devel_base(local_bases, docker_engine, tmp_path):
    """The local devel base is Debian 12: its gcc, run in the image, is 12.2, and doctor says vLLM 0.33 cannot
    build there and how to get one that can."""
    res = run_cli("doctor", "--matrix", str(LOCAL), "--json")
    import json

    checks = {c["name"]: c for c in json.loads(res.output)}
    gcc = checks[f"GCC in {local_bases['cuda_devel']}"]
    assert not gcc["ok"] and gcc["detail"].startswith("12.2") and "(measured)" in gcc["detail"], gcc
    assert "vllm 0.33.0 >= 13" in gcc["detail"] and "--trixie" in gcc["fix"]
    assert res.exit_code == 3


@pytest.mark.slow
def test_the_trixie_devel_base_has_a_gcc_vllm_0_33_accepts(docker_engine, tmp_path):
    """scripts/make-local-bases.sh --trixie builds a Debian 13 devel base beside the bookworm ones (a few minutes
    the first time: debootstrap and the CUDA 13 wheels); doctor measures its gcc and passes vLLM 0.33 there."""
    import json
    import subprocess

    made = subprocess.run(["bash", str(REPO / "scripts" / "make-local-bases.sh"), "--trixie"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    assert "builder-local/cuda:13.0-devel-trixie" in made.stdout.split()
    text = LOCAL.read_text().replace('devel = "builder-local/cuda:13.0-devel"', 'devel = "builder-local/cuda:13.0-devel-trixie"')
    text = text.replace('os = "bookworm"\npython = "3.11"\nflash_attn = "2.8.3"', 'os = "trixie"\npython = "3.13"\nflash_attn = "2.8.3"', 1)
    path = write_matrix(tmp_path, text, lock_from=LOCAL.with_name("matrix.lock"))
    res = run_cli("doctor", "--matrix", str(path), "--json")
    checks = {c["name"]: c for c in json.loads(res.output)}
    gcc = checks["GCC in builder-local/cuda:13.0-devel-trixie"]
    assert gcc["ok"] and gcc["detail"].startswith("14.") and "(measured)" in gcc["detail"], gcc
