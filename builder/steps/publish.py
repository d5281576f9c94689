"""publish: push the cell's runtime image — the OCI archive the image step built, loaded and smoke ran — to
REGISTRY/ENGINE:<full tag>, keeping its digest (builder/image/publish.py). The runner runs it only when smoke passed
(runner.GATES); aliases move after every cell of the run is pushed (publish.finish, called by the verb)."""

from __future__ import annotations

import shlex

from .. import docker
from ..image import labels, ledger, oci, signing
from ..image import publish as pub
from ..errors import BuilderError
from ..registry_api import Unusable
from . import CellContext, Status, StepResult
from .image import archive_path


class PublishStep:
    name = "publish"
    scope = "cell"

    def run(self, ctx: CellContext, wheel: None = None) -> StepResult:
        cell, target = ctx.cell, ctx.opts.publish
        if target is None:
            return StepResult(self.name, cell.id, Status.SKIPPED, "not asked (`builder publish` pushes)")
        if ctx.in_registry:
            return self._already_there(ctx, target)
        archive = archive_path(ctx)
        if not archive.is_file():
            return StepResult(self.name, cell.id, Status.FAILED, f"no image archive at {archive}: the image step made none")
        with oci.Archive(archive) as a:
            image = a.image()
        # what smoke ran is the image step's own name for this content; publish pushes only that very image
        ran = ctx.image_ref or cell.ref
        loaded = docker.image_id(ran, ctx.opts.docker)
        if loaded != image.digest:
            return StepResult(self.name, cell.id, Status.FAILED,
                              f"{ran} in the daemon is {loaded or 'missing'}, the archive is {image.digest}: "
                              "refusing to push an image other than the one smoke ran")
        repository = target.repository(cell.engine)
        ctx.note(f"push {repository}:{cell.tag} ({image.digest})"
                 + (f", credentials from {target.credentials_from}" if target.credentials else ""))
        index = image.digest != image.manifest_digest
        key = labels.content_key((image.config.get("config") or {}).get("Labels") or {})
        # the attestations before the tag: whoever sees the tag finds them already there (a failed attach pushes no
        # image; an attestation left without its image names a digest no tag serves)
        attached = []
        if target.attestations:
            try:
                attached = attach_attestations(ctx, target, repository, archive, image)
            except (Unusable, BuilderError, OSError) as exc:
                return StepResult(self.name, cell.id, Status.FAILED, f"attaching the SBOM and provenance to "
                                  f"{repository}@{image.digest}: {exc}; nothing pushed under {cell.tag}")
        # the registry's ledger record first: a fresh runner that sees the new tag finds the record vouching for it
        _push_record(ctx, repository, key, lambda e: ledger.add_image(e, image.digest, cell.id))
        try:
            pub.push_archive(archive, repository, cell.tag, image.digest, index, target, ctx.note, ctx.log)
        except pub.PublishError as exc:
            return StepResult(self.name, cell.id, Status.FAILED, str(exc))
        ctx.note(f"pushed {repository}:{cell.tag}; the registry serves {image.digest}")
        _record_published(ctx, image, f"{repository}:{cell.tag}")
        _push_record(ctx, repository, key, lambda e: ledger.add_published(e, f"{repository}:{cell.tag}", image.digest,
                                                                          cell.id))
        return StepResult(self.name, cell.id, Status.OK, f"pushed {repository}@{image.digest}",
                          artifacts={"repository": repository, "tag": cell.tag, "digest": image.digest,
                                     "ref": f"{repository}@{image.digest}", "index": index, "referrers": attached})

    def _already_there(self, ctx: CellContext, target) -> StepResult:
        """The image step found this cell's image already under its tag in the registry, vouched for by the ledger
        record: nothing is pushed; the tag must still serve that digest (it may have moved since), then the push is
        recorded as for a pushed image and publish.finish moves the aliases."""
        cell = ctx.cell
        image = ctx.in_registry
        ref, digest = image["ref"], image["digest"]
        repository = target.repository(cell.engine)
        try:
            served = pub.served_digest(f"{repository}:{cell.tag}", target, ctx.note)
        except pub.PublishError as exc:
            return StepResult(self.name, cell.id, Status.FAILED, str(exc))
        if served != digest:
            return StepResult(self.name, cell.id, Status.FAILED, f"{ref} moved to {served} after it was checked "
                              f"({digest}); nothing pushed, no alias moved: run publish again")
        ctx.note(f"no push: {ref} already serves {digest} (content key unchanged)")
        key = image.get("content_key", "")
        # only a signed vouch enters this host's ledger (with who vouched); the registry's unsigned word does not
        if key and ctx.opts.image_ledger is not None and image.get("signed"):
            try:
                ledger.Ledger(ctx.opts.image_ledger).record_published(key, ref, digest, cell.id,
                                                                      image.get("vouched_by", ""))
            except (OSError, BuilderError) as exc:
                ctx.note(f"WARNING: could not record {digest} in the image ledger {ctx.opts.image_ledger}: "
                         f"{getattr(exc, 'strerror', None) or exc}")
        return StepResult(self.name, cell.id, Status.OK, f"already in the registry: {repository}@{digest}",
                          artifacts={"repository": repository, "tag": cell.tag, "digest": digest,
                                     "ref": f"{repository}@{digest}", "index": bool(image.get("index")),
                                     "pushed": False})

    def dry_run(self, ctx: CellContext, wheel: None = None) -> list[str]:
        target = ctx.opts.publish
        if target is None:
            return []
        dest = f"docker://{target.repository(ctx.cell.engine)}:{ctx.cell.tag}"
        args = docker.skopeo_copy_args(f"oci-archive:{archive_path(ctx)}", dest, dest_tls_verify=target.tls_verify)
        return [shlex.join(["skopeo", *args])]


