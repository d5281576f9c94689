"""The warm pipeline, one call: `run(Request) -> Warmed | Captured`, what `builder warm` does once its flags are read.

With Docker (TARGET an image): boot it with its cache root empty (smoke L3's requests, the shapes the engine compiles
at its first requests), capture what the boot wrote under the root, pack the warm image (layer.py: the image plus
that one layer, loaded into the daemon under its warm tag), boot it once more from the warm layer (it may write only
the engine data's warm_allowance), pack it again with the warm boot's seconds (the same files give the same layer)
and, given a registry, push it beside its cold image and list it in images.json's `warm` table (publish writes the
file). A capture made elsewhere (`from_dir`) is packed without a boot.

With the process launcher (a GPU host without Docker, TARGET a cell of the matrix): a cold boot at an empty cache
root (or, `resume`, continuing one that was cut: the capture's cut.json), the capture, and a warm boot from it in
place; the capture is packed where the image is."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ... import docker, files, redact
from ...errors import Failed, UserError
from ...image import labels as labels_mod
from ...image import publish
from ...image.launchline import image_paths as paths_of
from ...imageref import ImageRef
from ...matrix import Matrix, Selection
from ...resolve import Cell
from .. import strategies, subject
from ..runflags import RunFlags
from ..runtime import caches, gpus, imagepaths
from ..smoke import Model, SmokeOptions, smoke_image, smoke_process
from ..runtime import warmkey as key_mod
from . import layer

CUT = "cut.json"  # a process capture's cold boot record: --resume continues what it says
MAX_BOOT_S = 10**7  # seconds (and boots) no record of a real cold boot comes near


@dataclass(frozen=True)
class Request:
    """What to warm and how: `builder warm`'s flags, read. Flags that cannot go together are refused here, before
    any work."""

    target: str  # an image (docker); a cell id of `matrix` (process)
    strategy: str  # one per warm image
    run: RunFlags  # what starts the engine
    matrix: Matrix | None = None  # the given matrix: its engine knowledge, and its cells for the process launcher
    matrix_path: str = "matrix.toml"  # named when a cell id finds no matrix
    cache_root: str | None = None  # process: where the caches go (default the image's own root)
    image_paths: bool = False  # process: the engine runs at the image's paths
    resume: bool = False  # process: the cache root holds a cut cold boot of this capture (its cut.json)
    from_dir: Path | None = None  # pack this capture (DIR/tree, DIR/warm.json): no boot
    out_dir: Path = Path("warm")  # captures go to out_dir/<warm tag>/
    registry: str | None = None  # push the warm image there (HOST[:PORT]/PATH, as publish's --registry)
    images_json: Path = Path("images.json")  # with registry: where it is listed

    def __post_init__(self) -> None:
        if self.resume and self.from_dir is not None:
            raise UserError("--resume continues a cut cold boot on this host; --from-dir packs a capture: give one")
        if self.run.tp != 1:  # the capture is one engine's boot on one GPU: its caches are not a sharded one's
            raise UserError(f"--tp {self.run.tp}: builder warm captures a boot of one engine on one GPU (tensor "
                            "parallel 1); a warm layer for a sharded engine is not made")
        if self.registry and self.run.launcher == "process":
            raise UserError("--push pushes a warm image; --launcher process captures only (no image here): push where "
                            "the capture is packed (--from-dir)")


@dataclass(frozen=True)
class Warmed:
    """The warm image made (docker): its name and digests, the capture, the boots' seconds, where it was pushed."""

    image: str  # REPO:<warm tag>, in the local daemon
    digest: str
    layer: str  # the warm layer's digest
    of: str  # the cold image's digest
    files: int
    bytes: int
    cold_boot_s: float | None
    warm_boot_s: float | None
    capture: str
    pushed: str  # the digest the registry serves it by ("" when not pushed)
    cache_root: str  # where the layer's files are in the image

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "cache_root"}

    def text(self) -> str:
        return (f"{self.image} {self.digest}: {self.files} files under {self.cache_root}, cold {self.cold_boot_s} s, "
                f"warm {self.warm_boot_s} s")


