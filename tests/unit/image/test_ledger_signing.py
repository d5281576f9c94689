"""Trust across runners is a signature (builder/image/signing.py, builder/image/reuse.py): the ledger record a
registry keeps beside an image is a DSSE envelope signed with the key CI holds (BUILDER_LEDGER_SIGNING_KEY), and
where the matrix names the public key ([defaults] ledger_public_key) a record that is unsigned, signed by another
key or edited after it was signed is never adopted. Where it names none, the registry's word is taken and said once.
Real keys made here, a real registry on 127.0.0.1, the real fixture cell for the end-to-end case."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from builder import redact
from builder.errors import UserError
from builder.image import ledger, reuse, signing

from tests.helpers import CUDA_EXT_CELL as CELL
from tests.registry_runs import Run, builder
from tests.support.ledger_signing import DIGEST, FORGED, KEY, keys, pair


def test_the_signing_key_and_the_public_key_are_checked_and_never_said(tmp_path):
    signer, trusted, pem = keys(tmp_path)
    assert signer.public_key.keyid == trusted.keyid
    ed_signer, ed_trusted, _ = keys(tmp_path, "ed25519")
    assert ed_signer.public_key.keyid == ed_trusted.keyid != trusted.keyid
    assert signing.signer_from_env({}) is None and signing.signer_from_env({signing.ENV: " \n"}) is None
    for bad in ("not a key", pem.replace("A", "B", 3), pem[: len(pem) // 2]):
        with pytest.raises(UserError) as exc:
            signing.signer_from_env({signing.ENV: bad})
        said = str(exc.value)
        assert said.startswith(signing.ENV + ": not an unencrypted PEM private key") and "\n" not in said
        assert not any(line in said for line in pem.splitlines()[1:-1])
    (tmp_path / "private.pub").write_text(pem)
    (tmp_path / "junk.pub").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    for name, words in (("private.pub", "holds a PRIVATE key"), ("junk.pub", "is not a PEM public key"),
                        ("missing.pub", "No such file")):
        with pytest.raises(UserError, match=words) as exc:
            signing.public_key(tmp_path / name, "defaults.ledger_public_key")
        assert "\n" not in str(exc.value) and "MII" not in str(exc.value)
    # the variable's value is a secret: redacted wherever it would appear
    import os

    old = os.environ.get(signing.ENV)
    os.environ[signing.ENV] = pem
    try:
        assert pem not in redact.redact(f"oops: {pem}") and "***" in redact.redact(f"oops: {pem}")
    finally:
        os.environ.pop(signing.ENV) if old is None else os.environ.__setitem__(signing.ENV, old)


def test_a_digest_pulled_on_a_signed_word_is_kept_apart_and_never_demotes_one_built_here():
    entry = ledger.Entry(KEY)
    ledger.add_image(entry, DIGEST, CELL, "ledger record R, signed by key K")
    assert entry.images[DIGEST]["vouched_by"] == "ledger record R, signed by key K"
    ledger.add_image(entry, DIGEST, CELL)  # built here after all
    assert "vouched_by" not in entry.images[DIGEST]
    ledger.add_image(entry, DIGEST, CELL, "ledger record R, signed by key K")  # a built digest stays built here
    assert "vouched_by" not in entry.images[DIGEST]
    raw = json.dumps({"format": 1, "content_key": KEY, "images": {
        FORGED: {"cell": CELL, "recorded": "2026-01-01T00:00:00Z", "vouched_by": "ledger record R, signed by key K"}}})
    back, problem = ledger.parse(raw.encode(), "x", KEY)
    assert not problem and back.images[FORGED]["vouched_by"]
    # and a later reuse from this host's ledger says on whose word it was taken
    verdict = reuse.judge(reuse.Claim("image x", FORGED, KEY), KEY,
                          lambda k: reuse.Voucher(back, "", "this host's image ledger"))
    assert isinstance(verdict, reuse.Reuse)
    assert "this host's image ledger took from the registry on the word of ledger record R, signed by key K" in verdict.why


def test_publish_refuses_an_unsigned_record_where_the_matrix_names_a_key(tmp_path):
    """Bad keys and a publish without its signing key: refused before anything runs, one line, exit 2."""
    names = f"127.0.0.1:5000/builder-test-sg{uuid.uuid4().hex[:8]}"
    run = Run(tmp_path, names, "127.0.0.1:1/nowhere")
    pem, pub = pair()
    (run.matrix.parent / "ledger.pub").write_bytes(pub)
    text = run.matrix.read_text()
    run.matrix.write_text(text.replace(f'registry = "{names}"', f'registry = "{names}"\nledger_public_key = "ledger.pub"'))
    other, _ = pair("ed25519")
    for env, words in (({}, "publish: the matrix names ledger_public_key ledger.pub, so the ledger records publish "
                            f"pushes must be signed: set {signing.ENV}"),
                       ({signing.ENV: other}, "is not the pair of the matrix's ledger_public_key ledger.pub"),
                       ({signing.ENV: "-----BEGIN PRIVATE KEY-----\nxyz\n"}, "not an unencrypted PEM private key")):
        res = builder(*run.args("publish", tmp_path / "r", "--dry-run"), cwd=tmp_path,
                      env={signing.ENV: "", **env})
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], res.stderr
        assert "MII" not in res.stderr + res.stdout
    (run.matrix.parent / "ledger.pub").write_text(pem)  # the private key where the public one belongs
    res = builder(*run.args("build", tmp_path / "r", "--dry-run"), cwd=tmp_path)
    assert res.returncode == 2 and "holds a PRIVATE key" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "MII" not in res.stderr + res.stdout


KEY_FILES = {  # what ledger_public_key names → what the refusal says
    "a FIFO": ("ledger.pub", "fifo", "not a regular file (a FIFO, socket or device)"),
    "/dev/zero": ("/dev/zero", None, "not a regular file (a FIFO, socket or device)"),
    "a directory": ("keys", "dir", "is a directory"),
    "an empty path": ("", None, "ledger_public_key: '' is empty"),
    "a blank path": ("  ", None, "ledger_public_key: '  ' is empty"),
}


@pytest.mark.parametrize("kind", KEY_FILES)
def test_a_key_file_that_is_a_fifo_a_device_or_empty_is_refused_at_once(tmp_path, kind):
    """A FIFO named as the ledger public key blocked build and publish (the key was opened and read); /dev/zero
    read forever; `ledger_public_key = ""` turned verification off without a word. Each is refused now before it
    is opened, in one line, exit 2, within seconds (the run is stopped at 30 s: a hang fails here)."""
    import os

    names = f"127.0.0.1:5000/builder-test-sg{uuid.uuid4().hex[:8]}"
    run = Run(tmp_path, names, "127.0.0.1:1/nowhere")
    named, make, words = KEY_FILES[kind]
    if make == "fifo":
        os.mkfifo(run.matrix.parent / named)
    elif make == "dir":
        (run.matrix.parent / named).mkdir()
    text = run.matrix.read_text()
    run.matrix.write_text(text.replace(f'registry = "{names}"', f'registry = "{names}"\nledger_public_key = "{named}"'))
    pem, _ = pair()
    for verb in ("build", "publish"):
        res = builder(*run.args(verb, tmp_path / "r", "--dry-run"), cwd=tmp_path, timeout=30, env={signing.ENV: pem})
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], f"{verb}: {res.stderr}"
        assert "ledger_public_key" in lines[0] and "MII" not in res.stderr + res.stdout, lines[0]


@pytest.mark.pure
def test_a_key_or_record_read_never_opens_a_fifo_or_device_and_reads_at_most_its_limit(tmp_path):
    """builder/files.py read_regular, under the public key, the local ledger's records and the wheelhouse manifests:
    a FIFO, a device or a directory is refused before it is opened; a file is read up to its limit + 1 bytes."""
    import os

    from builder import files
    from builder.cache.local import Wheelhouse

    os.mkfifo(tmp_path / "fifo")
    for path, error in ((tmp_path / "fifo", files.NotRegular), (Path("/dev/zero"), files.NotRegular),
                        (tmp_path, IsADirectoryError)):
        with pytest.raises(error):
            files.read_regular(path, 100)
    (tmp_path / "big").write_bytes(b"x" * 1000)
    assert files.read_regular(tmp_path / "big", 10) == b"x" * 11 and files.read_regular(tmp_path / "big", 5000) == b"x" * 1000
    with pytest.raises(UserError, match="fifo: not a regular file .*; the ledger public key must be a file"):
        files.read_bytes(tmp_path / "fifo", "ledger public key")
    book = ledger.Ledger(tmp_path / "ledger")
    (tmp_path / "ledger").mkdir()
    os.mkfifo(book.path(KEY))
    entry, why = book.read(KEY)
    assert entry is None and "not a regular file" in why
    wh = Wheelhouse(tmp_path / "wh")
    wh.entry_dir("demo", KEY).mkdir(parents=True)
    os.mkfifo(wh.entry_dir("demo", KEY) / "builder-wheel.json")
    assert "not a regular file" in wh.read_manifest("demo", KEY)["__unreadable__"]
