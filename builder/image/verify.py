"""`builder verify IMAGE@digest`: what a deployer checks before it runs an image, offline but for the registry.

One pass over the registry's answers (manifests, the config, the referrers and their blobs: no layer is pulled), each
check a line:

  digest       the registry serves the image by the digest asked (and a tag given with it still names that digest)
  signature    each attestation is signed by a key the deployer trusts (--key, or the policy's keys, not expired);
               an edited statement, another key's signature or none are refused
  subject      each statement names the digest it is attached to: the provenance the image's digest, the SBOM its
               platform manifest (an SBOM of another platform, a provenance of another image do not pass)
  provenance   a signed SLSA provenance is there; its cell and content key are the image's labels'; with --lock, the
               sources it says were built are the lock's commits and sdists
  sbom         a signed SBOM is there, and it lists every binary with device code with the SASS / PTX its labels
               claim (builder/image/sbom.py check_labels)
  warm         a warm image's provenance is a warm build's: the cold digest, the warm key and the warm layer it
               names are the image's own labels and last layer

At least one attestation of each kind must pass every check; any other attached to the digest that does not is said
as "ignored" (someone with push rights may add referrers; they cannot make one pass).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path

from . import attest, labels, provenance, signing
from .. import files, schema
from ..errors import UserError
from ..imageref import ImageRef

POLICY_BYTES = 1 << 20


@dataclass(frozen=True)
class TrustedKey:
    key: object  # securesystemslib SSlibKey
    name: str
    expires: datetime.date | None = None

    @property
    def keyid(self) -> str:
        return self.key.keyid


@dataclass(frozen=True)
class Policy:
    keys: tuple[TrustedKey, ...]
    require: tuple[str, ...] = ("provenance", "sbom")

    def key(self, keyid: str) -> TrustedKey | None:
        return next((k for k in self.keys if k.keyid == keyid), None)


def load_policy(path: Path | None, key_paths: tuple[Path, ...] = ()) -> Policy:
    """The keys a deployer trusts: each --key file, and the policy file's [[keys]] (path relative to the policy,
    optional `expires` date, `name`), and what it requires. UserError (exit 2) for a file that is not one."""
    keys = [TrustedKey(signing.public_key(Path(p), "--key"), str(p)) for p in key_paths]
    require: tuple[str, ...] = ("provenance", "sbom")
    if path is not None:
        data = files.load_toml(Path(path), "--policy", fix="; --policy takes a TOML file of [[keys]]")
        schema.check(f"--policy {path}", data, schema.VERIFY_POLICY)
        for i, entry in enumerate(data.get("keys", [])):
            where = f"--policy {path}: keys[{i}]"
            expires = entry.get("expires")
            if isinstance(expires, str):
                try:
                    expires = datetime.date.fromisoformat(expires)
                except ValueError:
                    raise UserError(f"{where}: expires {expires[:40]!r} is not a date (YYYY-MM-DD)") from None
            if isinstance(expires, datetime.datetime):
                expires = expires.date()
            keys.append(TrustedKey(signing.public_key(Path(path).resolve().parent / entry["path"], where),
                                   entry.get("name") or entry["path"], expires))
        require = tuple(data.get("require", require))
    if not keys:
        raise UserError("verify: name the publisher's public key (--key PUB.pem, or a --policy file with [[keys]]): "
                        "an attestation is only worth the key that signed it")
    return Policy(tuple(keys), require)


@dataclass
class Report:
    ref: str
    digest: str = ""
    failed: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and bool(self.digest)

    def check(self, name: str, ok: bool, line: str) -> bool:
        (self.passed if ok else self.failed).append(f"{name}: {line}")
        return ok

    def to_json(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "verified": self.ok, "failed": self.failed,
                "passed": self.passed, "ignored": self.ignored}


def verify(ref: str, policy: Policy, lock=None, today: datetime.date | None = None) -> Report:
    """Check REF against `policy` (and `lock`, a lockfile.Lock) over its registry's API. Registry faults raise
    registry_api.Unusable (the verb says them as an environment problem: exit 3)."""
    from ..registry_api import Client, endpoint

    parsed = ImageRef.parse(ref, "verify IMAGE")
    if not parsed.digest and not parsed.tag:
        raise UserError(f"verify {ref}: give the image by digest (REPO@sha256:...), or by REPO:TAG to verify what the "
                        "tag names now")
    today = today or datetime.date.today()
    report = Report(ref)
    repository = f"{parsed.api_host}/{parsed.api_repository}"
    with Client(endpoint(parsed.api_host)) as client:
        found = client.image(repository, parsed.digest or parsed.tag, platform="linux/amd64")
        if found is None:
            report.check("digest", False, f"{repository} has no image {parsed.digest or parsed.tag}")
            return report
        report.digest = found.digest
        if parsed.digest and parsed.tag:
            served = client.digest(repository, parsed.tag)
            if not report.check("digest", served == parsed.digest,
                                f"{parsed.tag} names {served or 'nothing'}" + ("" if served == parsed.digest else
                                                                              f", not the digest asked {parsed.digest}: "
                                                                              "the tag moved")):
                return report
        else:
            report.check("digest", True, f"the registry serves {found.digest}"
                         + ("" if parsed.digest else f" under {parsed.tag} now"))
        attached = []
        for subject in dict.fromkeys((found.digest, found.platform_digest)):
            got, how = attest.read(client, repository, subject, [k.key for k in policy.keys])
            attached += got
            report.passed.append(f"referrers: {len(got)} attestation(s) on {subject[:19]}… ({how})")
    good = {"provenance": [], "sbom": []}
    for a in attached:
        why = _refusal(a, found, policy, today)
        if why:
            report.ignored.append(f"{a.kind} {a.digest[:19]}… on {a.subject[:19]}…: {why}")
        elif a.predicate_type in (attest.SLSA, attest.SPDX):
            good[a.kind].append(a)
        else:  # CycloneDX, beside the SPDX document verify checks
            report.passed.append(f"{a.kind} {a.predicate_type} {a.digest[:19]}…: signed, about {a.subject[:19]}…")
    for kind in ("provenance", "sbom"):
        if kind in policy.require and not good[kind]:
            seen = [line for line in report.ignored if line.startswith(kind)]
            report.check(kind, False, f"no {kind} attached to {found.digest[:19]}… passes"
                         + (f" ({seen[0].split(': ', 1)[1]})" if seen else " (none is attached)"))
    if good["provenance"]:
        _provenance_checks(report, good["provenance"][0].opened.statement, found, lock)
    if good["sbom"]:
        from . import sbom

        problems = sbom.check_labels(good["sbom"][0].opened.statement["predicate"], found.labels)
        report.check("sbom", not problems, "; ".join(problems[:5]) if problems else
                     "every binary with device code is listed with the SASS / PTX its labels claim")
    return report


def _refusal(a: attest.Attached, found, policy: Policy, today: datetime.date) -> str:
    """Why attestation `a` does not count ("" when it does): unreadable, unsigned or signed by a key not trusted or
    expired, or about another digest."""
    o = a.opened
    if o.statement is None:
        return o.problem
    if not o.signed_by:
        return (f"signed by key {', '.join(signing.short(k) for k in o.signatures)}, which the policy does not list"
                if o.signatures else "unsigned")
    key = policy.key(o.signed_by)
    if key is not None and key.expires is not None and key.expires < today:
        return f"signed by key {key.name} ({signing.short(key.keyid)}), which expired on {key.expires}"
    named = attest.subject_digests(o.statement)
    if a.subject not in named:
        return f"its statement is about {', '.join(sorted(d[:19] + '…' for d in named))}, not the digest it is attached to"
    want = found.platform_digest if a.kind == "sbom" else found.digest
    if want not in named:
        return f"its statement does not name {want[:19]}…" + (" (an SBOM of another platform)" if a.kind == "sbom" else "")
    return ""


def _provenance_checks(report: Report, doc: dict, found, lock) -> None:
    predicate = doc["predicate"]
    definition = predicate.get("buildDefinition") or {}
    params = definition.get("externalParameters") or {}
    warm = labels.warm(found.labels)
    if warm:
        claim = params.get("warm") or {}
        problems = []
        if definition.get("buildType") != provenance.WARM_BUILD_TYPE:
            problems.append("the image's labels say warm, its provenance is not a warm build's")
        if claim.get("of") != warm.get("of"):
            problems.append(f"warm.of {warm.get('of', '')[:30]!r} against the provenance's {str(claim.get('of'))[:30]!r}")
        if claim.get("key") != warm.get("key"):
            problems.append("the warm key of the labels is not the provenance's")
        last = found.layer_digests[-1] if found.layer_digests else ""
        if claim.get("layer") != last:
            problems.append(f"the warm layer the provenance names ({str(claim.get('layer'))[:19]}…) is not the image's "
                            f"last layer ({last[:19]}…)")
        report.check("warm", not problems, "; ".join(problems) or
                     f"warm layer {last[:19]}… over {warm.get('of', '')}, as its provenance says")
        return
    cell = params.get("cell") or {}
    problems = []
    if cell.get("id") != labels.cell(found.labels):
        problems.append(f"it is of cell {str(cell.get('id'))[:80]!r}, the image's label says {labels.cell(found.labels)!r}")
    if cell.get("content_key") != labels.content_key(found.labels):
        problems.append("its content key is not the image's label")
    if lock is not None:
        problems += provenance.against_lock(doc, lock)
    report.check("provenance", not problems, "; ".join(problems[:5]) if problems else
                 f"cell {cell.get('id')}, content key {str(cell.get('content_key'))[:12]}…"
                 + (f", sources as {lock.path.name} pins them" if lock is not None else ""))


def lines(report: Report) -> list[str]:
    out = [f"FAILED {line}" for line in report.failed]
    out += [f"ignored {line}" for line in report.ignored]
    return out


def to_json(report: Report) -> str:
    return json.dumps(report.to_json(), indent=1, sort_keys=True)