@dataclass(frozen=True)
class Captured:
    """The capture made by a process (no Docker): where it is, what it holds, its boots."""

    capture: str
    cache_root: str
    files: int
    bytes: int
    cold_boot_s: float | None
    cold_boots: int  # 1, and one more for each cut boot it continued
    warm_boot_s: float | None
    layout: dict | None  # the image paths it was made at (None: this host's own)
    strategy: str

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "strategy"}

    def text(self) -> str:
        return (f"{self.capture}: {self.files} files, {self.bytes} bytes under {self.cache_root}, cold "
                f"{self.cold_boot_s} s, warm {self.warm_boot_s} s; pack it where the image is: builder warm IMAGE "
                f"--strategy {self.strategy} --from-dir {Path(self.capture).name}")


Result = Warmed | Captured


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


@dataclass(frozen=True)
class Boots:
    """What every boot of one request shares: the request, this host's GPUs (None with --gpus none) and the model
    (None when a capture is packed, not made)."""

    request: Request
    host: gpus.HostGpus | None
    model: Model | None

    @classmethod
    def of(cls, request: Request) -> Boots:
        """This host's GPUs; the model only once a boot is to come (with_model)."""
        run = request.run
        return cls(request, gpus.read() if run.gpus.mode != "none" else None, None)

    def with_model(self) -> Boots:
        """These boots with their model (--model, --drafter) resolved: 'tiny' is generated once, into the cache."""
        run = self.request.run
        return dataclasses.replace(self, model=Model.resolve(run.model, run.drafter))

    def options(self, log_dir: Path, capture_to: Path | None) -> SmokeOptions:
        run, host = self.request.run, self.host
        have_gpu, why = run.gpus.choose(host)
        return SmokeOptions(strategies=(self.request.strategy,), model=self.model, layers=("L3",), gpus=have_gpu,
                            gpu_ids=run.gpus.ids, l3_without_gpu=run.gpus.mode == "none", no_gpu_reason=why,
                            gpu_arch=host.arch if host is not None else None, boot_timeout=run.boot_timeout,
                            port=run.port, extra_args=run.engine_args, extra_env=run.env, log_dir=log_dir,
                            capture_to=capture_to, gpu=self.gpu() if have_gpu else None,
                            warm_keys=key_mod.of_knowledge(self.request.matrix.knowledge if self.request.matrix else None))

    def gpu(self):
        """The GPU the boots run on (HostGpus.chosen); None without one."""
        return self.host.chosen(self.request.run.gpus.ids) if self.host is not None else None

    def facts(self, cell, opts: SmokeOptions, booted, cold_s, launcher: str, tree: Path) -> dict:
        """warm.json's facts of a capture: what it was made for and on, the cold boot's seconds, and the whole key
        of its caches (runtime/warmkey.py: this GPU, the launch line the engine ran, its environment, the model's
        config, the rank directories and files per cache the tree holds)."""
        model, gpu = self.model, self.gpu()
        config = key_mod.model_config_sha(model.target)
        record = key_mod.Record.of(gpu, booted.figures.get("launch_args", ()), booted.figures.get("launch_env", {}),
                                   config, key_mod.ranks_in(tree),
                                   key_mod.files_per_cache(layer.file_list(tree), key_mod.cache_subdirs()))
        return {"cache_root": opts.cache_root, "strategy": self.request.strategy,
                "gpu": gpu.name if gpu else "none", "gpu-arch": f"sm{gpu.compute_cap}" if gpu else "none",
                "driver": gpu.driver if gpu else "none", "engine": f"{cell.engine} {cell.version}",
                "model": model.label, "model-config-sha256": config or "",
                "engine-args": " ".join(self.request.run.engine_args), "cold-boot-s": cold_s,
                "captured-on": launcher, "key": record.to_label()}

    def capture_dir(self, tag: str) -> Path:
        gpu_slug = f"sm{self.host.arch}" if self.host is not None and self.host.arch else "nogpu"
        return Path(self.request.out_dir) / layer.tag_for(tag or "latest", self.request.strategy, gpu_slug)


def run(request: Request, say: Callable[[str], None] = lambda s: None) -> Result:
    """The warm image of request.target (docker), or its capture (process); `say` hears the progress."""
    push_to = None
    if request.registry:  # refused now, not after minutes of boots
        push_to = publish.make_target(request.registry, Path(request.images_json))
        publish.check_images_json(push_to.images_json)
    given = layer.read_capture(request.from_dir) if request.from_dir is not None else None  # before any docker call
    if request.run.launcher == "process":  # a GPU host without Docker: capture, and boot warm from it in place
        return _capture_in_place(Boots.of(request), say)
    return _warm_image(request, push_to, given, say)


