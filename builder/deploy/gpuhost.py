"""On the GPU host (no Docker, no network): bring a carry bundle in from its parts, install it, and run builder's
smoke or bench there with the serve flags of its spec (scripts/gpu-host/<name>.toml). The parts of a bundle may
arrive over several calls (a call carries at most 64 MiB): `stash` keeps the parts of this call under --store.
Names follow the cell/bundle grammar (builder/grammar.py: one path component, no shell text); parts are joined in
the order of their numbers; a new bundle under an installed name is installed in its place.

    scripts/gpu-host-run stash vllm-0.26.0                 # parts carried in this call -> the store
    scripts/gpu-host-run install vllm-0.26.0               # join (store + carried), check SHA256SUMS, pip install
    scripts/gpu-host-run bench vllm-0.26.0 [builder bench options...]   # installs first if needed
    scripts/gpu-host-run smoke vllm-0.26.0 [builder smoke options...]
    scripts/gpu-host-run bench sglang-0.5.17 --client vllm-0.26.0 [...] # SGLang driven by vLLM's client
    scripts/gpu-host-run bench vllm-0.26.0 --with extra [...]           # + a bundle of wheels it lacked
    scripts/gpu-host-run warm vllm-0.26.0 --image-paths --strategy MTP2 [...]   # capture a warm layer's files
    scripts/gpu-host-run smoke vllm-0.26.0 --image-paths --restore LAYER.tar.gz --expect-warm [...]
    scripts/gpu-host-run layer CAPTURE OUT [--part-mib 15] [--epoch N]   # a capture -> a warm layer in parts
    scripts/gpu-host-run smoke vllm-0.26.0 --image-paths --restore OUT --expect-warm [...]  # those parts, joined
    scripts/gpu-host-run smoke vllm-0.26.0 --image-paths --slim --layers L3 [...]  # the runtime's slim step first
    scripts/gpu-host-run snapshot vllm-0.26.0 take --strategy MTP2 --model tiny --out DIR [--criu C]  # issue 52
    scripts/gpu-host-run snapshot vllm-0.26.0 restore DIR [--criu C] [--json]

--image-paths runs the engine at the runtime image's paths (builder/image/launchline.py ImagePaths): a venv at the image's prefix
made from this host's interpreter, the bundles' files in its site-packages (scripts pointed at its python), this
host's own packages linked in beside them, CUDA_HOME linked to this host's toolkit; builder then checks that
interpreter and runs the engine with it (the compile caches' keys hold these paths). --restore LAYER (a warm layer's
tar, as `builder warm` packs it) puts its files at the image's cache root first, which must be empty: only members
under that root are taken, with the layer's file times, and the venv's own files are set back to that time, as in the
image (ninja, FlashInfer's JIT, rebuilds whatever looks older than its inputs or newer than its deps log).

--slim (with --image-paths) runs the runtime install's slim step (dockerfiles/macros.j2 slim, rendered for the
spec's cell: newer archs' JIT sources, `tests` directories, files shipped twice hard-linked) over that venv's
site-packages before the verb, so a boot on this host proves what a slimmed image's boot would; the host's own
packages, linked in, are left alone (find and hardlink do not follow links).

`snapshot NAME take|restore` is builder snapshot on this host (--launcher process) with the bundle's interpreter:
take boots the spec's cell with the spec's serve flags and snapshots it; restore brings DIR back in a new PID
namespace, where its key holds (builder/deploy/snapshot/).

`layer CAPTURE OUT` makes that tar without Docker from a capture of `warm --image-paths` (its tree/ at its cache root,
every time the oldest captured file's, or --epoch: builder/deploy/warm/layer.py tar_layer) and writes it to OUT in
parts of --part-mib MiB (default 15: a device call brings back files of 16 MiB at most) with SHA256SUMS; --restore
takes that directory too, checks every part and joins them.

The bundle, its spec and the venv: builder/deploy/runtime/hostenv.py; --restore: builder/deploy/warm/restore.py.
Exit codes as builder's: 2 bad input, 3 what this host lacks, 1 a bundle that does not check out (or builder's own).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import EXIT_BAD_INPUT, BuilderError, UserError
from .runtime import hostenv
from .runtime.hostenv import Store, checked_name
from .warm import restore as restore_mod

MATRIX = "tests/fixtures/gpu-host/matrix.toml"
VERBS = ("stash", "install", "bench", "smoke", "warm", "layer", "snapshot")
SNAPSHOT_ACTIONS = ("take", "restore")
LAYER_PART_MIB = 15  # what comes back from a device call: files of 16 MiB at most
OWN_FLAGS = ("--client", "--with", "--restore")  # this route's own flags, each with a value
OWN_SWITCHES = ("--slim",)  # and those without one


def one_line(call: Callable[[], int], interrupted: str, faults: tuple[type[BaseException], ...] = (OSError,)) -> int:
    """`call()`'s exit code; a refusal or a fault as one `error: ` line on stderr instead of a traceback: a
    BuilderError with its exit code (2 bad input, 3 the environment, 1 failed), an interrupt (130, saying
    `interrupted`), a fault no check foresaw (`faults`: the path and the OS's words, 1). Both GPU-host scripts
    answer through it."""
    try:
        return call()
    except BuilderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"error: interrupted: {interrupted}", file=sys.stderr)
        return 130
    except faults as exc:
        print(f"error: {getattr(exc, 'filename', None) or ''}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 1


def main(argv: list[str], checkout: Path) -> int:
    """scripts/gpu-host-run ARGV, the checkout being the one the script is in (its .carry/, scripts/gpu-host/)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) < 2 or argv[0] not in VERBS:
        got = f"unknown verb {argv[0]!r}" if argv and argv[0] not in VERBS else "no bundle name" if argv else "no verb"
        print(f"error: {got}: usage: scripts/gpu-host-run stash|install|bench|smoke|warm|snapshot NAME [...] | layer CAPTURE OUT "
              "(--help says more)", file=sys.stderr)
        return EXIT_BAD_INPUT
    verb, name, rest = argv[0], argv[1], argv[2:]
    if verb == "layer":
        return one_line(lambda: pack_layer(argv[1:]), "the parts under OUT are incomplete: make them again")
    store = Store.from_env(checkout)

    def run() -> int:
        checked_name(name)
        if verb == "stash":
            hostenv.stash(store, name)
            return 0
        if verb == "install":
            hostenv.install(store, name)
            return 0
        return run_builder(store, verb, name, rest)

    return one_line(run, "nothing half-done is left (the installed bundle, if any, is as it was)")


