"""builder moves and removes only its own wheelhouse entries: a directory that carries a valid manifest for its
own package and key (builder/cache/local.py, Wheelhouse.not_own), and the quarantined entries and temporary
directories it names itself. Every `wheels` verb runs against a wheelhouse that also holds foreign files and
directories (a copy of a source tree, entries copied under another key, symlinks out of the tree, look-alike
names), and every foreign byte must still be there afterwards."""

from __future__ import annotations

import shutil

import pytest

from builder.cache import file_records
from builder.cache.local import MANIFEST, Wheelhouse

from tests.helpers import a_wheel
from tests.helpers import run_cli
from tests.support.wheelhouse_ownership import COPIED, FIXTURE_MATRIX, OWN_GOOD, own_entry


@pytest.mark.pure
def test_an_entry_copied_under_another_key_is_never_reused(tmp_path):
    """Issue: the wheelhouse reused an entry whose manifest is for another key or package; now it is no hit,
    and the build does not move it away either (it is not provably builder's)."""
    wh = Wheelhouse(tmp_path / "wh")
    src = own_entry(wh, OWN_GOOD, tmp_path)
    shutil.copytree(src, wh.entry_dir("demo", COPIED))
    hit = wh.lookup("demo", COPIED, (80,))
    assert hit is not None and not hit.usable and "not this key" in hit.problem
    assert wh.discard(hit, "bad") == "" and wh.entry_dir("demo", COPIED).is_dir()
    shutil.copytree(src, wh.entry_dir("other", OWN_GOOD))
    assert not wh.lookup("other", OWN_GOOD, (80,)).usable


def test_a_deeply_nested_manifest_is_one_bad_entry_not_a_crash(tmp_path):
    wh = Wheelhouse(tmp_path / "wh")
    own_entry(wh, OWN_GOOD, tmp_path)
    (wh.entry_dir("demo", "5" * 64)).mkdir()
    (wh.entry_dir("demo", "5" * 64) / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in wh.lookup("demo", "5" * 64, (80,)).problem
    for args in (("ls",), ("verify",)):
        res = run_cli("wheels", *args, "--wheelhouse", str(wh.root), cwd=tmp_path)
        assert "Traceback" not in res.output and "RecursionError" not in res.output, res.output
    res = run_cli("plan", "--matrix", str(FIXTURE_MATRIX), "--wheelhouse", str(wh.root), cwd=tmp_path)
    assert res.exit_code == 0, res.output


@pytest.mark.pure
def test_a_full_wheelhouse_names_where_and_where_the_wheels_still_are(tmp_path, monkeypatch):
    """Issue: a full wheelhouse lost the compile behind an OSError naming no path."""
    import errno

    import pytest

    from builder.cache import local

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local.shutil, "copyfile", full)
    wh = Wheelhouse(tmp_path / "wh")
    whl = a_wheel(tmp_path / "out")
    with pytest.raises(OSError) as exc:
        wh.store("demo", OWN_GOOD, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]}})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(wh.root / "demo")
    assert str(whl.parent) in exc.value.strerror and "No space left on device" in exc.value.strerror
    assert not list((wh.root / "demo").iterdir())  # no half entry
