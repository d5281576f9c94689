"""`builder snapshot take|restore|push|pull|criu`: a booted engine's snapshot (CRIU + the CUDA driver's checkpoint
API), restored where its key holds, shipped through a registry; and CRIU built for a host without Docker. The
stages are builder/deploy/snapshot/: this module reads flags, checks them before any work, and prints the result."""

from __future__ import annotations

import json
from pathlib import Path

import click

from . import flags
from .app import VerbGroup, main

ROUTES = click.Choice(["docker", "process"])


@main.group("snapshot", cls=VerbGroup)
def snapshot():
    """A booted engine's snapshot: `take` boots, asks smoke L3's request, quiesces (the engine data's sleep mode),
    checkpoints its CUDA processes and dumps its process tree with CRIU >= 4; `restore` judges the key (GPUs, driver,
    image digest, model, launch line, TP) and restores it in a fresh PID namespace, or refuses (exit 2: boot warm).

    \b
    Example:
      builder snapshot take IMAGE --strategy MTP2 --model /models/tiny --out snap/
      builder snapshot restore snap/ --image IMAGE
      builder snapshot take CELL --matrix M --launcher process --python /opt/venv/bin/python --strategy MTP2 \\
          --model /models/tiny --out /tmp/snap        # a GPU host without Docker
      builder snapshot restore /tmp/snap --launcher process
      builder snapshot criu --base ubuntu:24.04 --out criu/   # CRIU for that host, built here
    """


def _process_paths(cell, python: str, cache_root: str | None, image_paths: bool, served: str,
                   generated: bool) -> tuple[str, dict[str, str]]:
    """The process route's engine as smoke and warm run it: the cell's compile caches under --cache-root (or the
    image's root), and with --image-paths the interpreter checked at the image's prefix, its variables, and a model
    generated here reached under the image's model root (vLLM's compile-cache hash holds the model's path), so the
    engine boots from a warm layer restored there, as the warm image would."""
    from ..deploy.runtime import caches, imagepaths
    from ..deploy.runtime.engine import ProcessLauncher

    env = dict(caches.of_cell(cell, cache_root).env)
    if not image_paths:
        return served, env
    paths = imagepaths.of_cell(cell, python, cache_root)[0]
    if generated:
        served = ProcessLauncher(python=python, paths=paths).where(Path(served))
    return served, {**imagepaths.env(paths), **env}


def _out_dir(out: str, what: str = "the snapshot") -> Path:
    from ..errors import UserError

    if not out.strip():
        raise UserError(f"--out: empty; name the directory {what} goes to")
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory; {what} goes into a new one")
    return path


def _image(image: str):
    """(labels, digest) of an image the local daemon holds; refused in one line otherwise."""
    from ..deploy import subject
    from ..errors import UserError

    found = subject.read(image, what="IMAGE", files=False)
    if not found.local:
        raise UserError(f"{image}: no such image in the local daemon (build or pull it first)")
    return found.labels, found.image_id


@snapshot.command("take")
@click.argument("target")
@click.option("--strategy", default="", help="The strategy the engine boots with (its flags from the engine data).")
@click.option("--model", required=True, help="The model, as the engine is given it (a path where the engine runs).")
@click.option("--out", "out", required=True, type=flags.FsPath(file_okay=True),
              help="A new (or empty) directory: the CRIU images, key.json, snapshot.json, the engine's log.")
@click.option("--launcher", default="docker", show_default=True, type=ROUTES,
              help="docker: TARGET is an image, booted in a container with the capabilities CRIU needs; process: "
                   "TARGET is a cell of --matrix, booted on this host with --python.")
@click.option("--python", "python", default="python3", show_default=True, help="--launcher process: the interpreter.")
@click.option("--port", default=8000, show_default=True, type=flags.Number(1, 65535, "a TCP port", integer=True),
              help="The engine's port (in the container; on this host with --launcher process).")
@click.option("--tp", default=1, show_default=True, type=flags.Number(1, 64, "a tensor-parallel size", integer=True), help="Tensor parallel size.")
@click.option("--criu", default="criu", show_default=True, help="The criu program where the engine runs.")
@flags.engine_args
@flags.env
@click.option("--boot-timeout", default=900.0, show_default=True, type=flags.Number(1, 86400, "a number of seconds"),
              help="Seconds the engine has to boot and answer /v1/models before the snapshot is given up.")