def own_flags(rest: list[str]) -> tuple[str | None, list[str], Path | None]:
    """(--client, the --with bundles, --restore's layer), taken out of `rest` (what goes to builder)."""
    client, extra, layer = None, [], None
    while own := [f for f in OWN_FLAGS if f in rest]:
        flag = own[0]
        i = rest.index(flag)
        if i + 1 >= len(rest):
            raise UserError(f"{flag} needs {'a layer file' if flag == '--restore' else 'a bundle name'}")
        value = rest[i + 1]
        del rest[i:i + 2]
        if flag == "--client":
            client = checked_name(value)
        elif flag == "--with":
            extra.append(checked_name(value))  # a bundle of wheels the first one lacked, on the same path
        else:
            layer = Path(value)
            if layer.is_dir():  # a layer in parts (`layer CAPTURE OUT`): checked and joined
                layer = restore_mod.join(layer)
            elif not layer.is_file():
                raise UserError(f"--restore {layer}: no such file or directory of parts")
    if layer is not None and "--image-paths" not in rest:
        raise UserError("--restore puts the layer's files at the image's paths: with --image-paths")
    return client, extra, layer


def pack_layer(args: list[str]) -> int:
    """`layer CAPTURE OUT [--part-mib N] [--epoch N]`: the warm layer's tar of a capture made at the image's paths
    (warm --image-paths), without Docker, in parts under OUT with SHA256SUMS (builder/deploy/warm/layer.py)."""
    import argparse

    from .warm import layer as layer_mod

    class Refusing(argparse.ArgumentParser):
        def error(self, message):
            raise UserError(f"layer: {message} (usage: scripts/gpu-host-run layer CAPTURE OUT [--part-mib N] [--epoch N])")

    def whole(lo: int, hi: int, what: str):
        def parse(v: str) -> int:
            if not re.fullmatch(r"[0-9]{1,12}", v) or not lo <= int(v) <= hi:
                raise argparse.ArgumentTypeError(f"{v[:40]!r} is not {what} ({lo} to {hi})")
            return int(v)
        return parse

    ap = Refusing(prog="scripts/gpu-host-run layer", add_help=False)
    ap.add_argument("capture")
    ap.add_argument("out")
    ap.add_argument("--part-mib", type=whole(1, 1024, "a whole number of MiB"), default=LAYER_PART_MIB)
    ap.add_argument("--epoch", type=whole(0, restore_mod.LATEST_TIME, "a time in seconds"), default=None)
    a = ap.parse_args(args)
    capture, out = Path(a.capture), Path(a.out)
    tree, facts = layer_mod.read_capture(capture)
    if facts.get("captured-on") != "process" or not isinstance(facts.get("layout"), dict):
        raise UserError(f"{capture}: not captured by `warm --image-paths` on this route: its files are the image's only "
                        "when the engine ran at the image's paths")
    from .. import files

    files.check_kind(out, "OUT", "directory")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise UserError(f"{out}: not empty; the layer's parts go to an empty directory")
    whole_tar = out / "layer.tar.gz"
    try:
        written, epoch = layer_mod.tar_layer(tree, facts["cache_root"], whole_tar, a.epoch)
        parts = layer_mod.split(whole_tar, out, a.part_mib)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    size = whole_tar.stat().st_size
    whole_tar.unlink()
    print(f"layer of {capture}: {len(written)} files, {sum(written.values())} bytes under {facts['cache_root']}, "
          f"time {epoch}; {size} bytes gzip in {len(parts)} part(s) of <= {a.part_mib} MiB under {out} "
          f"(--restore {out} joins them)", flush=True)
    return 0


