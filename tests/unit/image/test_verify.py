"""`builder verify` (builder/image/verify.py) against a real registry on 127.0.0.1 (distribution 2.8: no referrers API,
so the referrers tag schema), real keys made here, an image holding a real nvcc-built library, and its SBOM and
provenance attached as publish attaches them. The good image passes; every tampering of the suite is refused, with
one line naming the check."""

from __future__ import annotations

import base64
import datetime
import json

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import UserError
from builder.image import attest, labels, provenance, verify
from builder.registry_api import OCI_INDEX, Client, RegistryPath, referrers_tag
from tests.support import attest as support
from tests.support import audit as audit_support
from tests.support.ledger_signing import keys

built = audit_support.built
host_cc = audit_support.host_cc


def _publish_toy(registry: str, lib: bytes, tmp_path, path: str, sass: str = "sm_80,sm_90",
                 cyclonedx: bool = False) -> dict:
    """An image of cell CELL holding `lib` (labels claiming `sass`) published to REGISTRY/PATH/toy:1.0 with its
    attestations signed by a key made here."""
    signer, trusted, _ = keys(tmp_path)
    where = RegistryPath.parse(f"{registry}/{path}", "test")
    repository = where.repository("toy")
    archive = tmp_path / "image.oci.tar"
    image = support.archive(archive, lib, support.image_labels(sass))
    attached = support.publish(where, repository, "1.0", archive, image, support.cell_provenance(), signer, cyclonedx)
    return {"where": where, "repository": repository, "image": image, "signer": signer, "trusted": trusted,
            "attached": attached, "tmp": tmp_path, "ref": f"{repository}:1.0@{image.digest}"}


@pytest.fixture
def published(registry, built, tmp_path):
    """An image of cell CELL in a fresh repository, with its attestations signed by `signer`."""
    return _publish_toy(registry, built["sm80_sm90"].read_bytes(), tmp_path,
                        f"t{tmp_path.name[-12:].lower().replace('_', '')}")


def _policy(p, *trusted, expires=None):
    return verify.Policy(tuple(verify.TrustedKey(k, f"key{i}", expires) for i, k in enumerate(trusted or [p["trusted"]])))


def _replace(p, kind: str, data_for) -> None:
    """Swap the attached attestation of `kind` for the one `data_for(bundle bytes) -> (media type, bytes)` makes, as
    someone with push rights could: a new referrer pushed, the old one taken out of the referrers tag's index."""
    old = next(a for a in p["attached"] if a["kind"] == kind)
    subject = p["image"].manifest_descriptor
    with Client(p["where"]) as client:
        body = json.loads(client.manifest(p["repository"], old["digest"])[0])
        raw = client.blob(p["repository"], body["layers"][0]["digest"], attest.MAX_BYTES)
        media, data = data_for(raw)
        attest.attach(client, p["repository"], subject, media, data, old["predicateType"], attest.now())
        index = json.loads(client.manifest(p["repository"], referrers_tag(subject["digest"]))[0])
        index["manifests"] = [d for d in index["manifests"] if d["digest"] != old["digest"]]
        client.put_manifest(p["repository"], referrers_tag(subject["digest"]), json.dumps(index).encode(), OCI_INDEX)


def _failed(p, ref=None, policy=None, lock=None) -> list[str]:
    report = verify.verify(ref or p["ref"], policy or _policy(p), lock)
    assert not report.ok
    return report.failed


def test_the_good_image_verifies_by_digest_and_by_tag(published):
    p = published
    report = verify.verify(p["ref"], _policy(p))
    assert report.ok, report.failed
    assert report.digest == p["image"].digest and not report.ignored
    assert any("(tag)" in line for line in report.passed)  # distribution 2.8: the referrers tag schema
    assert verify.verify(f"{p['repository']}:1.0", _policy(p)).ok
    assert {a["kind"] for a in p["attached"]} == {"sbom", "provenance"}
    assert all(a["signed_by"] == p["signer"].public_key.keyid and a["mediaType"] == attest.BUNDLE for a in p["attached"])


