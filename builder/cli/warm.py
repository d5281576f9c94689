"""`builder warm IMAGE --strategy S`: a first boot that is a warm boot. Boot the image on this host with its cache root
empty, run smoke L3's requests (the shapes the engine compiles at its first requests), stop it, and build the warm
image: the image plus one layer holding exactly what the boot wrote under the root (builder/image/warm.py), labelled
with what it was warmed for and the cold and warm boot seconds (it is booted once more from the warm layer, which
must compile nothing beyond the engine data's warm_allowance). `--from-dir` packs a capture made elsewhere."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import click

from ..errors import Failed, UserError
from . import flags
from .app import main


def _l3(rep):
    found = [r for r in rep.results if r.layer == "L3"]
    if not found or found[0].status != "pass":
        why = found[0].reason if found else "L3 did not run"
        raise Failed(f"the boot failed: {why}")
    return found[0]


def _model_hash(target: Path) -> str:
    config = Path(target) / "config.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else ""


def _epoch(image: str) -> str:
    """The cold image's creation time as SOURCE_DATE_EPOCH: the warm image is as old as its content."""
    from .. import docker

    import re
    from datetime import datetime

    _, out, _ = docker.probe(["docker", "image", "inspect", "--format", "{{.Created}}", image], timeout=60)
    try:
        return str(int(datetime.fromisoformat(re.sub(r"\.\d+", "", out.strip())).timestamp()))
    except ValueError:
        return "0"


@main.command("warm")
@click.argument("image")
@click.option("--strategy", required=True, help="The strategy to warm the image for (e.g. MTP2): one per warm image.")
@flags.matrix
@flags.run_flags
@click.option("--cache-root", "cache_root", default=None, metavar="DIR",
              help="With --launcher process: where the engine's compile caches go (default the image's own root, so "
                   "the captured paths are the image's paths); it must be empty.")
@click.option("--from-dir", "from_dir", default=None, type=flags.FsPath(file_okay=False),
              help="Pack a capture made elsewhere (DIR/tree/ and DIR/warm.json, as this verb writes them): no boot.")
@click.option("--out", "out_dir", default="warm", show_default=True, type=flags.FsPath(file_okay=False),
              help="Captures go to DIR/<warm tag>/ (tree/, warm.json, the engine logs).")
@click.option("--push", "registry", default=None, metavar="REGISTRY",
              help="Push the warm image by digest to REGISTRY (the publish code path) and list it in images.json "
                   "beside its cold image.")
@click.option("--images-json", default="images.json", show_default=True, type=flags.FsPath(dir_okay=False),
              help="With --push: the images.json to list it in.")
