"""Attestations of a published image: what a deployer checks offline, by digest, before it runs the image.

Each attestation is an in-toto Statement v1 whose subject is the image's digest — the SLSA provenance v1 of the build
(builder/image/provenance.py) and the SPDX 2.3 SBOM of the platform image (builder/image/sbom.py). Signed, it is a
DSSE envelope (payload type application/vnd.in-toto+json) made by the same key machinery as the ledger record
(builder/image/signing.py: securesystemslib's Envelope, Ed25519 or ECDSA P-256), carried in a Sigstore bundle v0.3
whose verification material is the public key's hint (its key id): what `cosign verify-attestation --key` and
`cosign attest --new-bundle-format` read and write. Unsigned (no key given to publish), it is the bare statement, of
media type application/vnd.in-toto+json, as BuildKit's own attestations are.

Each is attached to the digest it is about as an OCI 1.1 artifact manifest with a `subject`:

    {"mediaType": OCI manifest, "artifactType": <the layer's media type>, "config": the empty descriptor,
     "layers": [the bundle or statement], "subject": {the image's descriptor},
     "annotations": {"dev.sigstore.bundle.predicateType": P, "org.opencontainers.image.created": T}}

pushed by its digest. A registry with the referrers API lists it by itself (it answers the push with OCI-Subject);
one without (distribution 2.8 answers /v2/<repo>/referrers/<digest> with 404) gets the referrers tag schema that cosign
3 and oras fall back to: the index REPOSITORY:sha256-<hex> listing every referrer, read, extended and pushed again.

The provenance is attached to the top digest (an index, where the image has one) and to the platform manifest; the
SBOM to the platform manifest, whose files it lists. The statement's subject names every digest it is about, so a
statement moved onto another image does not verify there.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import time
from dataclasses import dataclass

from . import signing
from ..registry_api import OCI_INDEX, OCI_MANIFEST, Unusable, referrers_tag

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
IN_TOTO = "application/vnd.in-toto+json"  # the DSSE payload type, and an unsigned statement's media type
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
SLSA = "https://slsa.dev/provenance/v1"
SPDX = "https://spdx.dev/Document"
CYCLONEDX = "https://cyclonedx.org/bom"
KINDS = {SLSA: "provenance", SPDX: "sbom", CYCLONEDX: "sbom"}
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"  # on the referrer manifest, as cosign 3 writes it
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
CREATED = "org.opencontainers.image.created"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
MAX_BYTES = 64 << 20  # an attestation's blob: the SBOM of a real engine image is a few MB


def statement(subjects: dict[str, str], predicate_type: str, predicate: dict) -> dict:
    """The in-toto statement about `subjects` ({name: "sha256:<hex>"})."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}
                        for name, digest in subjects.items()],
            "predicateType": predicate_type, "predicate": predicate}


def subject_digests(doc: dict) -> set[str]:
    """Every "sha256:<hex>" a statement's subject names."""
    out = set()
    for s in doc.get("subject") or []:
        if isinstance(s, dict) and isinstance(s.get("digest"), dict) and isinstance(s["digest"].get("sha256"), str):
            out.add("sha256:" + s["digest"]["sha256"])
    return out


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def seal(doc: dict, signer=None) -> tuple[str, bytes]:
    """(media type, bytes) of a statement as attached: a Sigstore bundle holding its signed DSSE envelope, or with
    no signer the bare statement."""
    payload = _canonical(doc)
    if signer is None:
        return IN_TOTO, payload
    envelope = signing.envelope(payload, IN_TOTO, signer)
    bundle = {"mediaType": BUNDLE,
              "verificationMaterial": {"publicKey": {"hint": signer.public_key.keyid}, "tlogEntries": []},
              "dsseEnvelope": envelope}
    return BUNDLE, _canonical(bundle)


@dataclass(frozen=True)
class Opened:
    """An attestation as read: its statement (None: `problem` says why), and the key id whose signature verified
    ("" when unsigned, or when no key was given to check it)."""

    statement: dict | None
    signed_by: str = ""
    signatures: tuple[str, ...] = ()  # the key ids its envelope names
    problem: str = ""


