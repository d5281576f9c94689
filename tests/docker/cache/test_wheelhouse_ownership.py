"""builder moves and removes only its own wheelhouse entries: a directory that carries a valid manifest for its

The Docker half of tests/unit/cache/test_wheelhouse_ownership.py: its docstring says the rest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import uuid
from pathlib import Path

from builder.cache.local import MANIFEST, QUARANTINE, Wheelhouse

from tests.helpers import REPO, run_cli
from tests.support.wheelhouse_ownership import COPIED, FIXTURE_MATRIX, OWN_BAD, OWN_GOOD, own_entry

A_YEAR_AGO = 365 * 86400


def fingerprint(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple]:
    """Every path under root (not following symlinks) with its type, mode, content hash or link target."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            p = Path(dirpath, name)
            if any(p == s or s in p.parents for s in skip):
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                what = ("dir", stat.S_IMODE(st.st_mode))
            else:
                what = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mtime_ns)
            out[str(p.relative_to(root))] = what
    return out


def foreign_tree(root: Path, outside: Path) -> None:
    """What a user may keep under (or point) --wheelhouse at: none of it is builder's."""
    shutil.copytree(REPO / "builder" / "cache", root / "builder" / "cache")  # a source tree, two levels deep
    shutil.copytree(REPO / "tests" / "golden", root / "tests" / "golden")
    (root / "README.txt").write_text("notes\n")
    # entry-shaped names that are not provably builder's
    src = root / "demo" / OWN_GOOD
    (root / "demo" / COPIED).mkdir(parents=True)
    for f in src.iterdir():  # a copy of a real entry under another key: its manifest names OWN_GOOD
        shutil.copy2(f, root / "demo" / COPIED / f.name)
    (root / "demo" / ("4" * 64)).mkdir()
    (root / "demo" / ("4" * 64) / "data.bin").write_bytes(os.urandom(64))  # no manifest at all
    (root / "demo" / ("5" * 64)).mkdir()
    (root / "demo" / ("5" * 64) / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)  # absurdly nested
    (root / "demo" / ("6" * 64)).mkdir()
    (root / "demo" / ("6" * 64) / MANIFEST).write_text('{"package": "other", "key": "' + "6" * 64 + '"}')
    (root / "Demo" / ("7" * 64)).mkdir(parents=True)  # not a package name
    (root / "Demo" / ("7" * 64) / "x").write_text("x")
    # symlinks out of the tree: to a directory holding a valid-looking entry, to a whole package dir
    ext = outside / "elsewhere"
    shutil.copytree(src, ext / OWN_GOOD)
    os.symlink(ext / OWN_GOOD, root / "demo" / ("8" * 64))
    os.symlink(ext, root / "linked")
    # look-alikes of what builder itself leaves: quarantine, temporaries, pulls
    (root / QUARANTINE / "demo").mkdir(parents=True)
    (root / QUARANTINE / "demo" / "notes.txt").write_text("mine\n")
    (root / QUARANTINE / "demo" / f"{'9' * 64}-20260101T000000-1").mkdir()  # no QUARANTINED note
    (root / QUARANTINE / "demo" / f"{'9' * 64}-20260101T000000-1" / "f").write_text("f")
    (root / "demo" / ".cache").mkdir()
    (root / "demo" / ".cache" / "f").write_text("f")
    (root / "demo" / ".abcdefabcdef-toolong_name").mkdir()
    (root / ".pulls").mkdir()
    (root / ".pulls" / "my-downloads").mkdir()
    (root / ".pulls" / "my-downloads" / "big.iso").write_bytes(b"iso")
    for dirpath, dirs, names in os.walk(root):  # everything old: --older-than 0 and --leftovers see it all
        for name in dirs + names:
            p = Path(dirpath, name)
            if not p.is_symlink():
                t = p.lstat().st_mtime - A_YEAR_AGO
                os.utime(p, (t, t))


def test_every_wheels_verb_leaves_foreign_files_byte_for_byte(tmp_path, registry):
    root, outside = tmp_path / "wh", tmp_path / "outside"
    wh = Wheelhouse(root)
    own_entry(wh, OWN_GOOD, tmp_path)
    bad = own_entry(wh, OWN_BAD, tmp_path)
    foreign_tree(root, outside)
    next(bad.glob("*.whl")).write_bytes(b"tampered")  # an own entry that fails: verify --quarantine moves it
    left = root / QUARANTINE / "demo" / f"{'a' * 64}-20250101T000000-7"  # a real leftover of builder's
    shutil.copytree(root / "demo" / OWN_GOOD, left)
    (left / "QUARANTINED").write_text("sha256 mismatch\n")
    own = (root / "demo" / OWN_GOOD, bad, left)
    before = fingerprint(root, skip=own)
    outside_before = fingerprint(outside)
    W = ["--wheelhouse", str(root)]
    remote = ["--cache-remote", f"registry:{registry}/ownership-{uuid.uuid4().hex[:8]}"]

    def verb(*args: str, code: int | None = None):
        res = run_cli("wheels", *args, cwd=tmp_path)
        assert "Traceback" not in res.output, res.output
        if code is not None:
            assert res.exit_code == code, res.output
        after = fingerprint(root, skip=own)
        changed = [k for k, v in before.items() if after.get(k) != v]
        assert not changed, f"wheels {' '.join(args)} touched foreign paths: {changed[:5]}"
        new = [k for k in set(after) - set(before) if not k.startswith(f"{QUARANTINE}/demo/{OWN_BAD}-")]
        assert not new, f"wheels {' '.join(args)} wrote {new[:5]}"
        assert fingerprint(outside) == outside_before
        return res

    ls = verb("ls", *W, "--json", code=0)
    assert sorted(e["key"] for e in json.loads(ls.output))[:2] == [OWN_GOOD, OWN_BAD]
    dry = verb("prune", "--matrix", str(FIXTURE_MATRIX), *W, "--unused", "--older-than", "0", "--leftovers",
               "--dry-run", code=0)
    planned = sorted(line.split(" ", 2)[2].split(":")[0] for line in dry.output.splitlines()
                     if line.startswith("would remove"))
    assert planned == sorted(map(str, own)), dry.output  # exactly builder's own two entries and its leftover
    assert all(p.exists() for p in own)
    verify = verb("verify", *W, "--quarantine", code=1)
    assert f"ok   demo==1.0 {OWN_GOOD[:16]}" in verify.output
    assert "moved to" in verify.output and not bad.exists()  # the tampered own entry went aside
    assert f"BAD  demo==1.0 {COPIED[:16]}" in verify.output and "not for this directory" in verify.output
    assert "left where it is" in verify.output
    verb("push", "--matrix", str(FIXTURE_MATRIX), *W, *remote, "--key", f"demo:{OWN_GOOD}", code=0)
    verb("pull", "--matrix", str(FIXTURE_MATRIX), *W, *remote, "--key", f"demo:{OWN_GOOD}", code=0)
    pruned = verb("prune", "--matrix", str(FIXTURE_MATRIX), *W, "--unused", "--older-than", "0", "--leftovers",
                  code=0)
    assert not (root / "demo" / OWN_GOOD).exists() and not left.exists()
    removed = [line for line in pruned.output.splitlines() if line.startswith("remove ")]
    assert len(removed) == 3, pruned.output  # the good entry, the leftover, and the entry verify moved aside
    verb("verify", *W, "--quarantine", code=1)
    verb("ls", *W, code=0)