@flags.cache_root(", so a warm layer restored there is what the engine boots from before it is snapshotted.")
@flags.image_paths
@flags.matrix
@flags.as_json
def take(target, strategy, model, out, launcher, python, port, tp, criu, engine_args, env, boot_timeout, cache_root,
         image_paths, matrix_path, as_json):
    """Snapshot TARGET booted (an image; a cell id with --launcher process) after it answered smoke L3's request.

    \b
    Example:
      builder snapshot take IMAGE --strategy MTP2 --model /models/tiny --out snap/
      # a GPU host: booted warm from a layer restored at the image's paths, then snapshotted
      builder snapshot take CELL --matrix M --launcher process --python /opt/venv/bin/python --image-paths \\
          --strategy MTP2 --model shape:27b --out snap/
    """
    from ..deploy import runflags, subject
    from ..deploy.runtime.engine import free_port
    from ..deploy.smoke import shapemodel
    from ..deploy.smoke.layers import Model
    from ..deploy.snapshot import place as place_mod
    from ..deploy.snapshot import noring
    from ..deploy.snapshot import take as take_mod
    from ..errors import UserError

    if not model.strip():
        raise UserError("--model: empty; name the model the engine serves")
    generated = model == "tiny" or shapemodel.is_shape(model)
    if generated and launcher == "docker":
        raise UserError(f"--model {model}: a generated model is written on this host, which the container does not "
                        "see; give the model's path in the image (or --launcher process)")
    extra, given_env = runflags.engine_args(engine_args), runflags.env_pairs(env)
    flags.process_only(type("Route", (), {"launcher": launcher}), cache_root=cache_root is not None,
                       image_paths=image_paths)
    if launcher == "process":
        _port_free(port, "the engine it boots")
    out_path = _out_dir(out)
    m = flags.given_matrix(matrix_path)
    kn = m.knowledge if m is not None else None
    if launcher == "docker":
        labels, digest = _image(target)
        cell = subject.cell_from_labels(target, labels, kn)
        identity, host = digest, "0.0.0.0"  # the container's published port reaches it on its own address
    else:
        from ..matrix import Selection

        cell, _ = subject.target(target, m, Selection(), "process", matrix_path, what="snapshot TARGET")
        identity, host = take_mod.venv_identity(python), "127.0.0.1"
    recipe = cell.engine_recipe
    if strategy and recipe.strategy_problem(strategy):
        raise UserError(f"--strategy {strategy}: {recipe.strategy_problem(strategy)}")
    served = str(Model.resolve(model).target) if generated else model  # tiny, shape:NAME: generated here
    at_paths = {}  # the process route's caches (and, --image-paths, the image's paths) in the engine's environment
    if launcher == "process":
        served, at_paths = _process_paths(cell, python, cache_root, image_paths, served, generated)
    argv = take_mod.line_for(recipe, strategy, served, port, host, tp, extra, generated=generated)
    if launcher == "process" and argv[0] in ("python", "python3"):
        argv = (python, *argv[1:])
    argv = noring.wrap(python if launcher == "process" else "python3", argv)  # no io_uring for CRIU to meet
    engine = take_mod.Engine(subject=target, identity=identity, recipe=recipe, argv=argv, model=model, tp=tp,
                             env=take_mod.engine_env(recipe, strategy, {**at_paths, **given_env}), served=served)
    if launcher == "docker":
        place = place_mod.Container(target, str(out_path), port, free_port())
    else:
        place = place_mod.Process(port=port)
    record = take_mod.take(engine, place, out_path, boot_timeout, lambda s: click.echo(s, err=True), criu=criu,
                           build_dir=out_path / "tool")
    click.echo(json.dumps(record, indent=2) if as_json else
               f"{out_path}: {record['processes']} process(es), {record['images']['bytes']} bytes of CRIU images, "
               f"dump {record['dump_s']} s")


@snapshot.command("restore")
@click.argument("directory", type=flags.FsPath(file_okay=True))
@click.option("--image", default=None, help="--launcher docker: the image to restore in (default: the snapshot's).")
@click.option("--launcher", default="docker", show_default=True, type=ROUTES,
              help="docker: restore in a fresh container of --image; process: on this host, in a new PID namespace.")
@click.option("--model", default=None, help="The model this deployment serves: refused unless the snapshot's.")
@click.option("--criu", default="criu", show_default=True, help="The criu program where it is restored.")
@click.option("--ready-timeout", default=600.0, show_default=True, type=flags.Number(1, 86400, "a number of seconds"),
              help="Seconds the restored engine has to answer /v1/models before the restore is undone.")
@click.option("--or-boot", is_flag=True,
              help="Where the snapshot does not hold here (another GPU, driver, image digest) or its restore fails, "
                   "boot the engine instead with the snapshot's own launch line (the warm boot, where the image holds "
                   "its warm layer) and exit 0 once it is ready; the result says why it was not restored. Another "
                   "model is still refused: that launch line serves the snapshot's.")