def attach_attestations(ctx: CellContext, target, repository: str, archive, image: oci.Image) -> list[dict]:
    """The image's SBOM and SLSA provenance, signed with publish's key when CI gives one, attached as referrers of
    its digests (builder/image/attest.py); what was attached."""
    from ..image import attest

    return attest.attach_image(target.where, repository, archive, image, _provenance(ctx, attest.now()),
                               ctx.opts.ledger_signer, ctx.note, cyclonedx=target.cyclonedx)


def _provenance(ctx: CellContext, finished: str) -> dict:
    """The provenance predicate of the cell's build (builder/image/provenance.py) from what this run used."""
    import hashlib
    import json

    from .. import deps, docker
    from ..image import provenance
    from .image import CONTENT_RECORD

    cell = ctx.cell
    content = json.loads((ctx.dir / CONTENT_RECORD).read_text()) if (ctx.dir / CONTENT_RECORD).is_file() else {}
    packages, plans = [], {}
    for p in cell.packages:
        packages.append({"name": p.name, "version": p.version, "source": provenance.source_of(p.source),
                         "archs": list(p.archs), "deps": dict(p.deps_pins), "nvcc_flags": list(p.nvcc_flags)})
        plan = deps.plan_path(p.name, p.version)
        if plan.is_file():
            plans[plan.name] = hashlib.sha256(plan.read_bytes()).hexdigest()
    facts = {"id": cell.id, "engine": cell.engine, "version": cell.version, "cuda": cell.cuda, "torch": cell.torch,
             "python": cell.python, "archs": list(cell.archs), "strategies": list(cell.strategies),
             "profile": getattr(cell.profile, "name", ""), "content_key": content.get("content_key", "")}
    return provenance.predicate(facts, packages, content, plans, started=ctx.started, finished=finished,
                                versions={"buildx": docker.buildx_version(ctx.opts.docker)},
                                invocation=f"{cell.id}@{ctx.started}")


def _push_record(ctx: CellContext, repository: str, key: str, change) -> None:
    """Merge `change` into the registry's ledger record for `key` (builder/image/reuse.py). One that cannot be pushed
    costs the next fresh runner its reuse, not this publish its image: said, not raised."""
    from ..image import reuse

    if not key or ctx.opts.reuse_from is None:
        return
    try:
        note = reuse.merge_and_push(ctx.opts.reuse_from, repository, key, change, signer=ctx.opts.ledger_signer,
                                    trusted=ctx.opts.ledger_key)
    except reuse.Unusable as exc:
        ctx.note(f"WARNING: could not push the ledger record {repository}:{reuse.record_tag(key)} ({exc}); a fresh "
                 "runner builds this cell again")
        return
    if note:
        ctx.note(f"ledger record: {note}")
    signer = ctx.opts.ledger_signer
    if signer is not None:
        ctx.note(f"ledger record {repository}:{reuse.record_tag(key)} signed by key "
                 f"{signing.short(signer.public_key.keyid)}")


def _record_published(ctx: CellContext, image: oci.Image, ref: str) -> None:
    """Bind the pushed digest to the image's content key in the image ledger, with where it went: a reuse from
    the registry takes the registry's digest for a tag only when the ledger vouches for it (builder/image/ledger.py)."""
    key = labels.content_key((image.config.get("config") or {}).get("Labels") or {})
    if not key or ctx.opts.image_ledger is None:
        return
    try:
        note = ledger.Ledger(ctx.opts.image_ledger).record_published(key, ref, image.digest, ctx.cell.id)
    except (OSError, BuilderError) as exc:
        ctx.note(f"WARNING: could not record the push of {image.digest} in the image ledger {ctx.opts.image_ledger}: "
                 f"{getattr(exc, 'strerror', None) or exc}")
        return
    if note:
        ctx.note(f"image ledger: {note}")
