"""scripts/git-host, the git host a firewalled team (and this project's tests) serves its mirrors from: a real server
on 127.0.0.1 (git's smart HTTP through `git http-backend`, GitHub's archive route through `git archive | gzip -n`),
reached by real git and curl through builder's mirror map; `check` says which sources of a fetch plan it can serve
byte for byte."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from builder import gitmirror, lock
from tests.helpers import REPO, git_host

SCRIPT = REPO / "scripts" / "git-host"
GH = "https://github.com/"

pytestmark = [pytest.mark.skipif(not shutil.which("git"), reason="skipped because git is not installed"),
              pytest.mark.usefixtures("no_git_mirrors")]


@pytest.fixture
def host(tmp_path):
    with git_host(tmp_path) as info:
        yield info


def _git(*argv, cwd, mirror):
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), **gitmirror.git_env(((GH, mirror),))}
    return subprocess.run(["git", *argv], cwd=cwd, env=env, capture_output=True, text=True)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _archive(work: Path, ref: str, prefix: str) -> bytes:
    tar = subprocess.run(["git", "archive", "--format=tar", f"--prefix={prefix}", ref], cwd=work, capture_output=True,
                         check=True).stdout
    return subprocess.run(["gzip", "-n"], input=tar, capture_output=True, check=True).stdout


def test_lock_resolves_a_tag_and_git_fetches_any_commit_through_the_mirror_map(host, tmp_path):
    gitmirror.activate(((GH, host["mirror"]),))
    # lock's own resolution: the upstream URL, the mirror's answer
    assert lock.resolve_git_commit("https://github.com/acme/widget", "v1.2") == (host["commit"], "")
    assert lock.resolve_git_commit("https://github.com/ACME/Widget.git", "v1.2") == (host["commit"], "")  # GitHub's case rule
    # a shallow fetch of a commit that no ref names at its tip (the deps stage's fetch of a pinned commit)
    dest = tmp_path / "clone"
    dest.mkdir()
    assert _git("init", "-q", cwd=dest, mirror=host["mirror"]).returncode == 0
    got = _git("fetch", "-q", "--depth", "1", "https://github.com/acme/widget", host["first"], cwd=dest,
               mirror=host["mirror"])
    assert got.returncode == 0, got.stderr
    assert _git("rev-parse", "FETCH_HEAD", cwd=dest, mirror=host["mirror"]).stdout.strip() == host["first"]


def test_archives_are_githubs_bytes_for_a_commit_and_a_tag(host):
    base = f"{host['mirror']}acme/widget/archive"
    code, body = _get(f"{base}/{host['first']}.tar.gz")
    assert code == 200 and body == _archive(host["work"], host["first"], f"widget-{host['first']}/")
    with tarfile.open(fileobj=io.BytesIO(body)) as t:
        assert f"widget-{host['first']}/src/widget.cu" in t.getnames()
        assert t.extractfile(f"widget-{host['first']}/src/widget.cu").read() == b"// one\n"
    assert gzip.decompress(body)[:1024].count(host["first"].encode()) == 1  # git archive's pax header: the commit id
    code, body = _get(f"{base}/v1.2.tar.gz")  # a tag vX.Y: GitHub's top directory drops the v
    assert code == 200 and body == _archive(host["work"], "v1.2", "widget-1.2/")
    code, body = _get(f"{host['mirror']}ACME/widget.git/archive/{host['commit']}.tar.gz")
    assert code == 200 and body == _archive(host["work"], host["commit"], f"widget-{host['commit']}/")


@pytest.mark.parametrize("path", ["acme/nothing/archive/v1.2.tar.gz", "acme/widget/archive/v9.tar.gz",
                                  "acme/widget/archive/" + "0" * 40 + ".tar.gz", "../../etc/passwd",
                                  "acme/widget/config", "acme/widget/archive/..%2F..%2Fx.tar.gz"])
def test_what_it_does_not_hold_is_404(host, path):
    assert _get(f"{host['mirror']}{path}")[0] == 404


def test_a_missing_blob_is_a_500_not_a_cut_archive(host):
    repo = host["root"] / "github.com" / "acme" / "widget.git"
    subprocess.run(["git", "--git-dir", str(repo), "repack", "-a", "-d", "-q"], check=True)  # one pack, then drop a blob
    blob = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"{host['first']}:src/widget.cu"],
                          capture_output=True, text=True, check=True).stdout.strip()
    keep = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"],
                          capture_output=True, text=True, check=True).stdout.split()
    packs = list((repo / "objects" / "pack").glob("*.pack"))
    new = subprocess.run(["git", "--git-dir", str(repo), "pack-objects", "-q", str(repo / "objects" / "pack" / "pack")],
                         input="\n".join(o for o in keep if o != blob) + "\n", capture_output=True, text=True, check=True)
    assert new.stdout.strip()
    for p in packs:
        p.unlink()
        p.with_suffix(".idx").unlink()
    code, body = _get(f"{host['mirror']}acme/widget/archive/{host['first']}.tar.gz")
    assert code == 500 and b"cannot archive" in body


def _plan(tmp_path: Path, host, sha256: str, commit: str) -> Path:
    doc = {"git": {"repository": "https://github.com/acme/widget", "commit": host["commit"], "subdir": "."},
           "sources": [{"name": "widget-archive", "kind": "url", "url_hash": f"SHA256={sha256}",
                        "repository": f"https://github.com/acme/widget/archive/{commit}.tar.gz", "commit": ""},
                       {"name": "widget-git", "kind": "git", "repository": "https://github.com/acme/widget.git",
                        "commit": host["first"], "url_hash": None}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_check_says_which_sources_it_serves_byte_for_byte(host, tmp_path):
    good = hashlib.sha256(_archive(host["work"], host["first"], f"widget-{host['first']}/")).hexdigest()
    ok = subprocess.run([sys.executable, str(SCRIPT), "check", str(host["root"]), str(_plan(tmp_path, host, good, host["first"]))],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "archive sha256 = URL_HASH" in ok.stdout and "every source is served" in ok.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "check", str(host["root"]),
                          str(_plan(tmp_path, host, "0" * 64, host["first"]))], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "MISS widget-archive" in bad.stdout and "is not the URL_HASH" in bad.stdout
    gone = subprocess.run([sys.executable, str(SCRIPT), "check", str(host["root"]),
                           str(_plan(tmp_path, host, good, "f" * 40))], capture_output=True, text=True)
    assert gone.returncode == 1 and "has no commit or tag" in gone.stdout
