"""`builder warm IMAGE --strategy S`: a first boot that is a warm boot. Boot the image on this host with its cache root
empty, run smoke L3's requests (the shapes the engine compiles at its first requests), stop it, and build the warm
image: the image plus one layer holding exactly what the boot wrote under the root (builder/deploy/warm/layer.py), labelled
with what it was warmed for and the cold and warm boot seconds (it is booted once more from the warm layer, which
must compile nothing beyond the engine data's warm_allowance). `--from-dir` packs a capture made elsewhere."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import click

from ..errors import Failed, UserError
from . import flags
from .app import main


class BootFailed(Failed):
    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


def _l3(rep):
    found = [r for r in rep.results if r.layer == "L3"]
    if not found or found[0].status != "pass":
        why = found[0].reason if found else "L3 did not run"
        raise BootFailed(f"the boot failed: {why}", found[0] if found else None)
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
    except ValueError:  # not 0: the layer's files must not be older than the image's (warm.pack says why)
        raise UserError(f"{image}: its creation time {out.strip()!r} is not a date: the warm layer's file times are "
                        "taken from it") from None


@main.command("warm")
@click.argument("target")
@click.option("--strategy", required=True, help="The strategy to warm the image for (e.g. MTP2): one per warm image.")
@flags.matrix
@flags.run_flags
@click.option("--cache-root", "cache_root", default=None, metavar="DIR",
              help="With --launcher process: where the engine's compile caches go (default the image's own root, so "
                   "the captured paths are the image's paths); it must be empty.")
@flags.image_paths
@click.option("--resume", is_flag=True,
              help="With --launcher process: the cache root holds what a cold boot of this capture left when it was cut "
                   "(its boot timeout, recorded in the capture's cut.json): boot again from there and capture the whole "
                   "root; the cold seconds are the cut boot's and this one's.")
@click.option("--from-dir", "from_dir", default=None, type=flags.FsPath(file_okay=False),
              help="Pack a capture made elsewhere (DIR/tree/ and DIR/warm.json, as this verb writes them): no boot.")
@click.option("--out", "out_dir", default="warm", show_default=True, type=flags.FsPath(file_okay=False),
              help="Captures go to DIR/<warm tag>/ (tree/, warm.json, the engine logs).")
@click.option("--push", "registry", default=None, metavar="REGISTRY",
              help="Push the warm image by digest to REGISTRY (HOST[:PORT]/PATH, as publish's --registry: the publish "
                   "code path) beside its cold image, which REGISTRY must already serve (`builder publish`); it is "
                   "listed in images.json's `warm` table.")
@click.option("--images-json", default="images.json", show_default=True, type=flags.FsPath(dir_okay=False),
              help="With --push: the images.json to list it in.")
@flags.as_json
def warm(target, strategy, matrix_path, run, cache_root, image_paths, resume, from_dir, out_dir, registry, images_json,
         as_json):
    """Build the warm image of TARGET (an image) for STRATEGY on this host's GPU: its first boot then compiles nothing.
    On a GPU host without Docker, TARGET is a cell id of --matrix and --launcher process --image-paths captures only
    (cold boot, capture, a warm boot from it in place); pack the capture where the image is with --from-dir.

    \b
    Example:
      builder warm 127.0.0.1:5000/builder/vllm:0.26.0-cu130-torch2.11.0-py312-sm90 --strategy MTP2 --model tiny
      builder warm vllm-0.26.0-cu130-torch2.11.0-py312-sm90 --matrix M --launcher process --python /opt/venv/bin/python \\
          --image-paths --strategy MTP2                      # a GPU host without Docker: the capture only
      builder warm IMAGE --strategy MTP2 --from-dir warm/<tag>   # packs a capture from another host
    """
    from .. import docker
    from ..deploy import strategies, subject
    from ..deploy.runtime import gpus
    from ..deploy.smoke import Model, SmokeOptions, image_caches, smoke_image
    from ..image import labels as labels_mod
    from ..image.launchline import image_paths as paths_of
    from ..deploy.warm import layer as warm_mod
    from ..imageref import ImageRef
    from ..matrix import Selection

    say = (lambda s: click.echo(s, err=True))
    flags.process_only(run, cache_root=cache_root is not None, image_paths=image_paths, resume=resume)
    if resume and from_dir:
        raise UserError("--resume continues a cut cold boot on this host; --from-dir packs a capture: give one")
    if registry and run.launcher == "process":
        raise UserError("--push pushes a warm image; --launcher process captures only (no image here): push where "
                        "the capture is packed (--from-dir)")
    push_to = None
    if registry:  # refused now, not after minutes of boots
        from ..image import publish

        push_to = publish.make_target(registry, Path(images_json))
        publish.check_images_json(push_to.images_json)
    capture = Path(from_dir) if from_dir else None
    if capture is not None:
        tree, facts = warm_mod.read_capture(capture)  # refused before any docker call
    m = flags.given_matrix(matrix_path)  # its engine knowledge, where one is given (extra files)
    host = gpus.read() if run.gpus.mode != "none" else None
    model = Model.resolve(run.model, run.drafter) if capture is None else None

    def options(log_dir: Path, capture_to: Path | None) -> SmokeOptions:
        have_gpu, why = run.gpus.choose(host)
        return SmokeOptions(strategies=(strategy,), model=model, layers=("L3",), gpus=have_gpu, gpu_ids=run.gpus.ids,
                            l3_without_gpu=run.gpus.mode == "none", no_gpu_reason=why,
                            gpu_arch=host.arch if host is not None else None, boot_timeout=run.boot_timeout,
                            port=run.port, extra_args=run.engine_args, extra_env=run.env, log_dir=log_dir,
                            capture_to=capture_to)

    def capture_facts(cell, opts, cold_s, launcher) -> dict:
        gpu = host.gpus[0] if host is not None and host.present else None
        return {"cache_root": opts.cache_root, "strategy": strategy,
                "gpu": gpu.name if gpu else "none", "gpu-arch": f"sm{host.arch}" if host and host.arch else "none",
                "driver": gpu.driver if gpu else "none", "engine": f"{cell.engine} {cell.version}",
                "model": "tiny" if model.tiny else str(model.target), "model-config-sha256": _model_hash(model.target),
                "engine-args": " ".join(run.engine_args), "cold-boot-s": cold_s, "captured-on": launcher}

    def capture_dir(tag: str) -> Path:
        gpu_slug = f"sm{host.arch}" if host is not None and host.arch else "nogpu"
        return Path(out_dir) / warm_mod.tag_for(tag or "latest", strategy, gpu_slug)

    if run.launcher == "process":  # a GPU host without Docker: capture, and boot warm from it in place
        if capture is not None:
            raise UserError("--from-dir packs a capture into an image: that needs Docker (--launcher docker)")
        cell, _ = subject.target(target, m, Selection(), "process", matrix_path, what="warm TARGET")
        strategies.check_strategy(cell.engine_recipe, strategy, cell.strategies, target)
        capture = capture_dir(ImageRef.parse(cell.ref).tag)
        result = _process_capture(cell, capture, run, cache_root, image_paths, resume, options, capture_facts, say)
        click.echo(json.dumps(result, indent=2) if as_json else
                   f"{capture}: {result['files']} files, {result['bytes']} bytes under {result['cache_root']}, cold "
                   f"{result['cold_boot_s']} s, warm {result['warm_boot_s']} s; pack it where the image is: builder warm "
                   f"IMAGE --strategy {strategy} --from-dir {capture.name}")
        return

    image = target
    found = subject.read(image, what="IMAGE", files=False)
    lab = found.labels
    root = labels_mod.cache_root(lab)
    if not root:
        raise UserError(f"{image}: no {labels_mod.CACHE_ROOT} label: built before its compile caches had one root; "
                        "rebuild it")
    if labels_mod.warm(lab):
        raise UserError(f"{image}: already a warm image (label {labels_mod.WARM}); warm its cold image "
                        f"{labels_mod.warm(lab)['of']}")
    cell = subject.cell_from_labels(image, lab, m.knowledge if m is not None else None)
    strategies.check_strategy(cell.engine_recipe, strategy, labels_mod.strategies(lab), image)
    if capture is not None:
        _fits_the_image(capture, facts, root, paths_of(cell))
    if not found.local:
        raise UserError(f"{image}: not in the local daemon; pull it first (the warm layer is built FROM it by digest)")
    digest = found.image_id or docker.image_id(image)  # the image read: a tag moved since changes nothing
    ref = ImageRef.parse(image)
    repo = ref.name
    base = str(ref.with_digest(digest))
    if push_to is not None:
        _cold_is_published(push_to, cell, digest, say)

    def boot(target_image: str, opts: SmokeOptions):
        return _l3(smoke_image(cell, target_image, opts, say))

    if capture is None:  # boot with the cache root empty, capture what it compiled
        capture = capture_dir(ref.tag)
        if (capture / warm_mod.TREE).exists():
            shutil.rmtree(capture / warm_mod.TREE)
        capture.mkdir(parents=True, exist_ok=True)
        opts = options(capture.resolve() / "logs", capture.resolve() / warm_mod.TREE)
        image_caches(opts, lab)
        say(f"cold boot of {image} ({strategy}), caches under {opts.cache_root}")
        cold = boot(image, opts)
        (capture / warm_mod.TREE).mkdir(exist_ok=True)
        facts = {**capture_facts(cell, opts, cold.figures.get("boot_s"), "docker"),
                 "written-outside": cold.figures.get("written_outside_cache_root")}
        warm_mod.write_capture(capture, facts)
        tree, facts = warm_mod.read_capture(capture)

    files = warm_mod.file_list(tree)
    arch = facts.get("gpu-arch") or "none"
    tag = capture.name if from_dir is None else warm_mod.tag_for(ref.tag or "latest", strategy,
                                                                 "nogpu" if arch == "none" else arch)
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
        image_caches(opts, {**lab, **dict(labels_mod.warm_written({}, digest))})
        say(f"warm boot of {warm_ref}")
        try:
            warm_boot = boot(warm_ref, opts)
        except BootFailed:
            docker.untag_image(warm_ref, missing_ok=True)
            raise
        facts["warm-boot-s"] = warm_boot.figures.get("boot_s")
        warm_mod.write_capture(capture, facts)
        layer = packed.layer
        docker.untag_image(warm_ref, missing_ok=True)
        packed = pack({})
        assert packed.layer == layer, "the same files gave another layer"
    pushed = ""
    if push_to is not None:  # `publish` was imported where push_to was made
        repository = push_to.repository(cell.engine)
        pushed = publish.push_archive(packed.archive, repository, tag, packed.digest, False, push_to, say)
        data = publish.load_images(push_to.images_json)
        data["warm"][f"{repository}:{tag}"] = {
            "cell": cell.id, "digest": pushed, "pull": f"docker pull {repository}@{pushed}", "layer": packed.layer,
            "of": f"{repository}@{digest}", "strategy": strategy, "files": len(files), "bytes": sum(files.values()),
            **{k: facts.get(k) for k in ("gpu", "gpu-arch", "driver", "engine", "model", "model-config-sha256",
                                         "engine-args", "cold-boot-s", "warm-boot-s", "captured-on")}}
        publish.write_images(push_to.images_json, data)
        say(f"pushed {repository}:{tag} ({pushed}) beside its cold image; wrote {push_to.images_json}")
    result = {"image": warm_ref, "digest": packed.digest, "layer": packed.layer, "of": digest, "files": len(files),
              "bytes": sum(files.values()), "cold_boot_s": facts.get("cold-boot-s"),
              "warm_boot_s": facts.get("warm-boot-s"), "capture": str(capture), "pushed": pushed}
    click.echo(json.dumps(result, indent=2) if as_json else
               f"{warm_ref} {packed.digest}: {len(files)} files under {root}, cold {facts.get('cold-boot-s')} s, "
               f"warm {facts.get('warm-boot-s')} s")


def _cold_is_published(target, cell, digest: str, say) -> None:
    """A warm image is pushed beside its cold image: the registry must answer, and serve the cold image by the
    digest it was warmed from (its own `builder publish`), before any boot."""
    from ..image import publish

    publish.check_registry(target, say)  # down or refusing the credentials: exit 3 now
    repository = target.repository(cell.engine)
    served = publish.served_digest(f"{repository}@{digest}", target, say)
    if served != digest:
        raise UserError(f"--push {target.where.path}: {repository} does not serve the cold image {digest} that the "
                        "warm image is built FROM; publish it first (`builder publish`): a warm image is pushed beside "
                        "its cold image")


def _fits_the_image(capture: Path, facts: dict, root: str, paths) -> None:
    """A capture is packed into an image only when it was made at the image's paths: its cache root, and for one
    made by a process, the interpreter prefix, site-packages and CUDA_HOME the image has (--image-paths)."""
    if facts["cache_root"] != root:
        raise UserError(f"{capture}: captured at {facts['cache_root']}, the image's cache root is {root}: the caches' "
                        "keys hold absolute paths, a capture fits only the root it was made at")
    if facts.get("captured-on") != "process":
        return
    made = facts.get("layout")
    if not isinstance(made, dict):
        raise UserError(f"{capture}: captured by a process at this host's own paths (no --image-paths): the engine's "
                        "paths are in the caches' keys, so it is not the image's; capture again with --image-paths")
    want = paths.to_json()
    wrong = [f"{k} {made.get(k)!r} (the image's: {want[k]!r})" for k in ("prefix", "purelib", "cuda_home", "model_root")
             if made.get(k) != want[k]]
    if wrong:
        raise UserError(f"{capture}: captured at other paths than the image's: {'; '.join(wrong)}")


def _process_capture(cell, capture: Path, run, cache_root, image_paths: bool, resume: bool, options, capture_facts,
                     say) -> dict:
    """The capture on a host without Docker: a cold boot with the cache root empty (or, --resume, continuing one that
    was cut), what it left under the root copied to capture/tree, then a warm boot from it in place that may write
    only the allowance. A cold boot that fails leaving files under the root records itself in capture/cut.json."""
    from ..deploy.smoke import image_paths as at_image_paths, process_caches, smoke_process
    from ..deploy.warm import layer as warm_mod

    capture.mkdir(parents=True, exist_ok=True)
    opts = options(capture.resolve() / "logs", capture.resolve() / warm_mod.TREE)
    made_at = at_image_paths(opts, cell, run.python, cache_root) if image_paths else None
    process_caches(opts, cell, cache_root)
    if not opts.cache_root:
        raise UserError(f"{cell.id}: the engine data gives {cell.engine} {cell.version} no compile caches: nothing "
                        "to warm")
    root, cut_file = Path(opts.cache_root), capture / "cut.json"
    cut: dict = {}
    if resume:
        try:
            cut = json.loads(cut_file.read_text())
        except (OSError, ValueError):
            raise UserError(f"--resume: {cut_file}: no cut cold boot recorded (a cold boot that was cut writes it)") \
                from None
        if cut.get("cache_root") != opts.cache_root:
            raise UserError(f"--resume: the cut boot's caches are under {cut.get('cache_root')}, not {opts.cache_root}")
    elif any(root.rglob("*")):
        raise UserError(f"cache root {opts.cache_root}: not empty; the cold boot starts from an empty cache root (move "
                        "it away; --resume continues a cut cold boot)")
    shutil.rmtree(capture / warm_mod.TREE, ignore_errors=True)
    say(f"cold boot of {cell.id} ({opts.strategies[0]}, process{', at the image paths' if made_at else ''}), caches "
        f"under {opts.cache_root}" + (f", resumed after {cut['seconds']:.0f} s" if cut else ""))
    try:
        cold = _l3(smoke_process(cell, run.python, opts, say, extra_env=run.env))
    except BootFailed as exc:
        if root.is_dir() and any(p.is_file() for p in root.rglob("*")):
            spent = float(cut.get("seconds", 0)) + (exc.result.seconds if exc.result is not None else 0.0)
            cut_file.write_text(json.dumps({"cache_root": opts.cache_root, "seconds": round(spent, 1),
                                            "boots": int(cut.get("boots", 0)) + 1, "reason": str(exc)[-400:]}) + "\n")
            raise Failed(f"{exc}\nthe cold boot stopped after {spent:.0f} s in all; what it compiled stays under "
                         f"{root}: continue it with --resume (the same flags)") from None
        raise
    tree = capture / warm_mod.TREE
    if cut:  # this boot's diff misses what the cut boot wrote: everything under the root is the cold boots'
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(root, tree, symlinks=True)
    tree.mkdir(exist_ok=True)
    cold_s = round(cold.figures.get("boot_s", 0.0) + float(cut.get("seconds", 0)), 1)
    facts = {**capture_facts(cell, opts, cold_s, "process"), "layout": made_at,
             "cold-boots": int(cut.get("boots", 0)) + 1, "kv-cache-tokens-cold": cold.figures.get("kv_cache_tokens")}
    warm_mod.write_capture(capture, facts)
    tree, facts = warm_mod.read_capture(capture)
    files = warm_mod.file_list(tree)
    say(f"captured {len(files)} files, {sum(files.values())} bytes; warm boot from them in place")
    opts = dataclasses.replace(opts, log_dir=capture.resolve() / "logs-warm", capture_to=None,
                               warm_allowance=cell.warm_globs)
    warm_boot = _l3(smoke_process(cell, run.python, opts, say, extra_env=run.env))
    facts.update({"warm-boot-s": warm_boot.figures.get("boot_s"),
                  "warm-boot-files-written": warm_boot.figures.get("cache_files_written"),
                  "kv-cache-tokens-warm": warm_boot.figures.get("kv_cache_tokens")})
    warm_mod.write_capture(capture, facts)
    cut_file.unlink(missing_ok=True)
    return {"capture": str(capture), "cache_root": opts.cache_root, "files": len(files), "bytes": sum(files.values()),
            "cold_boot_s": facts["cold-boot-s"], "cold_boots": facts["cold-boots"], "warm_boot_s": facts["warm-boot-s"],
            "layout": made_at}
