"""Trust across runners is a signature (builder/image/signing.py, builder/image/reuse.py): the ledger record a

The Docker half of tests/unit/image/test_ledger_signing.py: its docstring says the rest."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid

import pytest

from builder.image import ledger, reuse, signing
from builder.registry_api import Endpoint, RegistryPath

from tests.helpers import CUDA_EXT_CELL as CELL
from tests.helpers import commit_image
from tests.registry_runs import TAG, Run, builder, digest_in, forget_locally, local_id, push_under_tag
from tests.support.ledger_signing import DIGEST, FORGED, KEY, keys, pair


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
            return reuse.judge(reuse.Claim(claim.where, digest, KEY), KEY,
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


# slow: a publish, a forged push and two builds; the default tier holds signing and verification in
# tests/unit/image/test_ledger_signing.py
@pytest.mark.slow
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
        # its SBOM and provenance, signed by the same key, attached before the tag: `builder verify` passes them
        listed = json.loads((where / "images.json").read_text())["images"][CELL]["referrers"]
        assert sorted(a["kind"] for a in listed) == ["provenance", "sbom"]
        assert all(a["signed_by"].startswith(keyid) and a["subject"] == digest for a in listed)
        assert f"and the SLSA provenance to {run.repo}@{digest}, signed by key {keyid}" in res.stderr
        pub_file = str(run.matrix.parent / "ledger.pub")
        checked = builder("verify", f"{run.repo}:{TAG}@{digest}", "--key", pub_file, cwd=tmp_path)
        assert checked.returncode == 0 and checked.stdout.startswith(f"verified {digest}"), checked.stdout + checked.stderr

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
        # the tag moved: verify by tag and digest says so; by the tag alone, what it names carries no attestation
        moved = builder("verify", f"{run.repo}:{TAG}@{digest}", "--key", pub_file, cwd=tmp_path)
        assert moved.returncode == 1 and f"FAILED digest: {TAG} names {served}, not the digest asked" in moved.stdout
        moved = builder("verify", f"{run.repo}:{TAG}", "--key", pub_file, cwd=tmp_path)
        assert moved.returncode == 1 and "(none is attached)" in moved.stdout, moved.stdout
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