# -- the process route: a capture on a host without Docker -------------------------------------------------------
def _capture_in_place(boots: Boots, say) -> Captured:
    """A cold boot with the cache root empty (or, resume, continuing one that was cut), what it left under the root
    copied to capture/tree, then a warm boot from it in place that may write only the allowance. A cold boot that
    fails leaving files under the root records itself in capture/cut.json. Every refusal comes before the capture
    directory is made and the model is resolved: a refused run writes nothing."""
    req = boots.request
    if req.from_dir is not None:
        raise UserError("--from-dir packs a capture into an image: that needs Docker (--launcher docker)")
    cell, _ = subject.target(req.target, req.matrix, Selection(), "process", req.matrix_path, what="warm TARGET")
    strategies.check_strategy(cell.engine_recipe, req.strategy, cell.strategies, req.target)
    capture = boots.capture_dir(ImageRef.parse(cell.ref).tag)
    setting = caches.of_cell(cell, req.cache_root)
    if not setting.root:
        raise UserError(f"{cell.id}: the engine data gives {cell.engine} {cell.version} no compile caches: nothing "
                        "to warm")
    root, cut_file = Path(setting.root), capture / CUT
    files.check_kind(root, "cache root", "directory")  # a file, a FIFO, a symlink loop in its place
    files.writable_dir(root, "cache root")  # under a file, read-only
    cut = _cut_boot(cut_file, setting.root) if req.resume else {}
    if not req.resume and root.is_dir() and any(root.iterdir()):
        raise UserError(f"cache root {setting.root}: not empty; the cold boot starts from an empty cache root (move "
                        "it away; --resume continues a cut cold boot)")
    paths, made_at = imagepaths.of_cell(cell, req.run.python, req.cache_root) if req.image_paths else (None, None)
    boots = boots.with_model()
    opts = boots.options(capture.resolve() / "logs", capture.resolve() / layer.TREE)
    opts = dataclasses.replace(opts, paths=paths, caches=setting)
    capture.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(capture / layer.TREE, ignore_errors=True)
    say(f"cold boot of {cell.id} ({opts.strategies[0]}, process{', at the image paths' if made_at else ''}), caches "
        f"under {opts.cache_root}" + (f", resumed after {cut['seconds']:.0f} s" if cut else ""))
    cold = _cold_boot_in_place(req, cell, opts, cut, cut_file, say)
    tree = capture / layer.TREE
    if cut:  # this boot's diff misses what the cut boot wrote: everything under the root is the cold boots'
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(root, tree, symlinks=True)
    tree.mkdir(exist_ok=True)
    cold_s = round(cold.figures.get("boot_s", 0.0) + float(cut.get("seconds", 0)), 1)
    facts = {**boots.facts(cell, opts, cold, cold_s, "process", tree), "layout": made_at,
             "cold-boots": int(cut.get("boots", 0)) + 1, "kv-cache-tokens-cold": cold.figures.get("kv_cache_tokens")}
    layer.write_capture(capture, facts)
    tree, facts = layer.read_capture(capture)
    captured = layer.file_list(tree)
    say(f"captured {len(captured)} files, {sum(captured.values())} bytes; warm boot from them in place")
    opts = dataclasses.replace(opts, log_dir=capture.resolve() / "logs-warm", capture_to=None,
                               caches=opts.caches.warm_boot(cell.warm_globs))
    warm_boot = _l3(smoke_process(cell, req.run.python, opts, say, extra_env=req.run.env))
    facts.update({"warm-boot-s": warm_boot.figures.get("boot_s"),
                  "warm-boot-files-written": warm_boot.figures.get("cache_files_written"),
                  "kv-cache-tokens-warm": warm_boot.figures.get("kv_cache_tokens")})
    layer.write_capture(capture, facts)
    cut_file.unlink(missing_ok=True)
    return Captured(capture=str(capture), cache_root=opts.cache_root, files=len(captured),
                    bytes=sum(captured.values()), cold_boot_s=facts["cold-boot-s"], cold_boots=facts["cold-boots"],
                    warm_boot_s=facts["warm-boot-s"], layout=made_at, strategy=req.strategy)


