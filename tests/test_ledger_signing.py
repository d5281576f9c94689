"""Trust across runners is a signature (builder/image/signing.py, builder/image/reuse.py): the ledger record a
registry keeps beside an image is a DSSE envelope signed with the key CI holds (BUILDER_LEDGER_SIGNING_KEY), and
where the matrix names the public key ([defaults] ledger_public_key) a record that is unsigned, signed by another
key or edited after it was signed is never adopted. Where it names none, the registry's word is taken and said once.
Real keys made here, a real registry on 127.0.0.1, the real fixture cell for the end-to-end case."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from builder import redact
from builder.errors import UserError
from builder.image import ledger, reuse, signing
from builder.registry_api import Endpoint, RegistryPath

from .helpers import commit_image
from .helpers import CUDA_EXT_CELL as CELL
from .registry_runs import TAG, Run, builder, digest_in, forget_locally, local_id, push_under_tag

DIGEST = "sha256:" + "d" * 64
FORGED = "sha256:" + "f" * 64
KEY = "c" * 64


def pair(kind: str = "ecdsa") -> tuple[str, bytes]:
    """(private key PEM text, public key PEM bytes), made here."""
    private = ec.generate_private_key(ec.SECP256R1()) if kind == "ecdsa" else ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    pub = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem, pub


def keys(tmp: Path, kind: str = "ecdsa"):
    pem, pub = pair(kind)
    (tmp / f"{kind}.pub").write_bytes(pub)
    return signing.signer_from_env({signing.ENV: pem}), signing.public_key(tmp / f"{kind}.pub", "test"), pem


def source_of(registry_path: str) -> RegistryPath:
    return RegistryPath(registry_path, Endpoint(registry_path.split("/")[0], tls_verify=False))


def edit_record(source: RegistryPath, repo: str, key: str, digest: str) -> None:
    """One digest line added to the payload of the signed record, its signature kept as it was."""
    tag = reuse.record_tag(key)
    with reuse.Client(source) as client:
        doc = json.loads(client.manifest(repo, tag, accept=reuse.OCI_MANIFEST)[0])
        layer = doc["layers"][0]
        assert layer["mediaType"] == signing.DSSE_TYPE
        envelope = json.loads(client.blob(repo, layer["digest"], 1 << 21))
        payload = json.loads(base64.b64decode(envelope["payload"]))
        payload["images"][digest] = {"cell": CELL, "recorded": "2026-01-01T00:00:00Z"}
        envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
        body = json.dumps(envelope).encode()
        layer.update(digest=client.upload(repo, body), size=len(body))
        resp = client.send("PUT", client.url(repo, "manifests", tag), repo, push=True, data=json.dumps(doc).encode(),
                           headers={"Content-Type": reuse.OCI_MANIFEST})
        assert resp.status_code == 201, resp.status_code


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
    verdict = reuse.judge(reuse.Claim("image x", FORGED, KEY), KEY, KEY, None,
                          lambda k: reuse.Voucher(back, "", "this host's image ledger"))
    assert isinstance(verdict, reuse.Reuse)
    assert "this host's image ledger took from the registry on the word of ledger record R, signed by key K" in verdict.why


def test_only_a_record_the_matrix_key_signed_is_adopted(registry, tmp_path):
    """Against the real registry, through the client a build uses: signed and adopted; unsigned, another key's, an
    edited payload: not adopted, each said in one line; without a key: read on the registry's word."""
    signer, trusted, _ = keys(tmp_path)
    other, other_trusted, _ = keys(tmp_path, "ed25519")
    path = f"{registry}/sg{uuid.uuid4().hex[:8]}"
    source, repo = source_of(path), f"{path}/cuda-ext"
    record = f"{repo}:{reuse.record_tag(KEY)}"
    entry = ledger.Entry(KEY, {DIGEST: {"cell": CELL, "recorded": "2026-01-01T00:00:00Z"}})
    claim = reuse.Claim(f"registry: {repo}:{TAG}", DIGEST, KEY)

    def verdict(key=trusted, digest=DIGEST):
        with reuse.Client(source) as client:
            return reuse.judge(reuse.Claim(claim.where, digest, KEY), KEY, KEY, None,
                               reuse.registry_voucher(client, repo, published=False, trusted=key))

    with reuse.Client(source) as client:
        client.push_record(repo, entry, signer)
        got = client.read_record(repo, KEY, trusted)
        assert got.entry.images == entry.images and got.signed_by == trusted.keyid and not got.problem
        assert client.read_record(repo, KEY, None).entry.images == entry.images  # no key: the registry's word
    v = verdict()
    assert isinstance(v, reuse.Reuse) and v.kind == reuse.SIGNED
    assert v.vouched_by == f"ledger record {record}, signed by key {signing.short(trusted.keyid)}"
    assert f"(ledger record {record}, signed by key {signing.short(trusted.keyid)})" in v.why

    v = verdict(other_trusted)  # signed, but by a key the matrix does not name
    assert isinstance(v, reuse.Build)
    assert (f"its ledger record {record} is signed by key {signing.short(trusted.keyid)}, not by the matrix's key "
            f"{signing.short(other_trusted.keyid)}: not adopted") in v.why and "\n" not in v.why

    edit_record(source, repo, KEY, FORGED)  # one digest line added, the signature kept
    for digest in (DIGEST, FORGED):
        v = verdict(digest=digest)
        assert isinstance(v, reuse.Build) and "does not verify (its payload was edited" in v.why, v
    v = verdict(None, FORGED)  # no key named: the registry's word, and so the edit passes
    assert isinstance(v, reuse.Reuse) and v.kind == reuse.UNSIGNED
    assert v.vouched_by == f"the registry's unsigned record {record}"

    with reuse.Client(source) as client:
        client.push_record(repo, entry)  # unsigned
    v = verdict()
    assert isinstance(v, reuse.Build) and f"its ledger record {record} is unsigned: not adopted" in v.why

    # publish with the key: an unsigned record there is replaced, its lines never signed again
    forged = ledger.Entry(KEY, {FORGED: {"cell": CELL, "recorded": "2026-01-01T00:00:00Z"}})
    with reuse.Client(source) as client:
        client.push_record(repo, forged)
    note = reuse.merge_and_push(source, repo, KEY, lambda e: ledger.add_image(e, DIGEST, CELL), signer=signer)
    assert "replaced a ledger record the matrix's key did not sign" in note
    with reuse.Client(source) as client:
        got = client.read_record(repo, KEY, trusted)
    assert set(got.entry.images) == {DIGEST} and got.signed_by == trusted.keyid

    # said once per run
    first, again = reuse.trust_line(path), reuse.trust_line(path)
    assert first and not again and signing.ENV in first and signing.MATRIX_KEY in first


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