@flags.as_json
def restore(directory, image, launcher, model, criu, ready_timeout, or_boot, as_json):
    """Restore the snapshot in DIRECTORY where its key holds; refused before anything starts where it does not.

    \b
    Example:
      builder snapshot restore snap/
      builder snapshot restore /tmp/snap --launcher process --json
      builder snapshot restore snap/ --or-boot      # boot warm where it does not hold
    """
    import dataclasses

    from ..deploy.runtime import gpus
    from ..deploy.snapshot import key as key_mod
    from ..deploy.runtime.engine import free_port
    from ..deploy.snapshot import place as place_mod
    from ..deploy.snapshot import restore as restore_mod
    from ..deploy.snapshot import take as take_mod
    from ..errors import Failed, UserError

    path = Path(directory)
    snap = key_mod.read(path)
    record = restore_mod.read_record(path)
    names, driver = key_mod.gpu_part(gpus.read())
    if launcher == "docker":
        image = image or record["subject"]
        _, digest = _image(image)
        identity = digest
    else:
        identity = snap.subject if not snap.subject.startswith("venv ") else \
            take_mod.venv_identity(snap.engine_args[0])
    here = dataclasses.replace(snap, gpus=names, driver=driver, subject=identity, model=model or snap.model)
    port = int(_port_of(snap))
    if launcher == "process":
        _port_free(port, "the engine it restores, which listens where it was dumped")

    def place_here():
        if launcher == "docker":
            return place_mod.Container(image, str(path), port, free_port()).start()
        return place_mod.Process(port=port)

    say = lambda s: click.echo(s, err=True)  # noqa: E731
    try:
        restore_mod.judge(snap, dataclasses.replace(here, criu=snap.criu))  # before anything starts
        place = place_here()
        result = restore_mod.restore(path, snap, record, place, say, criu=criu, ready_timeout=ready_timeout,
                                     here_of=lambda v: dataclasses.replace(here, criu=v))
    except (UserError, Failed) as exc:
        # what stands in the way here (the key, CRIU, the checkpoint tool) or a failed restore; no fallback serves
        # another model: the launch line is the snapshot's
        if not or_boot or (model and model != snap.model):
            raise
        say(f"not restored: {exc}")
        place = place_here()
        result = restore_mod.boot_instead(path, snap, record, place, say, ready_timeout, why=str(exc))
    result["container"] = getattr(place, "cid", "")
    # how it ends: the container, or the init of its PID namespace (ending it ends every process restored there),
    # or the booted engine's process group
    result["stop"] = (f"docker rm -f {result['container']}" if result["container"] else
                      f"kill -KILL {place.ns_init}" if result["restored"] else f"kill -TERM -- -{result['pid']}")
    click.echo(json.dumps(result, indent=2) if as_json else
               f"{'restored' if result['restored'] else 'booted instead'}: ready in {result['ready_s']} s on "
               f"127.0.0.1:{result['port']}; to end it: {result['stop']}")


def _port_free(port: int, what: str) -> None:
    """Refused before anything starts when something already listens on 127.0.0.1:port: a client there would talk
    to that server, not to the snapshot's engine (an earlier restore still running is the usual one)."""
    from ..deploy.runtime.engine import port_in_use
    from ..errors import UserError

    if port_in_use(port):
        raise UserError(f"port {port} on 127.0.0.1 is in use: {what} needs it; end what listens there (an earlier "
                        "restore: the `stop` line of its result)")


def _port_of(snap) -> str:
    args = list(snap.engine_args)
    return args[args.index("--port") + 1] if "--port" in args else "8000"


@snapshot.command("push")
@click.argument("directory", type=flags.FsPath(file_okay=True))
@click.argument("ref")
@flags.as_json
def push(directory, ref, as_json):
    """Push the snapshot in DIRECTORY to REF (HOST[:PORT]/PATH:TAG), an OCI artifact: its key the config, its files
    one tar layer compressed with zstd. Tag it beside the warm image it was taken of.

    \b
    Example:
      builder snapshot push snap/ registry.example.com/ml/vllm:0.33.0-cu130-warm-mtp2-h200-snapshot
    """
    from ..deploy.snapshot import ship
    from ..errors import EnvironmentProblem, UserError
    from ..imageref import ImageRef
    from ..registry_api import CAUSES, Unusable, first_line

    parsed = ImageRef.parse(ref, "REF")
    if not parsed.registry:
        raise UserError(f"REF {ref}: name the registry (HOST[:PORT]/PATH:TAG)")
    try:
        done = ship.push(Path(directory), parsed, lambda s: click.echo(s, err=True))
    except Unusable as exc:
        raise EnvironmentProblem(f"snapshot push {ref}: {CAUSES.get(exc.cause, exc.cause)} ({first_line(exc)}); "
                                 "no tag was written") from None
    click.echo(json.dumps(done.to_json(), indent=2) if as_json else
               f"pushed {done.ref}@{done.digest}: {done.files} files, {done.unpacked_bytes:,} bytes as "
               f"{done.layer_bytes:,} (zstd) in {done.seconds} s")