def open_(media_type: str, raw: bytes, where: str, keys=()) -> Opened:
    """Read what `seal` wrote. With `keys` (public keys, SSlibKey) a bundle is opened only when one of them signed
    it and that signature verifies over the envelope's PAE; an unsigned statement is returned unsigned (the caller
    decides whether that is enough)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return Opened(None, problem=f"{where}: not JSON")
    if not isinstance(doc, dict):
        return Opened(None, problem=f"{where}: not a JSON object")
    if media_type == IN_TOTO:
        return _statement(doc, where)
    if media_type != BUNDLE:
        return Opened(None, problem=f"{where}: media type {media_type[:80]!r} is neither {BUNDLE} nor {IN_TOTO}")
    env = doc.get("dsseEnvelope")
    if doc.get("mediaType") != BUNDLE or not isinstance(env, dict):
        return Opened(None, problem=f"{where}: not a Sigstore bundle v0.3 with a DSSE envelope")
    from securesystemslib.dsse import Envelope

    try:
        envelope = Envelope.from_dict(copy.deepcopy(env))
    except Exception as exc:  # noqa: BLE001 - securesystemslib's FormatError, binascii, KeyError alike
        return Opened(None, problem=f"{where}: not a DSSE envelope ({type(exc).__name__})")
    if envelope.payload_type != IN_TOTO:
        return Opened(None, problem=f"{where}: its DSSE payload type is {envelope.payload_type[:80]!r}, not {IN_TOTO}")
    named = tuple(sorted(envelope.signatures))
    signed_by = ""
    for key in keys:
        if key.keyid in envelope.signatures:
            try:
                envelope.verify([key], 1)
            except Exception:  # noqa: BLE001 - VerificationError, or a malformed signature: refused alike
                return Opened(None, signatures=named, problem=(
                    f"{where}: its signature by key {signing.short(key.keyid)} does not verify (the statement was "
                    "changed after it was signed, or the signature is not that key's)"))
            signed_by = key.keyid
            break
    try:
        inner = json.loads(envelope.payload)
    except (ValueError, RecursionError):
        return Opened(None, signatures=named, problem=f"{where}: its payload is not JSON")
    got = _statement(inner, where) if isinstance(inner, dict) else Opened(None, problem=f"{where}: payload not an object")
    return Opened(got.statement, signed_by, named, got.problem)


def _statement(doc: dict, where: str) -> Opened:
    if doc.get("_type") != STATEMENT_TYPE or not isinstance(doc.get("predicateType"), str) \
            or not isinstance(doc.get("predicate"), dict) or not subject_digests(doc):
        return Opened(None, problem=f"{where}: not an in-toto Statement v1 (_type, subject digests, predicateType, "
                                    "predicate)")
    return Opened(doc)


# -- the registry side -------------------------------------------------------------------------------------------
def attach(client, repository: str, subject: dict, media_type: str, data: bytes, predicate_type: str,
           created: str) -> str:
    """Push one attestation as a referrer of `subject` (the image's descriptor) and list it where readers look; the
    referrer manifest's digest."""
    layer = client.upload(repository, data)
    client.upload(repository, EMPTY)
    annotations = {PREDICATE_ANNOTATION: predicate_type, CREATED: created}
    if media_type == BUNDLE:
        annotations[CONTENT_ANNOTATION] = "dsse-envelope"
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": media_type,
                "config": {"mediaType": EMPTY_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY).hexdigest(),
                           "size": len(EMPTY)},
                "layers": [{"mediaType": media_type, "digest": layer, "size": len(data)}],
                "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
                "annotations": annotations}
    body = _canonical(manifest)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    answer = client.put_manifest(repository, digest, body, OCI_MANIFEST)
    if not any(k.lower() == "oci-subject" for k in answer):  # no referrers API: the tag schema, read and extended
        _list_in_tag(client, repository, subject["digest"], {"mediaType": OCI_MANIFEST, "digest": digest,
                                                             "size": len(body), "artifactType": media_type,
                                                             "annotations": annotations})
    return digest


def _list_in_tag(client, repository: str, subject: str, descriptor: dict) -> None:
    tag = referrers_tag(subject)
    got = client.manifest(repository, tag, accept=OCI_INDEX)
    listed = []
    if got is not None:
        doc = json.loads(got[0])
        listed = [d for d in doc.get("manifests") or [] if isinstance(d, dict) and d.get("digest") != descriptor["digest"]]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*listed, descriptor]}
    client.put_manifest(repository, tag, _canonical(index), OCI_INDEX)