def host_cell(checkout: Path, cell_id: str):
    """The spec's cell in the GPU host's matrix."""
    from .. import matrix as matrix_mod
    from .subject import find_cell

    cell, _ = find_cell(matrix_mod.load(checkout / MATRIX), matrix_mod.Selection(), cell_id)
    if cell is None:
        raise UserError(f"{MATRIX} has no cell {cell_id}")
    return cell


def run_builder(store: Store, verb: str, name: str, rest: list[str]) -> int:
    """builder's `verb` (smoke, bench, warm) of the spec's cell, on the installed bundles (installed first)."""
    action = None
    if verb == "snapshot":  # its action first: a bad one is refused before anything is read or installed
        if not rest or rest[0] not in SNAPSHOT_ACTIONS:
            raise UserError(f"snapshot {name}: say take or restore next (got {rest[0] if rest else 'nothing'!r})")
        action = rest.pop(0)
    client, extra, layer = own_flags(rest)
    slim = "--slim" in rest
    if slim:
        rest.remove("--slim")
        if "--image-paths" not in rest:
            raise UserError("--slim slims the venv at the image's paths: with --image-paths")
    s = hostenv.spec(store, name)["serve"]  # a bad spec is found before anything is installed
    for n in [name, *extra, *([client] if client else [])]:
        hostenv.install(store, n)
    python = store.python(name)
    sites = [store.site(n) for n in [name, *extra]]
    env = {**os.environ, "PYTHONPATH": ":".join(map(str, [*sites, store.checkout])),
           "PATH": ":".join([*(str(s / "bin") for s in sites), os.environ.get("PATH", "")])}
    if "--image-paths" in rest:  # the engine, and builder, run by the venv at the image's paths; nothing on PYTHONPATH
        sys.path[:0] = [str(p) for p in sites]  # builder's own needs (tomli_w, ...) come with the bundle
        from ..image.launchline import image_paths
        from ..render import slim_command

        cell = host_cell(store.checkout, s["cell"])  # but builder's own source
        paths = image_paths(cell)
        python = hostenv.image_venv(store, [name, *extra], paths,
                                    None if layer is None else restore_mod.layer_time(layer),
                                    slim=slim_command(cell, paths.prefix, paths.purelib) if slim else None)
        env = {**os.environ, "PYTHONPATH": str(store.checkout)}
        if layer is not None:
            restore_mod.restore(layer, paths.cache_root)
    head = [str(python), "-m", "builder.cli", verb, *([action] if action else [])]
    if action == "restore":  # the snapshot's key holds the launch line: no cell or serve flags again
        argv = [*head, *rest, "--launcher", "process"]
    else:
        argv = [*head, s["cell"], "--matrix", MATRIX, "--launcher", "process",
                "--python", str(python), "--engine-args", s["engine_args"]]
        for e in s.get("env", []):
            argv += ["--env", e]
        if verb == "bench":
            argv += ["--client-python", str(store.python(client or name))]
        argv += rest
    print("$", shlex.join(argv), file=sys.stderr, flush=True)  # stdout is builder's own (--json)
    return subprocess.run(argv, cwd=store.checkout, env=env).returncode