@snapshot.command("pull")
@click.argument("ref")
@click.option("--out", "out", required=True, type=flags.FsPath(file_okay=True),
              help="A new (or empty) directory the snapshot is unpacked into, whole or not at all.")
@click.option("--any-gpu", is_flag=True,
              help="Fetch it even where its key names other GPUs or another driver than this host's (to carry it to "
                   "a host where it holds); without it such a snapshot is refused before its layer is fetched.")
@flags.as_json
def pull(ref, out, any_gpu, as_json):
    """Pull the snapshot REF (a tag or a digest) into --out, a new directory, whole or not at all. Its key is judged
    first (this host's GPUs and driver): a snapshot that cannot restore here is refused before its layer is fetched.

    \b
    Example:
      builder snapshot pull registry.example.com/ml/vllm:0.33.0-cu130-warm-mtp2-h200-snapshot --out snap/
      builder snapshot restore snap/
    """
    from ..deploy.runtime import gpus
    from ..deploy.snapshot import key as key_mod
    from ..deploy.snapshot import ship
    from ..errors import EnvironmentProblem, UserError
    from ..imageref import ImageRef
    from ..registry_api import CAUSES, Unusable, first_line

    parsed = ImageRef.parse(ref, "REF")
    if not parsed.registry:
        raise UserError(f"REF {ref}: name the registry (HOST[:PORT]/PATH:TAG or @sha256:...)")
    out_path = Path(out)
    ship.check_out(out_path)
    names, driver = key_mod.gpu_part(gpus.read())
    try:
        done = ship.pull(parsed, out_path, names, driver, any_gpu, lambda s: click.echo(s, err=True))
    except Unusable as exc:
        raise EnvironmentProblem(f"snapshot pull {ref}: {CAUSES.get(exc.cause, exc.cause)} ({first_line(exc)}); "
                                 f"nothing was written to {out}") from None
    click.echo(json.dumps(done.to_json(), indent=2) if as_json else
               f"pulled {done.ref}@{done.digest} into {out}: {done.files} files, {done.layer_bytes:,} bytes fetched, "
               f"{done.unpacked_bytes:,} unpacked, in {done.seconds} s")


@snapshot.command("criu")
@click.option("--base", required=True,
              help="The Debian or Ubuntu image CRIU is built on; its glibc must not be newer than the host's (e.g. "
                   "ubuntu:24.04 for an Ubuntu 24.04 host, or the profile's devel base).")
@click.option("--out", "out", required=True, type=flags.FsPath(file_okay=True),
              help="A new (or empty) directory: bin/criu, lib/ (the libraries it links), BUILT_ON.")
@flags.ca_bundle
@flags.as_json
def criu(base, out, ca_bundle, as_json):
    """Build CRIU for a GPU host without Docker (the process route's `--criu`): the runtime images' own CRIU (the
    same source, checksum and patch; Linux >= 6.16 needs it) built by BuildKit on --base, its libraries beside it
    and found from wherever the directory is put. Needs Docker with buildx here, not on the host.

    \b
    Example:
      builder snapshot criu --base ubuntu:24.04 --out criu/
      # on the GPU host: criu/bin/criu check; builder snapshot take CELL --launcher process --criu $PWD/criu/bin/criu ...
    """
    from .. import docker as docker_mod
    from ..deploy.snapshot import hostcriu
    from ..imageref import ImageRef
    from ..options import ca_bundle_path
    from ..runner import check_ca_bundle

    ImageRef.parse(base, "--base")  # a reference, refused in one line otherwise
    out_path = _out_dir(out, "CRIU")
    bundle = ca_bundle_path(ca_bundle)
    if bundle is not None:
        check_ca_bundle(Path(ca_bundle))  # named as given
    docker_mod.require_daemon()
    docker_mod.require_buildx()
    done = hostcriu.build(base, out_path, str(bundle) if bundle else None, lambda s: click.echo(s, err=True))
    click.echo(json.dumps(done, indent=2) if as_json else
               f"CRIU {done['criu']} in {out}: {len(done['files'])} files, {done['bytes']:,} bytes; built on "
               f"{'; '.join(done['built_on'][:2])}")