def attach_image(where, repository: str, archive, image, provenance: dict, signer, say, sbom_doc=None,
                 cyclonedx: bool = False) -> list[dict]:
    """Attach an image's SBOM (to its platform manifest) and its SLSA provenance `provenance` (to its top digest and
    its platform manifest) in REPOSITORY of the registry `where`, signed by `signer` when given; what was attached,
    as images.json lists it. Called by publish and `warm --push`, before the image's tag is pushed. `sbom_doc`: the
    image's SBOM when it was made already (sbom.make of this archive); `cyclonedx`: its CycloneDX 1.5 form attached
    beside it (the SPDX one is what verify checks)."""
    from . import sbom
    from ..registry_api import Client

    created = now()
    if sbom_doc is None:
        say("SBOM: reading the image's layers")
    doc = sbom_doc or sbom.make(archive)
    counts = ", ".join(f"{n} {kind}" for kind, n in sbom.counts(doc).items())
    subjects = {repository: image.digest}
    tops = [image.descriptor]
    if image.manifest_digest != image.digest:  # an index: the provenance names (and is attached to) both
        subjects[f"{repository} (platform manifest)"] = image.manifest_digest
        tops.append(image.manifest_descriptor)
    made = [(image.manifest_descriptor, statement({repository: image.manifest_digest}, SPDX, doc))]
    if cyclonedx:
        made.append((image.manifest_descriptor,
                     statement({repository: image.manifest_digest}, CYCLONEDX, sbom.to_cyclonedx(doc))))
    made += [(d, statement(subjects, SLSA, provenance)) for d in tops]
    out = []
    with Client(where) as client:
        for subject, doc in made:
            kind, data = seal(doc, signer)
            digest = attach(client, repository, subject, kind, data, doc["predicateType"], created)
            out.append({"kind": KINDS[doc["predicateType"]], "predicateType": doc["predicateType"],
                        "subject": subject["digest"], "digest": digest, "mediaType": kind,
                        "signed_by": signer.public_key.keyid if signer is not None else ""})
    say(f"attached the SBOM ({counts}) and the SLSA provenance to {repository}@{image.digest}, "
        + (f"signed by key {signing.short(signer.public_key.keyid)}" if signer is not None else
           f"UNSIGNED (no {signing.ENV}): a deployer can read them, not verify who made them"))
    return out


@dataclass(frozen=True)
class Attached:
    """One referrer of an image digest as read back: the manifest, its predicate type, what it opened to."""

    digest: str  # the referrer manifest's
    subject: str  # the digest it is attached to
    predicate_type: str
    opened: Opened

    @property
    def kind(self) -> str:
        return KINDS.get(self.predicate_type, self.predicate_type)


def read(client, repository: str, subject: str, keys=()) -> tuple[list[Attached], str]:
    """Every attestation attached to `subject`, each opened (and, with `keys`, its signature checked); and how they
    were found ("api" or "tag"). A referrer that is not an attestation (another artifact type) is left out; one that
    cannot be read is returned with its problem."""
    listed, how = client.referrers(repository, subject)
    out = []
    for d in listed:
        kind = d.get("artifactType", "")
        if kind not in (BUNDLE, IN_TOTO):
            continue
        where = f"{repository}@{d['digest'][:19]}…"
        predicate = (d.get("annotations") or {}).get(PREDICATE_ANNOTATION, "")
        try:
            opened = _read_one(client, repository, d["digest"], subject, where, keys)
        except Unusable as exc:
            opened = Opened(None, problem=str(exc))
        if opened.statement is not None:
            predicate = opened.statement["predicateType"]
        out.append(Attached(d["digest"], subject, predicate, opened))
    return out, how


def _read_one(client, repository: str, digest: str, subject: str, where: str, keys) -> Opened:
    got = client.manifest(repository, digest, accept=OCI_MANIFEST)
    if got is None:
        return Opened(None, problem=f"{where}: listed as a referrer, but not in the registry")
    doc = json.loads(got[0])
    layers = doc.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict) \
            or (doc.get("subject") or {}).get("digest") != subject:
        return Opened(None, problem=f"{where}: not an attestation of {subject[:19]}… (one layer, that subject)")
    raw = client.blob(repository, layers[0].get("digest", ""), MAX_BYTES)
    return open_(layers[0].get("mediaType", ""), raw, where, keys)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def now() -> str:
    """UTC now, as the attestations write times (RFC 3339, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = ["Attached", "BUNDLE", "IN_TOTO", "Opened", "SLSA", "SPDX", "attach", "open_", "read", "seal", "statement",
           "subject_digests"]
