"""image: the slim runtime image of a cell, built from exactly the cell's audited wheels (a BuildKit named
context), exported as an OCI archive with every timestamp rewritten to SOURCE_DATE_EPOCH (the same sources give
the same digest), then loaded into the daemon and tagged — the loaded image keeps the archive's digest, so what
smoke runs and what publish pushes is one image, byte for byte. The runtime's dependencies are resolved before
anything is installed (the runtime-resolve stage, builder/pins.py) when the cell has no pins yet, and every build,
the first included, installs the hash-locked pins: the first build of a cell and every later one of the same
inputs have one content key and one digest. The first build's pins are written to runtime-pins/<cell>.txt once its
image is checked to hold exactly them.

An unchanged cell is not built again: the image's content key (`content_key`: the rendered Dockerfile, the build
arguments, the base images by digest, the build context, the wheels and runtime pins it installs, by sha256) is
the label io.builder.content-key of every image this step builds and is recorded in the cell's work dir
(content-key.json), in the step's artifacts and in the pins file's header. When the cell's tag already names a
local image that carries the key, and that image's digest is one builder recorded for the key when it built it
(the image ledger, builder/image/ledger.py: a label is inherited by any image built FROM this one, a digest is not),
that image is the result: no buildx call, no OCI export, no load. Without such a local image, the reuse registry
(--reuse-from; publish: its own registry) is asked the same question without pulling anything (builder/image/reuse.py):
the image under REGISTRY/ENGINE:<tag> carries the key, and builder's ledger record in that repository names its
manifest digest. Then build pulls it by that digest and tags it; publish leaves it there (smoke passed before it
was published, nothing is pushed) and only its aliases move. Any changed input changes the key, and then the
cell is built as before; --no-cache and --refresh-pins always build, and publish builds unless its registry
already serves the cell's image, or the cell's tag names the image an earlier build made here for this key and
the cell's work dir still holds that build's OCI archive: then publish smokes and pushes that very image, with no
second build and no second export."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import time
from pathlib import Path

from .. import docker, net, owner, pins
from ..image import labels, ledger, oci, reuse
from ..cache import sha256_file
from ..errors import BuilderError
from ..imageref import ImageRef
from . import CellContext, Status, StepResult, common_build_args

WHEEL_SUMS = "wheels.sha256"  # sha256sum format; its name is also in dockerfiles/stages/runtime.j2
ARCHIVE = "image.oci.tar"  # in the cell's work dir: what the publish step pushes
RESOLVED = "resolve"  # in the cell's work dir: what the runtime-resolve stage exported (pip's inspect and report)
CONTENT_RECORD = "content-key.json"  # in the cell's work dir: the content key and every input it covers
KEY_FORMAT = 1  # bumped whenever what the key covers changes, so that no older key matches by accident


def run_name_of(cell) -> str:
    """The name of a cell's image for one run only (`<tag>-run-<random>-p<pid>b<boot>`): smoke and publish use it,
    the runner drops it; it records its owner, so that the next run drops it if this one is killed outright."""
    return f"{cell.image}:{cell.tag}-{owner.run_suffix(secrets.token_hex(4))}"


def drop_orphaned_run_names(ctx: CellContext) -> None:
    """Drop the run names of this cell that earlier runs, killed outright, left (their owner is gone); never the
    name of a live run (another build of the same cell, right now)."""
    cell = ctx.cell
    for tag in docker.local_tags(cell.image, ctx.opts.docker):
        spec = owner.run_suffix_owner(tag) if tag.startswith(f"{cell.tag}-run-") else None
        if spec and not owner.alive(spec):
            try:
                docker.untag_image(f"{cell.image}:{tag}", ctx.opts.docker, missing_ok=True)
            except BuilderError as exc:  # a container of that run still uses it: the next smoke removes that one
                ctx.note(f"could not drop {cell.image}:{tag}, left by a run that was killed: "
                         f"{str(exc).strip().splitlines()[-1][:200]}")
                continue
            ctx.note(f"dropped {cell.image}:{tag}, left by a run that was killed (pid {spec})")


def archive_path(ctx: CellContext) -> Path:
    return ctx.dir / ARCHIVE


def runtime_call(ctx: CellContext, wheels: Path, metadata: Path, name: str | None = None) -> docker.BuildxCall:
    """The runtime build; `name` is what `docker load` calls the archive's image (default: the cell's tag)."""
    common = common_build_args(ctx)
    common["contexts"] = (("wheels", str(wheels)),) + common["contexts"]
    # the audited labels (builder/image/labels.py): what the audit of these very wheels found, never the data's guess
    found = {}
    for p in ctx.cell.packages:
        if p.recipe.compiled:
            report = ctx.audits.get(p.name)
            found.update(labels.audit_values(p.name, report) if report is not None else
                         {labels.audit_arg(p.name, w): "<from the audit>" for w in labels.AUDITED})
    common["build_args"] = tuple(common["build_args"]) + tuple(sorted(found.items()))
    # rewrite-timestamp works with the OCI exporter on every driver (with type=image the docker driver refuses it)
    output = docker.csv_options(type="oci", dest=archive_path(ctx), name=name or ctx.cell.ref,
                                **{"rewrite-timestamp": "true"}, **oci.export_options(ctx.opts.layer_compression))
    return docker.BuildxCall(target="runtime", output=output, metadata_file=metadata, attest=ctx.opts.attest, **common)


def resolve_call(ctx: CellContext, wheels: Path) -> docker.BuildxCall:
    """The runtime-resolve stage, its files exported to the work dir; never from BuildKit's cache (its RUN asks
    the index), nothing attested (the files are read, not shipped)."""
    common = common_build_args(ctx)
    common["contexts"] = (("wheels", str(wheels)),) + common["contexts"]
    if "--no-cache" not in common["extra"]:  # buildx refuses the two together; --no-cache covers it
        common["extra"] = tuple(common["extra"]) + ("--no-cache-filter", "runtime-resolve")
    return docker.BuildxCall(target="runtime-resolved", output=docker.csv_options(type="local", dest=ctx.dir / RESOLVED),
                             attest=(), **common)


def base_images(dockerfile: str) -> dict[str, str]:
    """The base images the rendered Dockerfile names (its global `ARG BASE_*=ref` lines, before the first FROM)."""
    head = dockerfile.split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (BASE_[A-Z0-9_]+)=(\S+)$", head, re.M))


PINS_IN_CONTEXT = (pins.HASHED_IN_CONTEXT, pins.FILE_IN_CONTEXT)


def content_key(ctx: CellContext, call: docker.BuildxCall, stage: Path) -> tuple[str, dict]:
    """The key of the runtime image's content and the inputs it covers, or ("", {"why": ...}) when one input
    cannot be named by its content (a base image the daemon does not hold: its tag could move). Every input of
    the runtime build is in it: the whole rendered Dockerfile (every template and the lock's pins, every other
    stage included), the build arguments (SOURCE_DATE_EPOCH, the audited labels), the attestations asked for, the
    base images by digest, each file of the build context and of the wheels context (the cell's wheels by the
    sha256 their audit checked; the runtime pins, resolved before the install on a first build)."""
    text = ctx.dockerfile.read_text()
    bases = {}
    for arg, ref in sorted(base_images(text).items()):
        digest = ImageRef.parse(ref, "base image").digest or docker.image_id(ref, ctx.opts.docker)
        if not digest:
            return "", {"why": f"the base image {ref} is not in the local image store (no digest to key it by)"}
        bases[arg] = {"ref": ref, "digest": digest}
    own = {w.name: ctx.records[s.package.name][w.name]["sha256"] for s in ctx.plan.wheels
           for w in ctx.wheels[s.package.name]}
    wheels, runtime_pins = {}, "none"
    for f in sorted(stage.iterdir()):
        if f.name in PINS_IN_CONTEXT:
            runtime_pins = {f.name: sha256_file(f)}
        else:
            wheels[f.name] = own.get(f.name) or sha256_file(f)
    context = {str(f.relative_to(ctx.context_dir)): sha256_file(f) for f in sorted(ctx.context_dir.rglob("*"))
               if f.is_file()}
    inputs = {"format": KEY_FORMAT, "target": call.target, "dockerfile": hashlib.sha256(text.encode()).hexdigest(),
              "build_args": dict(call.build_args), "attest": list(call.attest) if call.attest is not None else None,
              "bases": bases, "context": context, "wheels": wheels, "runtime_pins": runtime_pins,
              # the exporter's compression makes other layer blobs, so another digest: another content
              "layers": {**oci.export_options(ctx.opts.layer_compression),
                         "level": oci.LEVELS[ctx.opts.layer_compression]}}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return key, inputs


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class ImageStep:
    name = "image"
    scope = "cell"

    def _pins_file(self, ctx: CellContext) -> Path | None:
        return ctx.opts.pins_dir / f"{ctx.cell.id}.txt" if ctx.opts.pins_dir else None

    def run(self, ctx: CellContext, wheel: None = None) -> StepResult:
        cell, opts = ctx.cell, ctx.opts
        drop_orphaned_run_names(ctx)
        stage = ctx.dir / "wheels"
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
        sums = []
        for step in ctx.plan.wheels:
            for w in ctx.wheels[step.package.name]:
                _link_or_copy(w, stage / w.name)
                sums.append(f"{ctx.records[step.package.name][w.name]['sha256']}  /wheels/{w.name}\n")
        # The runtime stage checks these before pip sees a wheel: what was audited is what is installed.
        (stage / WHEEL_SUMS).write_text("".join(sums))
        pins_file = self._pins_file(ctx)
        resolved = None  # (pin lines, why without hashes) this build resolved: written once its image holds them
        if pins_file and pins_file.is_file() and not opts.refresh_pins:
            text, locked = pins.read(pins_file)  # checked line by line (runner.check_pins did before the build)
            ctx.note(f"runtime dependencies hash-locked by {pins_file}" if locked else
                     f"runtime dependencies pinned by {pins_file} (versions only: no hashes in it)")
        else:
            try:
                resolved = self._resolve(ctx, stage)
            except BuilderError as exc:
                return StepResult(self.name, cell.id, Status.FAILED,
                                  f"resolving the runtime's dependencies failed: {str(exc).strip()[-1500:]}")
            text = pins.text_of(cell, *resolved)
            locked = pins.hashed(text)
        own = [(w.name, ctx.records[s.package.name][w.name]["sha256"]) for s in ctx.plan.wheels
               for w in ctx.wheels[s.package.name]]
        name, content = pins.in_context(text, locked, own)
        (stage / name).write_text(content)
        metadata = ctx.dir / "metadata.json"
        # the key of this image's content; an image under the cell's tag that carries it is this cell's image
        call = runtime_call(ctx, stage, metadata)
        key, inputs = content_key(ctx, call, stage)
        self._record(ctx, key, inputs)
        # build takes the local image before asking the registry; publish asks its registry first (an image
        # already published there is not pushed again), then takes the image an earlier build made here
        for source in ((self._from_registry, self._local) if opts.publish is not None else
                       (self._local, self._from_registry)):
            result = source(ctx, key, pins_file, resolved)
            if result is not None:
                return result
        ctx.note(f"runtime image {cell.ref}")
        # loaded under a name of this run only: another build of the cell loading or tagging its image at the same
        # moment cannot take this one's place (the name is not part of the image or its digest). Smoke runs and
        # publish checks the image under this name; the runner removes it when the cell is done.
        run_name = run_name_of(cell)
        call = runtime_call(ctx, stage, metadata, run_name)
        if key:
            call = dataclasses.replace(call, extra=tuple(call.extra) + ("--label", f"{labels.CONTENT_KEY}={key}"))
        docker.stream(call.argv(opts.docker), ctx.log, ctx.echo())
        meta = json.loads(metadata.read_text()) if metadata.exists() else {}
        archive = archive_path(ctx)
        with oci.Archive(archive) as a:
            image = a.image()
        digest = image.digest
        if meta.get("containerimage.digest", digest) != digest:
            return StepResult(self.name, cell.id, Status.FAILED, f"the build reported {meta['containerimage.digest']}, "
                                                                 f"its OCI archive holds {digest}")
        ctx.note(f"load {archive} ({digest})")
        ctx.image_ref = run_name  # from here on the runner drops the name, whatever happens (even if the load fails)
        docker.load_archive(archive, opts.docker)
        loaded = docker.image_id(run_name, opts.docker)
        if loaded != digest:
            return StepResult(self.name, cell.id, Status.FAILED,
                              f"{archive} was loaded as {loaded or 'nothing'}, not as the built {digest} (the daemon "
                              "needs the containerd image store: scripts/setup-docker.sh turns it on)")
        if resolved is not None:  # the first build's pins: the image holds exactly them, or nothing is recorded
            try:
                pins.check_image(run_name, resolved[0], cell, opts.docker)
            except BuilderError as exc:
                return StepResult(self.name, cell.id, Status.FAILED, str(exc))
        if key:  # recorded before the tag moves: a later build reuses what the tag names only when it is this
            self._ledger_record(ctx, key, digest)
        # cell.ref, the name users know, may be moved by another build of the cell at any moment
        docker.point_tag(cell.ref, digest, opts.docker)
        self._record_pins(ctx, pins_file, resolved, digest, key)
        return StepResult(self.name, cell.id, Status.OK, f"tagged {cell.ref}",
                          artifacts={"image": cell.ref, "digest": digest, "manifest": image.manifest_digest,
                                     "archive": str(archive), "attestations": list(image.attestations),
                                     "content_key": key, "reused": False})

    def _resolve(self, ctx: CellContext, stage: Path) -> tuple[list[str], str]:
        """The runtime's dependencies resolved before anything is installed: the runtime-resolve stage (pip's
        inspect of the venv the install starts from, its --dry-run --report of the install's request), never
        taken from BuildKit's cache (a resolve asks the index of now), exported to the work dir and read into the
        pin lines (builder/pins.py) and, when they carry no hashes, why."""
        out = ctx.dir / RESOLVED
        shutil.rmtree(out, ignore_errors=True)
        call = resolve_call(ctx, stage)
        ctx.note("resolve the runtime's dependencies (pip --dry-run --report; nothing installed)")
        docker.stream(call.argv(ctx.opts.docker), ctx.log, ctx.echo())
        try:
            report = json.loads((out / "report.json").read_text())
            venv = json.loads((out / "installed.json").read_text())
        except (OSError, ValueError) as exc:
            raise BuilderError(f"the runtime-resolve stage left no readable pip report in {out}: {exc}") from None
        lines, why = pins.from_resolve(report, venv, ctx.cell, ctx.opts.index_url)
        ctx.note(f"resolved {len(lines)} runtime dependencies, "
                 + ("each with the sha256 of its files" if not why else f"versions only ({why})"))
        return lines, why

    @staticmethod
    def _record_pins(ctx: CellContext, pins_file: Path | None, resolved: tuple[list[str], str] | None, digest: str,
                     key: str) -> None:
        """Write the pins this build resolved, naming the image (and its content key) installed from them."""
        if pins_file and resolved is not None:
            pins.write(pins_file, pins.text_of(ctx.cell, *resolved, (digest, key) if key else None))
            ctx.note(f"recorded the resolved runtime dependencies in {pins_file}"
                     + (f" (versions only: {resolved[1]})" if resolved[1] else ", each with its sha256"))

    @staticmethod
    def _record(ctx: CellContext, key: str, inputs: dict) -> None:
        (ctx.dir / CONTENT_RECORD).write_text(json.dumps({"content_key": key, **inputs}, indent=1, sort_keys=True))
        ctx.note(f"content key {key}" if key else f"no content key: {inputs['why']}; the image is built")

    @staticmethod
    def _ledger_record(ctx: CellContext, key: str, digest: str, vouched_by: str = "") -> None:
        """Bind `digest` to `key` in the image ledger (`vouched_by`: pulled on that signed record's word, not built
        here). A ledger that cannot be written (a read-only wheelhouse) costs the next build its reuse, not this
        build its image: said, not raised."""
        if ctx.opts.image_ledger is None:
            return
        try:
            note = ledger.Ledger(ctx.opts.image_ledger).record_image(key, digest, ctx.cell.id, vouched_by)
        except (OSError, BuilderError) as exc:
            ctx.note(f"WARNING: could not record {digest} for content key {key} in the image ledger "
                     f"{ctx.opts.image_ledger}: {getattr(exc, 'strerror', None) or exc}; "
                     "the next build of this cell builds again")
            return
        if note:
            ctx.note(f"image ledger: {note}")

    def _local(self, ctx: CellContext, key: str, pins_file: Path | None,
               resolved: tuple[list[str], str] | None) -> StepResult | None:
        reused, why = self._reusable(ctx, key)
        return self._reuse(ctx, reused, why, key, pins_file, resolved) if reused else None

    def _reusable(self, ctx: CellContext, key: str) -> tuple[str, str]:
        """(digest, why) of the local image under the cell's tag when image/reuse.judge says it is this build's
        result, else ("", "") (with a line saying why, when the image claims a key). For publish, only when the
        cell's work dir still holds the OCI archive of that very image (what publish pushes)."""
        opts, cell = ctx.opts, ctx.cell
        if not key or opts.no_cache or opts.refresh_pins or opts.image_ledger is None:
            return "", ""
        found = docker.image_labels(cell.ref, opts.docker)
        digest = docker.image_id(cell.ref, opts.docker) if found is not None else ""
        claim = reuse.Claim(f"image {cell.ref}", digest, labels.content_key(found)) if digest else None
        verdict = reuse.judge(claim, key, reuse.local_voucher(opts.image_ledger))
        if isinstance(verdict, reuse.Build):
            if verdict.why:
                ctx.note(verdict.why)
            return "", ""
        if opts.publish is not None:
            archive = archive_path(ctx)
            try:
                with oci.Archive(archive) as a:
                    held = a.image().digest
            except (OSError, BuilderError) as exc:
                held = f"unreadable ({getattr(exc, 'strerror', None) or exc})" if archive.exists() else "missing"
            if held != verdict.digest:
                ctx.note(f"{cell.ref} ({verdict.digest}) is this build's image, but the OCI archive publish pushes, "
                         f"{archive}, is {held}: building it again")
                return "", ""
        return verdict.digest, verdict.why

    def _from_registry(self, ctx: CellContext, key: str, pins_file: Path | None,
                       resolved: tuple[list[str], str] | None) -> StepResult | None:
        """The image the reuse registry (the matrix's registry by default, --reuse-from, or publish's registry)
        serves under the cell's tag, when image/reuse.judge says it is this build's result (its record there
        vouches for its digest): for build pulled by that digest and tagged, for publish left where it is (its
        aliases move). None, with one line saying why, when the cell is to be built."""
        opts, cell = ctx.opts, ctx.cell
        source = opts.reuse_from
        if source is None or not key or opts.no_cache or opts.refresh_pins:
            return None
        repository = source.repository(cell.engine)
        ref = f"{repository}:{cell.tag}"
        started = time.monotonic()
        try:
            source = source.with_credentials()
        except BuilderError as exc:
            ctx.note(f"registry: {ref}: {str(exc).strip().splitlines()[0]}: building")
            return None
        try:
            with reuse.Client(source) as client:
                found = client.image(repository, cell.tag)
                if found is None:
                    ctx.note(f"registry: {ref} is not there: building")
                    return None
                claim = reuse.Claim(f"registry: {ref}", found.digest, labels.content_key(found.labels))
                verdict = reuse.judge(claim, key,
                                      reuse.registry_voucher(client, repository, published=opts.publish is not None,
                                                             trusted=opts.ledger_key))
        except reuse.Unusable as exc:
            ctx.note(f"registry: {ref}: {exc}: building")
            return None
        if isinstance(verdict, reuse.Build):
            ctx.note(verdict.why)
            return None
        if verdict.kind == reuse.UNSIGNED:
            trust = reuse.trust_line(source.path)
            if trust:
                ctx.note(trust)
        checked = time.monotonic() - started
        artifacts = {"image": ref, "digest": found.digest, "archive": "", "attestations": [], "content_key": key,
                     "reused": True, "registry": ref, "index": found.index, "checked_s": round(checked, 3),
                     "bytes": found.size, "vouched_by": verdict.vouched_by}
        if opts.publish is not None:  # already where publish pushes: nothing to pull, nothing to push
            ctx.in_registry = {"ref": ref, "digest": found.digest, "content_key": key, "index": found.index,
                               "vouched_by": verdict.vouched_by, "signed": verdict.kind == reuse.SIGNED}
            ctx.note(f"reuse {ref} ({found.digest}) from the registry: {verdict.why}; no build, no pull "
                     f"(checked in {checked:.1f}s)")
            return StepResult(self.name, cell.id, Status.OK, f"in the registry: {ref} (content key unchanged)",
                              artifacts={**artifacts, "pulled": False})
        return self._pull(ctx, found, repository, key, pins_file, resolved, verdict, artifacts, started)

    def _pull(self, ctx: CellContext, found: reuse.Found, repository: str, key: str, pins_file: Path | None,
              resolved: tuple[list[str], str] | None, verdict: reuse.Reuse, artifacts: dict,
              started: float) -> StepResult | None:
        """Pull the vouched image by its digest and name it: the run's own name, the cell's tag. Nothing is named
        before the daemon holds that very digest; a pull that fails leaves nothing named and the cell is built.
        This host's image ledger records the digest, with who vouched, only when a signature by the matrix's key
        vouched for it: what the registry merely says is not written down as builder's."""
        said = verdict.why
        cell, opts = ctx.cell, ctx.opts
        by_digest = f"{repository}@{found.digest}"
        ctx.note(f"reuse {found.ref} ({found.digest}) from the registry: {said}; pull by digest, no build, "
                 "no OCI export")
        try:
            docker.pull_by_digest(by_digest, net.subprocess_seconds(found.size, found.layers + 2), opts.docker)
        except BuilderError as exc:
            lines = [l for l in str(exc).splitlines() if l.strip()]
            ctx.note(f"registry: pulling {by_digest} failed ({lines[-1][:200] if lines else 'no output'}): building")
            return None
        loaded = docker.image_id(by_digest, opts.docker)
        if loaded != found.digest:
            return StepResult(self.name, cell.id, Status.FAILED, f"pulled {by_digest}, the daemon holds it as "
                              f"{loaded or 'nothing'} (the daemon needs the containerd image store: "
                              "scripts/setup-docker.sh turns it on)")
        if verdict.kind == reuse.SIGNED:  # recorded before the tag moves, as for a built image, with who vouched
            self._ledger_record(ctx, key, found.digest, verdict.vouched_by)
        else:
            ctx.note(f"image ledger: {found.digest} not recorded (taken on the word of {verdict.vouched_by}, not "
                     "built here nor signed)")
        run_name = run_name_of(cell)
        ctx.image_ref = run_name  # from here on the runner drops the name, whatever happens
        docker.tag_image(found.digest, run_name, opts.docker)
        docker.point_tag(cell.ref, found.digest, opts.docker)
        if repository != cell.image:  # the cell's tag names it now; the same repository's digest name is the tag's own
            docker.untag_image(by_digest, opts.docker, missing_ok=True)
        self._record_pins(ctx, pins_file, resolved, found.digest, key)
        seconds = time.monotonic() - started
        ctx.note(f"pulled and tagged {cell.ref} ({found.digest}) in {seconds:.1f}s")
        return StepResult(self.name, cell.id, Status.OK, f"pulled {found.ref} (content key unchanged)",
                          artifacts={**artifacts, "image": cell.ref, "pulled": True, "reuse_s": round(seconds, 3)})

    def _reuse(self, ctx: CellContext, digest: str, why: str, key: str, pins_file: Path | None,
               resolved: tuple[list[str], str] | None) -> StepResult:
        cell, opts = ctx.cell, ctx.opts
        ctx.note(f"reuse {cell.ref} ({digest}): {why}; no build, no OCI export")
        run_name = run_name_of(cell)
        # named before the tag is made, and the tag runs to its end even when interrupted: whatever happens from
        # here, the runner removes the name. Tagged by digest: the name holds the very image that was checked,
        # even if the cell's tag moves meanwhile.
        ctx.image_ref = run_name
        docker.tag_image(digest, run_name, opts.docker)
        self._record_pins(ctx, pins_file, resolved, digest, key)
        archive, attestations = "", []
        if opts.publish is not None:  # what publish pushes: _reusable checked that it holds this digest
            with oci.Archive(archive_path(ctx)) as a:
                archive, attestations = str(archive_path(ctx)), list(a.image().attestations)
        return StepResult(self.name, cell.id, Status.OK, f"reused {cell.ref} (content key unchanged)",
                          artifacts={"image": cell.ref, "digest": digest, "archive": archive,
                                     "attestations": attestations,
                                     "content_key": key, "reused": True})

    def dry_run(self, ctx: CellContext, wheel: None = None) -> list[str]:
        source = ctx.opts.reuse_from
        pins_file = self._pins_file(ctx)
        first = ([shlex.join(resolve_call(ctx, ctx.dir / "wheels").argv(ctx.opts.docker))]  # no pins yet: resolve
                 if not (pins_file and pins_file.is_file()) or ctx.opts.refresh_pins else [])
        if source is not None:
            first.append(f"# reuse: when {source.repository(ctx.cell.engine)}:{ctx.cell.tag} carries this build's "
                         "content key and its ledger record names its digest, "
                         + ("publish leaves it there and moves its aliases" if ctx.opts.publish is not None else
                            "it is pulled by that digest instead of built"))
        call = runtime_call(ctx, ctx.dir / "wheels", ctx.dir / "metadata.json")
        return first + [shlex.join(call.argv(ctx.opts.docker)),
                        shlex.join([ctx.opts.docker, "load", "--input", str(archive_path(ctx))])]