def test_a_signed_record_is_adopted_and_a_forged_one_never_reaches_the_local_ledger(registry, local_bases,
                                                                                     docker_engine, tmp_path):
    """The fixture cell published with a signing key, the matrix naming its public key. A fresh runner pulls it and
    records the digest with who vouched; a later build there says so. The probe: an image committed FROM the cell
    plus one layer pushed under the cell's tag and one line added to the signed record: refused (the signature does
    not verify), the cell built, the forged digest nowhere in the local ledger. With no key named: the registry's
    word, said once, and nothing written to the local ledger."""
    suffix = uuid.uuid4().hex[:8]
    names = f"127.0.0.1:5000/builder-test-sg{suffix}"
    run = Run(tmp_path, names, f"{registry}/sg{suffix}")
    pem, pub = pair()
    (run.matrix.parent / "ledger.pub").write_bytes(pub)
    plain = run.matrix.read_text()
    run.matrix.write_text(plain.replace(f'registry = "{names}"', f'registry = "{names}"\nledger_public_key = "ledger.pub"'))
    keyid = signing.short(signing.public_key(run.matrix.parent / "ledger.pub", "test").keyid)
    host, repo = run.repo.split("/", 1)
    try:
        res, steps, where = run.run("publish", env={signing.ENV: pem})
        digest = steps[f"publish:{CELL}"]["artifacts"]["digest"]
        key = steps[f"image:{CELL}"]["artifacts"]["content_key"]
        record = f"{run.repo}:{reuse.record_tag(key)}"
        assert f"ledger record {record} signed by key {keyid}" in res.stderr
        for f in [*where.rglob("*"), *tmp_path.glob("pins/*")]:  # the private key is nowhere builder wrote
            if f.is_file():
                assert "PRIVATE KEY" not in f.read_text(errors="replace"), f

        # a fresh runner: adopted on the signature, recorded with who vouched
        res, steps, where = run.run("build", "--no-smoke", "--reuse-from", run.registry)
        image = steps[f"image:{CELL}"]["artifacts"]
        assert image["pulled"] is True and image["digest"] == digest, res.stderr[-3000:]
        assert f"(ledger record {record}, signed by key {keyid})" in res.stderr
        assert "takes the registry's word" not in res.stderr
        local = json.loads((where / "wheelhouse" / ".images" / f"{key}.json").read_text())
        assert local["images"][digest]["vouched_by"] == f"ledger record {record}, signed by key {keyid}"
        # that runner again, the registry out of reach: its own ledger reuses it, saying on whose word
        res, steps, _ = run.run("build", "--no-smoke", "--reuse-from", "none", where=where)
        image = steps[f"image:{CELL}"]["artifacts"]
        assert image["reused"] is True and not image.get("pulled") and image["digest"] == digest
        assert f"took from the registry on the word of ledger record {record}, signed by key {keyid}" in res.stderr

        # the probe: an image FROM the cell plus a layer under the cell's tag, one line added to the signed record
        derived_ref = f"{run.ref}-derived"
        commit_image(run.ref, derived_ref)
        push_under_tag(derived_ref, f"{run.repo}:{TAG}")
        forget_locally(derived_ref)
        served = digest_in(host, repo, TAG)
        assert served not in (None, digest)
        edit_record(source_of(run.registry), run.repo, key, served)
        res, steps, where = run.run("build", "--no-smoke", "--reuse-from", run.registry)
        image = steps[f"image:{CELL}"]["artifacts"]
        assert image["reused"] is False and image["digest"] != served, image
        said = [l for l in res.stderr.splitlines() if "not adopted" in l]
        assert len(said) == 1 and f"its signature by key {keyid} does not verify" in said[0], res.stderr[-3000:]
        for f in (where / "wheelhouse" / ".images").glob("*.json"):
            assert served not in f.read_text()
        assert local_id(run.ref) != served

        # no key named: the registry's unsigned word (the edited record, the tag back on the published image),
        # said once; the pulled digest is not written into this runner's ledger
        run.matrix.write_text(plain)
        moved = subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false",
                                "--dest-tls-verify=false", f"docker://{run.repo}@{digest}", f"docker://{run.repo}:{TAG}"],
                               capture_output=True, text=True)
        assert moved.returncode == 0, moved.stderr
        res, steps, where = run.run("build", "--no-smoke", "--reuse-from", run.registry)
        image = steps[f"image:{CELL}"]["artifacts"]
        assert image["pulled"] is True and image["digest"] == digest
        trust = [l for l in res.stderr.splitlines() if "takes the registry's word" in l]
        assert len(trust) == 1 and signing.ENV in trust[0]
        assert f"(the registry's unsigned record {record})" in res.stderr
        assert not list((where / "wheelhouse" / ".images").glob("*.json"))
    finally:
        forget_locally(run.ref)