def _cut_boot(cut_file: Path, cache_root: str) -> dict:
    """--resume: the cut cold boot cut_file records, whose caches are under cache_root. A boot that was killed
    outright (no handler ran) left its record as it began it (`running_since`): its seconds are those until the
    last file it wrote under the root."""
    if not cut_file.exists():
        raise UserError(f"--resume: {cut_file}: no cut cold boot recorded (a cold boot writes it as it starts); to "
                        f"start over, move {cache_root} away and run without --resume")
    cut = files.load_json(cut_file, "cut cold boot record")
    fields = {"cache_root": str, "seconds": (int, float), "boots": int}
    if not isinstance(cut, dict) or any(not isinstance(cut.get(k), t) or isinstance(cut.get(k), bool)
                                        for k, t in fields.items()):
        raise UserError(f"--resume: {cut_file}: not a cut cold boot record (it needs cache_root, seconds and boots, as "
                        f"a cold boot writes them); to start over, move {cache_root} away and run without --resume")
    if cut["cache_root"] != cache_root:
        raise UserError(f"--resume: the cut boot's caches are under {redact.describe(cut['cache_root'])}, not "
                        f"{cache_root}")
    if not (0 <= cut["seconds"] <= MAX_BOOT_S and 0 <= cut["boots"] <= MAX_BOOT_S):
        raise UserError(f"--resume: {cut_file}: {cut['seconds']!r} seconds in {cut['boots']!r} boots is no cut cold "
                        "boot's record")
    since = cut.get("running_since")
    if isinstance(since, (int, float)) and not isinstance(since, bool):  # killed outright: until its last write
        last = max((p.stat().st_mtime for p in Path(cache_root).rglob("*") if p.is_file()), default=since)
        cut["seconds"] = round(cut["seconds"] + min(max(0.0, last - since), MAX_BOOT_S), 1)
    return cut


def _record_cut(cut_file: Path, cache_root: str, seconds: float, boots: int, reason: str, **more) -> None:
    """cut.json, written whole (a temporary file renamed over it): a killed write leaves the last record."""
    tmp = cut_file.with_name(cut_file.name + ".tmp")
    tmp.write_text(json.dumps({"cache_root": cache_root, "seconds": round(seconds, 1), "boots": boots,
                               "reason": reason[-400:], **more}) + "\n")
    tmp.replace(cut_file)


def _cold_boot_in_place(req: Request, cell, opts: SmokeOptions, cut: dict, cut_file: Path, say):
    """The cold boot's L3 result. Its record (cut.json) is written as it starts, so a boot killed outright (SIGKILL,
    a lost session) is continued by --resume too; one that fails or is interrupted leaving files under the root
    records its seconds (added to those of the boots it continued) and says how to continue it; one that passes
    records itself as done, for a warm boot that fails after it."""
    root, before, boots = Path(opts.cache_root), float(cut.get("seconds", 0)), int(cut.get("boots", 0)) + 1
    started = time.time()
    _record_cut(cut_file, opts.cache_root, before, boots, "killed before it ended", running_since=started)
    try:
        result = _l3(smoke_process(cell, req.run.python, opts, say, extra_env=req.run.env))
    except (BootFailed, KeyboardInterrupt) as exc:
        spent = before + (exc.result.seconds if getattr(exc, "result", None) is not None else time.time() - started)
        if not (root.is_dir() and any(p.is_file() for p in root.rglob("*"))):
            cut_file.unlink(missing_ok=True)  # nothing to continue
            raise
        _record_cut(cut_file, opts.cache_root, spent, boots, str(exc) or "interrupted")
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise Failed(f"{exc}\nthe cold boot stopped after {spent:.0f} s in all; what it compiled stays under "
                     f"{root}: continue it with --resume (the same flags)") from None
    _record_cut(cut_file, opts.cache_root, before + float(result.figures.get("boot_s", 0.0)), boots, "done")
    return result


# -- the docker route: the warm image ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Cold:
    """The cold image to warm, read from the local daemon: its labels, cache root, cell and digest."""

    image: str
    labels: dict
    root: str
    cell: Cell
    digest: str  # what it was read as: a tag moved since changes nothing

    @property
    def ref(self) -> ImageRef:
        return ImageRef.parse(self.image)

    @property
    def base(self) -> str:
        """The warm layer's FROM: the cold image by digest."""
        return str(self.ref.with_digest(self.digest))


