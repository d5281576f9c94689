"""The image ledger (builder/image/ledger.py): which digests builder recorded for a content key. In-process: the files
are real, no daemon is needed (the reuse it decides is tested on the engine in tests/docker/builds/test_build.py)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from builder.image import ledger, reuse
from builder.errors import UserError

KEY = "a" * 64
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")

pytestmark = pytest.mark.pure


def vouches(book: ledger.Ledger, key: str, digest: str) -> tuple[bool, str]:
    """What the image step's reuse decision reads of this host's ledger (image/reuse.py local_voucher)."""
    v = reuse.local_voucher(book.root)(key)
    return ledger.vouches(v.entry, digest) if v.entry is not None else (False, v.missing)


def test_a_recorded_digest_is_vouched_for_and_no_other(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    ok, why = vouches(book, KEY, D1)
    assert not ok and "builder recorded no image for it" in why and str(book.path(KEY)) in why
    assert book.record_image(KEY, D1, "cell-a") == ""
    assert vouches(book, KEY, D1) == (True, "")
    ok, why = vouches(book, KEY, D2)
    assert not ok and why == f"its digest {D2} is not the one builder recorded for it ({D1})"
    assert vouches(book, "b" * 64, D1)[0] is False  # bound to the key, not to the digest alone
    entry = json.loads(book.path(KEY).read_text())
    assert entry["format"] == 1 and entry["content_key"] == KEY and entry["images"][D1]["cell"] == "cell-a"


def test_publish_records_where_a_digest_went_under_the_same_key(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    book.record_image(KEY, D1, "cell-a")
    book.record_published(KEY, "127.0.0.1:5000/team/cuda-ext:1.0.0-cu130", D1, "cell-a")
    entry, problem = book.read(KEY)
    assert problem == "" and entry.published == {"127.0.0.1:5000/team/cuda-ext:1.0.0-cu130": D1}
    assert set(entry.images) == {D1}
    # a push of a digest this ledger had not seen (a wheelhouse started after the build) binds it too
    book.record_published(KEY, "127.0.0.1:5000/team/cuda-ext:1.0.0-cu130", D2, "cell-a")
    assert vouches(book, KEY, D2) == (True, "")


def test_old_digests_are_dropped_beyond_the_limit(tmp_path, monkeypatch):
    book = ledger.Ledger(tmp_path / ".images")
    times = iter(f"2026-01-01T00:00:{s:02d}Z" for s in range(60))
    monkeypatch.setattr(ledger, "_now", lambda: next(times))
    digests = [f"sha256:{i:064x}" for i in range(ledger.KEEP + 3)]
    for d in digests:
        book.record_image(KEY, d, "cell")
    entry, _ = book.read(KEY)
    assert set(entry.images) == set(digests[-ledger.KEEP:])


@pytest.mark.parametrize("name, content, words", [
    ("not-json", '{"format": 1, "images": [', "not JSON"),
    ("not-an-object", "[1, 2]", "expected a table"),
    ("no-key", json.dumps({"format": 1, "images": {}}), "missing key 'content_key'"),
    ("other-key", json.dumps({"format": 1, "content_key": "b" * 64, "images": {}}), f"records content key {'b' * 64}"),
    ("bad-digest", json.dumps({"format": 1, "content_key": KEY, "images": {"sha256:zz": {"cell": "c", "recorded":
                                                                                          "2026-01-01T00:00:00Z"}}}),
     "is not an image digest"),
    ("empty-digest", json.dumps({"format": 1, "content_key": KEY, "images": {"": {"cell": "c", "recorded":
                                                                                  "2026-01-01T00:00:00Z"}}}),
     "images: key '' is empty"),
    ("bad-time", json.dumps({"format": 1, "content_key": KEY, "images": {D1: {"cell": "c", "recorded": "yesterday"}}}),
     "expected a UTC time"),
    ("unknown-field", json.dumps({"format": 1, "content_key": KEY, "images": {}, "trust": True}), "unknown key 'trust'"),
    ("other-format", json.dumps({"format": 2, "content_key": KEY, "images": {}}), "format 2, this builder writes 1"),
    ("published-bad-ref", json.dumps({"format": 1, "content_key": KEY, "images": {}, "published": {"Bad Ref": D1}}),
     "is not an image reference"),
    ("nested", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("huge", " " * (ledger.MAX_BYTES + 1), "larger than"),
])
def test_a_bad_entry_is_ignored_with_its_reason_and_replaced_by_the_next_record(tmp_path, name, content, words):
    book = ledger.Ledger(tmp_path / ".images")
    book.root.mkdir()
    book.path(KEY).write_text(content)
    entry, problem = book.read(KEY)
    assert entry is None and words in problem and str(book.path(KEY)) in problem, problem
    ok, why = vouches(book, KEY, D1)
    assert not ok and why.startswith("its ledger entry is ignored (") and words in why
    note = book.record_image(KEY, D1, "cell")
    assert note.startswith("replaced an unreadable ledger entry") and words in note
    assert vouches(book, KEY, D1) == (True, "")


def test_an_entry_that_is_not_a_regular_file_is_ignored_and_its_target_never_written(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    book.root.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    book.path(KEY).symlink_to(target)
    assert "is not a regular file" in book.read(KEY)[1]
    book.record_image(KEY, D1, "cell")
    assert target.read_text() == "keep" and not book.path(KEY).is_symlink()
    assert vouches(book, KEY, D1) == (True, "")
    os.unlink(book.path(KEY))
    book.path(KEY).mkdir()
    assert "is not a regular file" in book.read(KEY)[1]


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_text("x"), "is a file"),
    (lambda p: p.symlink_to(p.parent / "real"), "is a symlink"),
    (lambda p: p.symlink_to(p), "is a symlink"),
    (lambda p: os.mkfifo(p), "is not a directory"),
])
def test_a_ledger_place_that_is_not_a_directory_is_refused(tmp_path, make, words):
    (tmp_path / "real").mkdir()
    place = tmp_path / ".images"
    make(place)
    with pytest.raises(UserError, match="--wheelhouse: .*" + words + ".*image ledger"):
        ledger.check_dir(place)
    with pytest.raises(UserError):  # and nothing is written through it
        ledger.Ledger(place).record_image(KEY, D1, "cell")
    assert list((tmp_path / "real").iterdir()) == []


def test_two_builds_recording_at_once_lose_neither_digest(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    digests = [f"sha256:{i:064x}" for i in range(8)]
    threads = [threading.Thread(target=book.record_image, args=(KEY, d, f"cell-{i}")) for i, d in enumerate(digests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entry, problem = book.read(KEY)
    assert problem == "" and set(entry.images) == set(digests)
    assert sorted(p.name for p in book.root.iterdir()) == [ledger.LOCK_NAME, f"{KEY}.json"]  # no temporary left


def test_a_temporary_file_a_killed_build_left_is_removed_by_a_later_record(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    book.root.mkdir()
    stale = book.root / f".{KEY[:12]}-abcd_123.part"
    fresh = book.root / f".{KEY[:12]}-efgh_456.part"
    other = book.root / "notes.part"
    for p in (stale, fresh, other):
        p.write_text("{")
    os.utime(stale, (1, 1))
    os.utime(other, (1, 1))
    book.record_image(KEY, D1, "cell")
    assert not stale.exists() and fresh.exists() and other.exists()  # only its own names, only old ones


def test_the_refusal_names_every_digest_recorded_when_there_are_several(tmp_path):
    book = ledger.Ledger(tmp_path / ".images")
    book.record_image(KEY, D1, "cell")
    book.record_image(KEY, D2, "cell")
    ok, why = vouches(book, KEY, D3)
    assert not ok and why.startswith(f"its digest {D3} is none of those builder recorded for it (")
    assert D1 in why and D2 in why
    assert vouches(book, KEY, D1) == vouches(book, KEY, D2) == (True, "")