def test_one_byte_of_the_sbom_flipped_is_refused(published):
    def flipped(raw: bytes):
        bundle = json.loads(raw)
        payload = bytearray(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        at = payload.index(b"sm_90")
        payload[at + 4] = ord("8")  # sm_90 -> sm_80: what a forger would want a deployer to believe
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
        return attest.BUNDLE, json.dumps(bundle).encode()

    _replace(published, "sbom", flipped)
    failed = _failed(published)
    assert len(failed) == 1 and failed[0].startswith("sbom: no sbom attached to") and "does not verify" in failed[0]


def test_an_sbom_re_signed_with_another_key_is_refused(published, tmp_path):
    other, _, _ = keys(tmp_path, "ed25519")

    def resigned(raw: bytes):
        bundle = json.loads(raw)
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        return attest.seal(statement, other)

    _replace(published, "sbom", resigned)
    failed = _failed(published)
    assert len(failed) == 1 and "which the policy does not list" in failed[0] and failed[0].startswith("sbom:")


def test_a_provenance_of_another_digest_is_refused(published):
    p = published
    other = "sha256:" + "9" * 64

    def moved(raw: bytes):
        doc = attest.statement({p["repository"]: other}, attest.SLSA, support.cell_provenance())
        return attest.seal(doc, p["signer"])

    old = next(a for a in p["attached"] if a["kind"] == "provenance")
    with Client(p["where"]) as client:  # the provenance lives on the (manifest) digest itself here
        attest.attach(client, p["repository"], p["image"].descriptor, *moved(b""), attest.SLSA, attest.now())
        tag = referrers_tag(p["image"].digest)
        index = json.loads(client.manifest(p["repository"], tag)[0])
        index["manifests"] = [d for d in index["manifests"] if d["digest"] != old["digest"]]
        client.put_manifest(p["repository"], tag, json.dumps(index).encode(), OCI_INDEX)
    failed = _failed(p)
    assert failed[0].startswith("provenance: no provenance") and "not the digest it is attached to" in failed[0]


def test_the_sbom_of_another_platform_is_refused(published, built, tmp_path):
    p = published
    arm = support.archive(tmp_path / "arm.oci.tar", built["sm90a"].read_bytes(), support.image_labels("sm_90a"))
    from builder.image import sbom

    def other_platform(raw: bytes):  # a genuine, signed SBOM — of another platform manifest
        doc = attest.statement({p["repository"]: arm.manifest_digest}, attest.SPDX, sbom.make(tmp_path / "arm.oci.tar"))
        return attest.seal(doc, p["signer"])

    _replace(p, "sbom", other_platform)
    failed = _failed(p)
    assert failed[0].startswith("sbom: no sbom") and "not the digest it is attached to" in failed[0]


def test_attestations_dropped_are_refused(published):
    p = published
    with Client(p["where"]) as client:
        client.put_manifest(p["repository"], referrers_tag(p["image"].digest),
                            json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode(), OCI_INDEX)
    failed = _failed(p)
    assert failed == [f"provenance: no provenance attached to {p['image'].digest[:19]}… passes (none is attached)",
                      f"sbom: no sbom attached to {p['image'].digest[:19]}… passes (none is attached)"]


def test_a_tag_moved_to_another_digest_is_refused(published, built, tmp_path):
    p = published
    other = support.archive(tmp_path / "other.oci.tar", built["sm80"].read_bytes(), support.image_labels("sm_80"))
    with Client(p["where"]) as client:
        support.push(client, p["repository"], "1.0", tmp_path / "other.oci.tar")
    failed = _failed(p)
    assert failed == [f"digest: 1.0 names {other.digest}, not the digest asked {p['image'].digest}: the tag moved"]
    # the tag alone: what it names now carries no attestation
    assert len(_failed(p, ref=f"{p['repository']}:1.0")) == 2
    assert verify.verify(f"{p['repository']}@{p['image'].digest}", _policy(p)).ok  # the digest still verifies


def test_an_expired_key_and_an_unlisted_key_are_refused(published, tmp_path):
    p = published
    yesterday = datetime.date.today() - datetime.timedelta(days=1)
    failed = _failed(p, policy=_policy(p, expires=yesterday))
    assert len(failed) == 2 and all(f"which expired on {yesterday}" in line for line in failed)
    assert verify.verify(p["ref"], _policy(p, expires=datetime.date.today())).ok  # its last day still counts
    _, stranger, _ = keys(tmp_path, "ed25519")
    failed = _failed(p, policy=_policy(p, stranger))
    assert len(failed) == 2 and all("which the policy does not list" in line for line in failed)


def test_sources_other_than_the_lock_pins_are_refused(published, tmp_path):
    from builder.lockfile import Lock

    p = published
    lock_path = tmp_path / "matrix.lock"
    lock_path.write_text('format = 1\n[packages."toykern==1.0".git]\nrepository = "https://github.com/example/toykern"\n'
                         f'tag = "v1.0"\ncommit = "{"b" * 40}"\n')
    failed = _failed(p, lock=Lock.load(lock_path))
    assert failed == [f"provenance: toykern==1.0: built from commit {'a' * 12}, matrix.lock pins {'b' * 12}"]
    lock_path.write_text(lock_path.read_text().replace("b" * 40, support.COMMIT))
    assert verify.verify(p["ref"], _policy(p), Lock.load(lock_path)).ok


def test_labels_that_claim_other_archs_than_the_sbom_found_are_refused(registry, built, tmp_path):
    """An image whose labels claim sm_90a for a library that holds sm_80 and sm_90: its own SBOM, genuine and signed,
    lists what the library holds, and verify says the two disagree."""
    p = _publish_toy(registry, built["sm80_sm90"].read_bytes(), tmp_path, "claims", sass="sm_80,sm_90a")
    report = verify.verify(f"{p['repository']}@{p['image'].digest}", _policy(p))
    assert len(report.failed) == 1 and report.failed[0].startswith("sbom: ") and "sm_90a" in report.failed[0]


def test_a_forged_warm_layer_claim_is_refused(registry, built, tmp_path):
    """A warm image's provenance names its cold image, warm key and layer. The genuine provenance moved onto an
    image with another layer is about another digest; one signed for that image but naming another layer, or labels
    that claim another warm key, disagree with the image."""
    signer, trusted, _ = keys(tmp_path)
    policy = verify.Policy((verify.TrustedKey(trusted, "ci"),))
    where = RegistryPath.parse(f"{registry}/warm", "test")
    repository = where.repository("toy")
    cold = "sha256:" + "c" * 64
    warm_labels = {labels.WARM: "1", labels.WARM_OF: f"{repository}@{cold}", labels.WARM_KEY: '{"gpu":"H200"}'}
    lib = built["sm80_sm90"].read_bytes()

    def warm_image(name: str, cache_file: bytes, claimed: dict):
        path = tmp_path / f"{name}.oci.tar"
        image = support.archive(path, lib, support.image_labels(extra=claimed),
                                more={"opt/jit-cache/triton/k.cubin": cache_file})
        return path, image

    def warm_provenance(image, key='{"gpu":"H200"}', layer=None):
        facts = {"key": key, "strategy": "MTP2"}
        return provenance.warm_predicate(f"{repository}@{cold}", layer or image.layers[-1]["digest"], facts,
                                         started="2026-12-05T00:00:00Z", finished="2026-12-05T00:00:01Z")

    path, good = warm_image("good", b"genuine", warm_labels)
    support.publish(where, repository, "good", path, good, warm_provenance(good), signer)
    assert verify.verify(f"{repository}@{good.digest}", policy).ok
    # 1. another layer, the genuine provenance copied onto it
    path, forged = warm_image("forged", b"forged kernels", warm_labels)
    with Client(where) as client:
        support.push(client, repository, "forged", path)
        for d in (forged.descriptor,):
            kind, data = attest.seal(attest.statement({repository: good.digest}, attest.SLSA, warm_provenance(good)),
                                     signer)
            attest.attach(client, repository, d, kind, data, attest.SLSA, attest.now())
    assert "not the digest it is attached to" in " ".join(_report(f"{repository}@{forged.digest}", policy))
    # 2. signed for this very image, but naming another layer than the one it has
    path, lying = warm_image("lying", b"other kernels", warm_labels)
    support.publish(where, repository, "lying", path, lying, warm_provenance(lying, layer=good.layers[-1]["digest"]),
                    signer)
    failed = _report(f"{repository}@{lying.digest}", policy)
    assert len(failed) == 1 and failed[0].startswith("warm: the warm layer the provenance names")
    # 3. labels that claim another warm key than the provenance's
    path, relabelled = warm_image("relabelled", b"genuine", {**warm_labels, labels.WARM_KEY: '{"gpu":"H100"}'})
    support.publish(where, repository, "relabelled", path, relabelled, warm_provenance(relabelled), signer)
    failed = _report(f"{repository}@{relabelled.digest}", policy)
    assert failed == ["warm: the warm key of the labels is not the provenance's"]


def _report(ref, policy) -> list[str]:
    report = verify.verify(ref, policy)
    assert not report.ok
    return report.failed


def test_the_verb_exits_0_1_2_and_3(published, tmp_path):
    p = published
    pub = tmp_path / "ci.pub"
    pub.write_bytes((p["tmp"] / "ecdsa.pub").read_bytes())  # the public half keys() wrote for the fixture's signer
    run = CliRunner().invoke
    ok = run(main, ["verify", p["ref"], "--key", str(pub)])
    assert ok.exit_code == 0 and ok.output.startswith(f"verified {p['image'].digest}"), ok.output
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[[keys]]\npath = "ci.pub"\nname = "ci"\nexpires = {datetime.date.today() - datetime.timedelta(days=2)}\n')
    bad = run(main, ["verify", p["ref"], "--policy", str(policy)])
    assert bad.exit_code == 1 and bad.output.count("FAILED ") == 2 and "expired" in bad.output
    as_json = run(main, ["verify", p["ref"], "--key", str(pub), "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["verified"] is True
    for argv, words in ((["verify", p["ref"]], "name the publisher's public key"),
                        (["verify", "not a ref", "--key", str(pub)], "verify IMAGE"),
                        (["verify", p["ref"], "--key", str(tmp_path / "none.pub")], "No such file"),
                        (["verify", p["ref"], "--key", str(pub), "--lock", str(tmp_path / "none.lock")], "no such file")):
        got = run(main, argv)
        assert got.exit_code == 2 and words in got.output, (argv, got.output)
    down = run(main, ["verify", "127.0.0.1:9/x/y@sha256:" + "a" * 64, "--key", str(pub)])
    assert down.exit_code == 3 and "could not be read" in down.output


def test_a_policy_file_is_checked_before_any_request(tmp_path):
    (tmp_path / "p.toml").write_text('[[keys]]\npath = "k.pub"\nexpires = "soon"\n')
    (tmp_path / "k.pub").write_bytes(b"")
    with pytest.raises(UserError, match="is not a PEM public key|expires"):
        verify.load_policy(tmp_path / "p.toml")
    (tmp_path / "q.toml").write_text('[[keys]]\npath = "k.pub"\nrequire = 3\n')
    with pytest.raises(UserError, match="unknown key 'require'"):
        verify.load_policy(tmp_path / "q.toml")


def test_serve_smoke_and_doctor_say_whether_an_image_verifies_and_refuse_one_that_does_not(published, tmp_path,
                                                                                            monkeypatch):
    """--verify-key / --require-verified on the deployer's verbs: the check runs before anything is started or
    written; an image whose attestations were dropped is refused (exit 1), no key to check with is bad input (2)."""
    p = published
    pub = str(p["tmp"] / "ecdsa.pub")
    ref = f"{p['repository']}@{p['image'].digest}"
    from builder.cli.flags import Verification
    from builder.cli.verify import say_verified

    said = []
    assert say_verified(ref, Verification((pub,)), None, said.append) is True
    assert said == [f"verify: {ref} verified ({p['image'].digest}: signed SBOM and provenance)"]
    said.clear()
    assert say_verified(ref, Verification(), None, said.append) is None and said == []  # nothing asked, nothing said
    with Client(p["where"]) as client:  # the attestations dropped
        client.put_manifest(p["repository"], referrers_tag(p["image"].digest),
                            json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode(), OCI_INDEX)
    said.clear()
    assert say_verified(ref, Verification((pub,)), None, said.append) is False
    assert said[-1].endswith("does NOT verify; --require-verified refuses such an image")
    runner = CliRunner()
    cwd = tmp_path / "cwd"  # no matrix.toml here: the key comes from the flags or nowhere
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for argv in (["serve", ref, "--strategy", "MTP2", "--model", str(tmp_path)], ["smoke", ref, "--layers", "L0"],
                 ["doctor", "--host", ref]):
        refused = runner.invoke(main, [*argv, "--verify-key", pub, "--require-verified"])
        assert refused.exit_code == 1 and "does not verify (2 check(s) failed)" in refused.output, (argv, refused.output)
        assert "docker run" not in refused.output
        no_key = runner.invoke(main, [*argv, "--require-verified"])
        assert no_key.exit_code == 2 and "no key to verify with" in no_key.output, (argv, no_key.output)
    assert [f for f in cwd.rglob("*") if f.is_file()] == []  # nothing written


def test_a_cyclonedx_sbom_goes_beside_the_spdx_one_and_verify_checks_the_spdx_one(registry, built, tmp_path):
    p = _publish_toy(registry, built["sm80_sm90"].read_bytes(), tmp_path, "cdx", cyclonedx=True)
    assert sorted(a["predicateType"] for a in p["attached"]) == sorted([attest.SPDX, attest.CYCLONEDX, attest.SLSA])
    report = verify.verify(f"{p['repository']}@{p['image'].digest}", _policy(p))
    assert report.ok, report.failed
    assert any(line.startswith(f"sbom {attest.CYCLONEDX}") for line in report.passed)
    with Client(p["where"]) as client:
        (cdx,) = [a for a in attest.read(client, p["repository"], p["image"].manifest_digest, [p["trusted"]])[0]
                  if a.predicate_type == attest.CYCLONEDX]
    assert cdx.opened.signed_by == p["trusted"].keyid and cdx.opened.statement["predicate"]["specVersion"] == "1.5"