@dataclass(frozen=True)
class Packing:
    """One capture packed into one warm image: FROM the cold image by digest, the capture's tree at the cache root,
    labelled with the capture's facts, loaded into the daemon under `name`."""

    tree: Path
    files: dict[str, int]
    cold: Cold
    work: Path
    name: str  # REPO:<warm tag>
    epoch: str
    compression: str = "zstd"  # the warm layer's (the matrix's layer_compression); the cold image's layers stay as they are

    def pack(self, facts: dict) -> layer.Packed:
        values = {**facts, "files": str(len(self.files)), "bytes": str(sum(self.files.values()))}
        values = {k: "" if v is None else str(v) for k, v in values.items()}
        packed = layer.pack(self.tree, self.cold.root, self.cold.base,
                            labels_mod.warm_written(values, self.cold.digest), self.work, self.name, self.epoch,
                            compression=self.compression)
        layer.load(packed, self.name)
        return packed


def _warm_image(req: Request, push_to, given: tuple[Path, dict] | None, say) -> Warmed:
    cold = _read_cold(req, given)
    if push_to is not None:
        _cold_is_published(push_to, cold.cell, cold.digest, say)
    boots = Boots.of(req)  # once the image may be warmed
    if given is None:
        boots = boots.with_model()  # a capture packed from another host boots nothing here
    if given is None:  # boot with the cache root empty, capture what it compiled
        capture, tree, facts = _cold_capture(boots, cold, say)
        tag = capture.name
    else:
        capture, (tree, facts) = Path(req.from_dir), given
        arch = facts.get("gpu-arch") or "none"
        tag = layer.tag_for(cold.ref.tag or "latest", req.strategy, "nogpu" if arch == "none" else arch)
    files = layer.file_list(tree)
    work = capture / "build"
    code, out = docker.make_local_digest_resolvable(cold.base, cold.image, work / "resolve")
    if code != 0:
        raise UserError(f"{cold.base}: BuildKit cannot resolve the image by digest here: {out[-300:]}")
    packing = Packing(tree, files, cold, work, f"{cold.ref.name}:{tag}", layer.image_epoch(cold.image),
                      req.matrix.defaults["layer_compression"] if req.matrix is not None else "zstd")
    packed = packing.pack(facts)
    say(f"warm layer {packed.layer}: {len(files)} files, {sum(files.values())} bytes; {packing.name} ({packed.digest})")
    if given is None:
        packed = _warm_boot(boots, packing, capture, facts, packed, say)
    pushed = _push(push_to, packing, tag, packed, facts, req.strategy, say) if push_to is not None else ""
    return Warmed(image=packing.name, digest=packed.digest, layer=packed.layer, of=cold.digest, files=len(files),
                  bytes=sum(files.values()), cold_boot_s=facts.get("cold-boot-s"),
                  warm_boot_s=facts.get("warm-boot-s"), capture=str(capture), pushed=pushed, cache_root=cold.root)


def _read_cold(req: Request, given: tuple[Path, dict] | None) -> Cold:
    """The cold image, refused when it cannot be warmed here: no cache root label, already warm, not built for the
    strategy, not the image a given capture was made for, not in the local daemon."""
    image = req.target
    found = subject.read(image, what="IMAGE", files=False)
    lab = found.labels
    root = labels_mod.cache_root(lab)
    if not root:
        raise UserError(f"{image}: no {labels_mod.CACHE_ROOT} label: built before its compile caches had one root; "
                        "rebuild it")
    if labels_mod.warm(lab):
        raise UserError(f"{image}: already a warm image (label {labels_mod.WARM}); warm its cold image "
                        f"{redact.describe(labels_mod.warm(lab)['of'])}")
    cell = subject.cell_from_labels(image, lab, req.matrix.knowledge if req.matrix is not None else None)
    strategies.check_strategy(cell.engine_recipe, req.strategy, labels_mod.strategies(lab), image)
    if given is not None:
        _fits_the_image(Path(req.from_dir), given[1], root, paths_of(cell))
    if not found.local:
        raise UserError(f"{image}: not in the local daemon; pull it first (the warm layer is built FROM it by digest)")
    return Cold(image, lab, root, cell, found.image_id or docker.image_id(image))


