"""matrix.lock comes from the packages' own metadata on the real index (PyPI, over HTTPS)."""

from __future__ import annotations

import pytest

from builder.pypi import SimpleIndex

from tests.helpers import MATRIX, run_cli, write_matrix


@pytest.mark.network
def test_committed_lock_is_what_the_index_says():
    res = run_cli("lock", "--matrix", str(MATRIX), "--check")
    assert res.exit_code == 0, res.output
    assert "matrix.lock is up to date" in res.output


@pytest.mark.pure
@pytest.mark.network
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


@pytest.mark.pure
@pytest.mark.network
def test_torch_names_its_cuda_in_its_own_requirements():
    """What plan compares with a cell's CUDA: the CUDA wheels the index's torch requires on Linux x86_64 (the 2.4
    line's carry a -cu12 suffix; 2.14 pins the cuda-toolkit meta-package)."""
    from builder.lock import torch_cuda

    index = SimpleIndex()
    assert torch_cuda(index, "2.4.0") == {"major": 12, "from": "nvidia-cuda-runtime-cu12==12.1.105"}
    assert torch_cuda(index, "2.14.1") == {"major": 13, "from": "cuda-toolkit==13.0.3"}


@pytest.mark.network
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
    assert '[packages."vllm==0.6.3.post1".torch_cuda]\nmajor = 12\nfrom = "nvidia-cuda-runtime-cu12==12.1.105"' in lock
    assert "0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143" in lock
    assert run_cli("plan", "--matrix", str(path)).exit_code == 0


@pytest.mark.pure
@pytest.mark.network
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


def _git_package_matrix(tmp_path, repo_url: str):
    """A matrix whose one engine is built from a git tag (a local repository stands in for the git host)."""
    (tmp_path / "engines.toml").write_text(f"""
[packages.gitpkg]
pypi = "gitpkg"
kind = "engine"
template = "pip-wheel"
torch_pin = "none"
mem_gb_per_nvcc_thread = 1.0
[[packages.gitpkg.rules]]
versions = ">=1"
source = "git"
git_repository = "{repo_url}"
git_tag = "v{{version}}"
min_cuda = "12.0"
launch = ["gitpkg"]
""")
    return write_matrix(tmp_path, """
        [defaults]
        profile = "p"
        knowledge = ["engines.toml"]
        [profiles.p]
        cuda = "13.0.88"
        os = "bookworm"
        python = "3.11"
        engines = { gitpkg = "1.2" }
    """, lock_from=None)


