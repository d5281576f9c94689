"""matrix.lock comes from the packages' own metadata on the real index (PyPI, over HTTPS)."""

from __future__ import annotations

from builder.pypi import SimpleIndex

from .helpers import MATRIX, run_cli, write_matrix


def test_committed_lock_is_what_the_index_says():
    res = run_cli("lock", "--matrix", str(MATRIX), "--check")
    assert res.exit_code == 0, res.output
    assert "matrix.lock is up to date" in res.output


def test_pins_read_from_pep658_and_from_a_remote_wheel():
    index = SimpleIndex()
    old = index.metadata("vllm", "0.6.3.post1")  # has a .metadata file (PEP 658)
    assert old.pin("torch") == "2.4.0"
    new = index.metadata("vllm", "0.33.0")  # no .metadata: read from the wheel's zip by HTTP ranges
    assert new.pin("torch") == "2.14.0"
    assert new.requires_python and "3.11" in new.requires_python
    sg = index.metadata("sglang", "0.3.2")
    assert sg.pin("vllm") is None  # only under the "srt" extra
    assert sg.pin("vllm", ("srt",)) == "0.5.5"


def test_lock_writes_entries_for_a_new_matrix(tmp_path):
    text = """
        [defaults]
        profile = "p"
        [profiles.p]
        cuda = "12.1.1"
        os = "ubuntu22.04"
        python = "3.10"
        engines = { vllm = "0.6.3.post1" }
    """
    path = write_matrix(tmp_path, text, lock_from=None)
    res = run_cli("lock", "--matrix", str(path))
    assert res.exit_code == 0, res.output
    lock = (tmp_path / "matrix.lock").read_text()
    assert '[packages."vllm==0.6.3.post1"]' in lock and 'torch = "2.4.0"' in lock
    assert "0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143" in lock
    assert run_cli("plan", "--matrix", str(path)).exit_code == 0


def test_lock_refuses_a_release_the_index_does_not_have(tmp_path):
    text = """
        [defaults]
        profile = "p"
        [profiles.p]
        cuda = "13.0.3"
        os = "ubuntu24.04"
        python = "3.12"
        engines = { vllm = "0.33.7" }
    """
    path = write_matrix(tmp_path, text, lock_from=None)
    res = run_cli("lock", "--matrix", str(path))
    assert res.exit_code == 2
    assert "vllm 0.33.7: no such release" in res.output
    assert not (tmp_path / "matrix.lock").exists()  # nothing half-written