def _cold_capture(boots: Boots, cold: Cold, say) -> tuple[Path, Path, dict]:
    """(capture, tree, facts) of the cold image's boot with its cache root empty."""
    capture = boots.capture_dir(cold.ref.tag)
    if (capture / layer.TREE).exists():
        shutil.rmtree(capture / layer.TREE)
    capture.mkdir(parents=True, exist_ok=True)
    opts = boots.options(capture.resolve() / "logs", capture.resolve() / layer.TREE)
    opts = dataclasses.replace(opts, caches=caches.of_image(cold.labels))
    say(f"cold boot of {cold.image} ({boots.request.strategy}), caches under {opts.cache_root}")
    booted = _l3(smoke_image(cold.cell, cold.image, opts, say))
    (capture / layer.TREE).mkdir(exist_ok=True)
    facts = {**boots.facts(cold.cell, opts, booted, booted.figures.get("boot_s"), "docker", capture / layer.TREE),
             "written-outside": booted.figures.get("written_outside_cache_root")}
    layer.write_capture(capture, facts)
    return (capture, *layer.read_capture(capture))


def _warm_boot(boots: Boots, packing: Packing, capture: Path, facts: dict, packed: layer.Packed,
               say) -> layer.Packed:
    """Booted once more, from the warm layer: it must compile nothing beyond the allowance. Its seconds join the
    facts, and the image is packed again with them (the same files: the same layer)."""
    cold = packing.cold
    opts = boots.options(capture.resolve() / "logs-warm", None)
    warm_labels = {**cold.labels, **dict(labels_mod.warm_written({}, cold.digest))}
    opts = dataclasses.replace(opts, caches=caches.of_image(warm_labels))
    say(f"warm boot of {packing.name}")
    try:
        warm_boot = _l3(smoke_image(cold.cell, packing.name, opts, say))
    except BootFailed:
        docker.untag_image(packing.name, missing_ok=True)
        raise
    facts["warm-boot-s"] = warm_boot.figures.get("boot_s")
    layer.write_capture(capture, facts)
    docker.untag_image(packing.name, missing_ok=True)
    again = packing.pack(facts)
    assert again.layer == packed.layer, "the same files gave another layer"
    return again


def _push(push_to, packing: Packing, tag: str, packed: layer.Packed, facts: dict, strategy: str, say) -> str:
    """The warm image pushed by digest beside its cold image, and listed in images.json's `warm` table."""
    cold, files = packing.cold, packing.files
    repository = push_to.repository(cold.cell.engine)
    referrers = _attest(push_to, repository, packed, say) if push_to.attestations else []
    pushed = publish.push_archive(packed.archive, repository, tag, packed.digest, False, push_to, say)
    publish.record_warm(push_to.images_json, f"{repository}:{tag}", {
        "cell": cold.cell.id, "digest": pushed, "pull": f"docker pull {repository}@{pushed}", "layer": packed.layer,
        "of": f"{repository}@{cold.digest}", "strategy": strategy, "files": len(files),
        "bytes": sum(files.values()),
        **{k: facts.get(k) for k in ("gpu", "gpu-arch", "driver", "engine", "model", "model-config-sha256",
                                     "engine-args", "cold-boot-s", "warm-boot-s", "captured-on", "key")},
        "referrers": referrers})
    say(f"pushed {repository}:{tag} ({pushed}) beside its cold image; wrote {push_to.images_json}")
    return pushed


def _attest(push_to, repository: str, packed: layer.Packed, say) -> list[dict]:
    """The warm image's SBOM (its files, the warm layer's included) and its warm provenance (the cold image, the
    layer, the warm key: what its labels claim), attached before its tag is pushed (builder/image/attest.py)."""
    from ...image import attest, oci, provenance, signing

    started = attest.now()
    with oci.Archive(packed.archive) as a:
        image = a.image()
    warm = labels_mod.warm((image.config.get("config") or {}).get("Labels") or {})
    predicate = provenance.warm_predicate(warm.get("of", ""), packed.layer, {**warm}, started=started,
                                          finished=attest.now())
    return attest.attach_image(push_to.where, repository, packed.archive, image, predicate, signing.signer_from_env(),
                               say)


def _cold_is_published(target, cell, digest: str, say) -> None:
    """A warm image is pushed beside its cold image: the registry must answer, and serve the cold image by the
    digest it was warmed from (its own `builder publish`), before any boot."""
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