def _repo_with_tag(path, tag):
    import subprocess

    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "r"],
                   check=True)
    subprocess.run(["git", "-C", str(path), "tag", tag], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_lock_resolves_a_git_tag_to_its_commit(tmp_path):
    commit = _repo_with_tag(tmp_path / "upstream", "v1.2")
    path = _git_package_matrix(tmp_path, str(tmp_path / "upstream"))
    res = run_cli("lock", "--matrix", str(path))
    assert res.exit_code == 0, res.output
    assert f'commit = "{commit}"' in (tmp_path / "matrix.lock").read_text()
    out = run_cli("render", "--matrix", str(path)).output
    assert f"fetch -q --depth 1 {tmp_path / 'upstream'} {commit}" in out and "UNPINNED" not in out


def test_build_pins_a_tag_the_lock_could_not(tmp_path):
    from builder import matrix as M
    from builder.lock import pin_git_sources
    from builder.resolve import select

    commit = _repo_with_tag(tmp_path / "upstream", "v1.2")
    path = _git_package_matrix(tmp_path, str(tmp_path / "upstream"))
    (tmp_path / "matrix.lock").write_text(
        f'format = 1\n[packages."gitpkg==1.2".git]\nrepository = "{tmp_path / "upstream"}"\ntag = "v1.2"\ncommit = ""\n'
        'unresolved = "git host unreachable at lock time"\n')
    cells = select(M.load(path), M.Selection())
    assert not cells[0].packages[0].source.pinned
    said = []
    pinned = pin_git_sources(cells, echo=said.append)
    assert pinned[0].packages[0].source.commit == commit and pinned[0].id == cells[0].id
    assert f"resolved to {commit}" in said[0]
    # a tag that cannot be resolved stays unpinned, and says why
    import dataclasses

    src = dataclasses.replace(cells[0].packages[0].source, repository=str(tmp_path / "nowhere"))
    gone = [dataclasses.replace(cells[0], packages=(dataclasses.replace(cells[0].packages[0], source=src),))]
    said.clear()
    still = pin_git_sources(gone, echo=said.append)
    assert not still[0].packages[0].source.pinned and "cannot resolve" in said[0]


@pytest.mark.network
def test_lock_selectors_refresh_only_the_selected_packages(tmp_path):
    import tomllib

    from tests.helpers import REPO

    path = write_matrix(tmp_path, (REPO / "matrix.toml").read_text())
    data = (tmp_path / "matrix.lock").read_text()
    # drop the SGLang 0.5.23 entry: locking only vLLM must not bring it back, locking SGLang must
    start = data.index('[packages."sglang==0.5.23"]')
    end = data.index('[packages."vllm==0.33.0"]')
    (tmp_path / "matrix.lock").write_text(data[:start] + data[end:])
    res = run_cli("lock", "--matrix", str(path), "--engine", "vllm", "--profile", "cu130")
    assert res.exit_code == 0, res.output
    packages = tomllib.loads((tmp_path / "matrix.lock").read_text())["packages"]
    assert "sglang==0.5.23" not in packages and "vllm==0.33.0" in packages and "vllm==0.6.3.post1" in packages
    assert run_cli("lock", "--matrix", str(path), "--engine", "sglang", "--profile", "cu130").exit_code == 0
    packages = tomllib.loads((tmp_path / "matrix.lock").read_text())["packages"]
    assert packages["sglang==0.5.23"]["torch"] == "2.14.1"
    assert run_cli("lock", "--matrix", str(path), "--check").exit_code == 0


@pytest.mark.pure
def test_lock_refuses_cell_selectors():
    res = run_cli("lock", "--matrix", str(MATRIX), "--only", "vllm-*")
    assert res.exit_code == 2 and "lock works per package" in res.output


@pytest.mark.pure
def test_a_file_the_index_lists_downloads_under_the_download_cap_not_the_document_cap(tmp_path, monkeypatch):
    """What compile_units.py and the fetch plans take through lock._download (the 373 MB sglang-kernel wheel, an
    sdist): streamed to disk under the download cap and hashed, where reading it as a document (held in memory,
    capped at BUILDER_REMOTE_MAX_BYTES, 64 MiB by default) refuses it. A served file of 3 MiB against a 1 MiB
    document cap stands in for the wheel against the real one (a local HTTP server: a test double for the index)."""
    import functools
    import hashlib
    import http.server
    import threading

    from builder.download import DownloadMismatch
    from builder.lock import _download
    from builder.net import TooLarge

    served = tmp_path / "served"
    served.mkdir()
    payload = bytes(range(256)) * (3 << 12)
    (served / "big-1.0-py3-none-any.whl").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    monkeypatch.setenv("BUILDER_REMOTE_MAX_BYTES", str(1 << 20))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    handler = functools.partial(quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with server:
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/big-1.0-py3-none-any.whl"
            index = SimpleIndex(f"http://127.0.0.1:{server.server_address[1]}/simple")
            with pytest.raises(TooLarge):
                index.get(url)  # the document path: what _download used, and why the wheel never arrived
            path = _download(index, url, sha, "big-1.0-py3-none-any.whl")
            assert path.read_bytes() == payload and path.parent.name == sha
            assert _download(index, "http://127.0.0.1:9/unused", sha, path.name) == path  # cached: no request
            with pytest.raises(DownloadMismatch):
                _download(index, url, "0" * 64, "big-1.0-py3-none-any.whl")
            assert not (tmp_path / "cache" / "builder" / "sdists" / ("0" * 64) / "big-1.0-py3-none-any.whl").exists()
            assert not list((tmp_path / "cache").rglob("*.part"))
        finally:
            server.shutdown()