@flags.as_json
def warm(image, strategy, matrix_path, run, cache_root, from_dir, out_dir, registry, images_json, as_json):
    """Build the warm image of IMAGE for STRATEGY on this host's GPU: its first boot then compiles nothing.

    \b
    Example:
      builder warm 127.0.0.1:5000/builder/vllm:0.26.0-cu130-torch2.11.0-py312-sm90 --strategy MTP2 --model tiny
      builder warm IMAGE --strategy MTP2 --from-dir warm/<tag>   # a capture from another host
    """
    from .. import docker
    from ..deploy import gpus, subject
    from ..deploy.smoke import Model, SmokeOptions, image_caches, process_caches, smoke_image, smoke_process
    from ..image import labels as labels_mod
    from ..image import warm as warm_mod
    from ..imageref import ImageRef

    say = (lambda s: click.echo(s, err=True))
    if cache_root is not None and run.launcher != "process":
        raise UserError("--cache-root: only with --launcher process (an image's caches are at its own root)")
    capture = Path(from_dir) if from_dir else None
    if capture is not None:
        tree, facts = warm_mod.read_capture(capture)  # refused before any docker call
    found = subject.read(image, what="IMAGE", files=False)
    lab = found.labels
    root = labels_mod.cache_root(lab)
    if not root:
        raise UserError(f"{image}: no {labels_mod.CACHE_ROOT} label: built before its compile caches had one root; "
                        "rebuild it")
    if labels_mod.warm(lab):
        raise UserError(f"{image}: already a warm image (label {labels_mod.WARM}); warm its cold image "
                        f"{labels_mod.warm(lab)['of']}")
    m = flags.given_matrix(matrix_path)  # its engine knowledge, where one is given (extra files)
    cell = subject.cell_from_labels(image, lab, m.knowledge if m is not None else None)
    labels_mod.check_strategy(cell.engine_recipe, strategy, labels_mod.strategies(lab), image)
    if capture is not None and facts["cache_root"] != root:
        raise UserError(f"{capture}: captured at {facts['cache_root']}, the image's cache root is {root}: the caches' "
                        "keys hold absolute paths, a capture fits only the root it was made at")
    if not found.local:
        raise UserError(f"{image}: not in the local daemon; pull it first (the warm layer is built FROM it by digest)")
    digest = found.image_id or docker.image_id(image)  # the image read: a tag moved since changes nothing
    ref = ImageRef.parse(image)
    repo = ref.name
    base = str(ref.with_digest(digest))
    host = gpus.read() if run.gpus.mode != "none" else None

    def boot(target_image: str | None, opts: SmokeOptions):
        if run.launcher == "docker":
            return _l3(smoke_image(cell, target_image, opts, say))
        return _l3(smoke_process(cell, run.python, opts, say, extra_env=run.env))

    def options(log_dir: Path, capture_to: Path | None) -> SmokeOptions:
        have_gpu, why = run.gpus.choose(host)
        return SmokeOptions(strategies=(strategy,), model=model, layers=("L3",), gpus=have_gpu, gpu_ids=run.gpus.ids,
                            l3_without_gpu=run.gpus.mode == "none", no_gpu_reason=why,
                            gpu_arch=host.arch if host is not None else None, boot_timeout=run.boot_timeout,
                            port=run.port, extra_args=run.engine_args, extra_env=run.env, log_dir=log_dir,
                            capture_to=capture_to)

    if capture is None:  # boot with the cache root empty, capture what it compiled
        model = Model.resolve(run.model, run.drafter)
        gpu = host.gpus[0] if host is not None and host.present else None
        gpu_slug = f"sm{host.arch}" if host is not None and host.arch else "nogpu"
        capture = Path(out_dir) / warm_mod.tag_for(ref.tag or "latest", strategy, gpu_slug)
        if (capture / warm_mod.TREE).exists():
            shutil.rmtree(capture / warm_mod.TREE)
        capture.mkdir(parents=True, exist_ok=True)
        opts = options(capture.resolve() / "logs", capture.resolve() / warm_mod.TREE)
        if run.launcher == "docker":
            image_caches(opts, lab)
        else:
            process_caches(opts, cell, cache_root)
            if any(Path(opts.cache_root).rglob("*")):
                raise UserError(f"--cache-root {opts.cache_root}: not empty; the cold boot starts from an empty cache "
                                "root (move it away, or give another)")
        say(f"cold boot of {image} ({strategy}, {run.launcher}), caches under {opts.cache_root}")
        cold = boot(image, opts)
        (capture / warm_mod.TREE).mkdir(exist_ok=True)
        facts = {"cache_root": opts.cache_root, "strategy": strategy,
                 "gpu": gpu.name if gpu else "none", "gpu-arch": f"sm{host.arch}" if host and host.arch else "none",
                 "driver": gpu.driver if gpu else "none", "engine": f"{cell.engine} {cell.version}",
                 "model": "tiny" if model.tiny else str(model.target), "model-config-sha256": _model_hash(model.target),
                 "engine-args": " ".join(run.engine_args), "cold-boot-s": cold.figures.get("boot_s"),
                 "captured-on": run.launcher, "written-outside": cold.figures.get("written_outside_cache_root")}
        warm_mod.write_capture(capture, facts)
        tree, facts = warm_mod.read_capture(capture)
        if run.launcher == "process" and facts["cache_root"] != root:
            raise UserError(f"captured under --cache-root {facts['cache_root']}, the image's root is {root}: kept in "
                            f"{capture}, not packed (the caches' keys hold absolute paths)")

    files = warm_mod.file_list(tree)
    tag = capture.name if from_dir is None else warm_mod.tag_for(ref.tag or "latest", strategy,
                                                                 facts.get("gpu-arch", "nogpu"))
    warm_ref = f"{repo}:{tag}"
    work = capture / "build"
    code, out = docker.make_local_digest_resolvable(base, image, work / "resolve")
    if code != 0:
        raise UserError(f"{base}: BuildKit cannot resolve the image by digest here: {out[-300:]}")
    epoch = _epoch(image)

    def pack(extra: dict) -> "warm_mod.Packed":
        values = {**facts, **extra, "files": str(len(files)), "bytes": str(sum(files.values()))}
        values = {k: "" if v is None else str(v) for k, v in values.items()}
        packed = warm_mod.pack(tree, root, base, labels_mod.warm_written(values, digest), work, warm_ref, epoch)
        docker.load_archive(packed.archive)
        docker.point_tag(warm_ref, packed.digest)
        return packed

    packed = pack({})
    say(f"warm layer {packed.layer}: {len(files)} files, {sum(files.values())} bytes; {warm_ref} ({packed.digest})")
    if from_dir is None:  # booted once more, from the warm layer: it must compile nothing beyond the allowance
        opts = options(capture.resolve() / "logs-warm", None)
        if run.launcher == "docker":
            image_caches(opts, {**lab, **dict(labels_mod.warm_written({}, digest))})
        else:
            process_caches(opts, cell, cache_root)
            opts.warm_allowance = tuple(g for g, _ in cell.warm_allowance)
        say(f"warm boot of {warm_ref}")
        try:
            warm_boot = boot(warm_ref, opts)
        except Failed:
            docker.untag_image(warm_ref, missing_ok=True)
            raise
        facts["warm-boot-s"] = warm_boot.figures.get("boot_s")
        warm_mod.write_capture(capture, facts)
        layer = packed.layer
        docker.untag_image(warm_ref, missing_ok=True)
        packed = pack({})
        assert packed.layer == layer, "the same files gave another layer"
    pushed = ""
    if registry:
        from ..image import publish

        target = publish.make_target(registry, Path(images_json))
        repository = target.repository(cell.engine)
        pushed = publish.push_archive(packed.archive, repository, tag, packed.digest, False, target, say)
        data = publish.load_images(Path(images_json))
        entry = data["images"].setdefault(cell.id, {}) if isinstance(data["images"].get(cell.id, {}), dict) else {}
        entry.setdefault("warm", {})[tag] = {"ref": f"{repository}:{tag}@{pushed}", "digest": pushed, "of": digest,
                                             "layer": packed.layer, "strategy": strategy,
                                             "gpu-arch": facts.get("gpu-arch"), "cold-boot-s": facts.get("cold-boot-s"),
                                             "warm-boot-s": facts.get("warm-boot-s")}
        data["images"][cell.id] = entry
        publish.write_images(Path(images_json), data)
    result = {"image": warm_ref, "digest": packed.digest, "layer": packed.layer, "of": digest, "files": len(files),
              "bytes": sum(files.values()), "cold_boot_s": facts.get("cold-boot-s"),
              "warm_boot_s": facts.get("warm-boot-s"), "capture": str(capture), "pushed": pushed}
    click.echo(json.dumps(result, indent=2) if as_json else
               f"{warm_ref} {packed.digest}: {len(files)} files under {root}, cold {facts.get('cold-boot-s')} s, "
               f"warm {facts.get('warm-boot-s')} s")
