"""Every flag more than one verb takes, declared once. A group of flags reaches its verb as one typed value
(builder/options.py: `sel`, `cache_flags`, `flags`), never through the click context; the defaults come from
builder/data/defaults.toml."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import wraps
from pathlib import Path

import click

from .. import archs as archs_mod
from .. import files, grammar, redact
from .. import matrix as matrix_mod
from ..errors import UserError
from ..globs import Glob
from ..deploy.runflags import MAX_BOOT_TIMEOUT, RunFlags
from ..options import BuildFlags, CacheFlags, HostFlags, flag_default


def split(values: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """`--engine vllm,sglang --engine x` → ("vllm", "sglang", "x"): repeated and comma-separated values."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = (values,)
    return tuple(v.strip() for val in values for v in val.split(",") if v.strip())


def _plain(x: float) -> str:
    """4294967295 and 0.5 as written, not 4.29497e+09."""
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


class Choice(click.Choice):
    """click's Choice, quoting what was given as every message quotes a value: redacted and cut short
    (redact.describe), not in full (megabytes of it, or a URL's password)."""

    def get_invalid_choice_message(self, value, ctx) -> str:
        return f"{redact.describe(value)} is not one of {', '.join(map(repr, self.choices))}."


class Number(click.ParamType):
    """Every number flag's type: finite, above lo (from lo when not lo_open) and at most hi, a whole number when
    `integer`; else a UserError naming the flag and the range (inf, nan, 1e400, 10**20 alike). `scale` reads a
    unit suffix (k, m, g, t: KiB ... TiB) and returns bytes: sizes like --memory 4g."""

    is_number = True
    SIZES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

    def __init__(self, lo: float, hi: float, unit: str, integer: bool = False, lo_open: bool = False,
                 scale: bool = False):
        self.lo, self.hi, self.unit, self.integer, self.lo_open, self.scale = lo, hi, unit, integer, lo_open, scale
        self.name = "size" if scale else "integer" if integer else "float"

    def range(self) -> str:
        show = (lambda n: self._size(n)) if self.scale else _plain
        return f"{'above' if self.lo_open else 'at least'} {show(self.lo)} and at most {show(self.hi)}"

    @staticmethod
    def _size(n: float) -> str:
        for suffix in ("t", "g", "m", "k"):
            if n >= Number.SIZES[suffix] and n % Number.SIZES[suffix] == 0:
                return f"{int(n // Number.SIZES[suffix])}{suffix}"
        return _plain(n)

    def convert(self, value, param, ctx):
        flag = (max(param.opts, key=len) if param and param.opts else "value") if param else "value"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            n, text = value, _plain(value)
        else:
            text = str(value).strip()
            n = self._parse(text)
        if n is None or not (math.isfinite(n) and (self.lo < n if self.lo_open else self.lo <= n) and n <= self.hi):
            raise UserError(f"{flag}: {redact.describe(text, 40)} is not {self.unit} {self.range()}")
        return int(n) if self.integer or self.scale else float(n)

    def _parse(self, text: str) -> float | None:
        unit = 1
        if self.scale:
            low = text.lower().removesuffix("b").removesuffix("i")
            if low and low[-1] in self.SIZES:
                low, unit = low[:-1], self.SIZES[low[-1]]
            text = low
        if self.integer:
            return int(text) if text.lstrip("+-").isdigit() and text.isascii() and len(text) < 40 else None
        try:
            n = float(text) * unit
        except (ValueError, OverflowError):
            return None
        return n if math.isfinite(n) else None


def number(lo: float, hi: float, unit: str, lo_open: bool = True, integer: bool = False) -> Number:
    """The type of a number flag (kept under its former name): see Number."""
    return Number(lo, hi, unit, integer=integer, lo_open=lo_open)


class FsPath(click.Path):
    """Every path flag's type: click.Path, and a path that exists is refused while click reads the flag when it is
    a FIFO, socket or device (reading or writing one would block or leak), a symlink loop, a directory where a file
    goes or a file where a directory goes (builder/files.py: check_kind). Nothing is opened."""

    def convert(self, value, param, ctx):
        flag = max(param.opts, key=len) if param is not None and param.opts and param.opts[0].startswith("-") else \
            (param.human_readable_name if param is not None else "path")
        want = "file" if not self.dir_okay else "directory" if not self.file_okay else "any"
        if value is not None and str(value) != "":
            files.check_kind(Path(os.fsdecode(value)), flag, want)
        return super().convert(value, param, ctx)


def _declare(*args, **kwargs):
    return lambda f: click.option(*args, **kwargs)(f)


# -- one flag each --------------------------------------------------------------------------------------------
matrix = _declare("--matrix", "matrix_path", default=flag_default("matrix"), show_default=True,
                  type=FsPath(dir_okay=False), help="The matrix file.")
as_json = _declare("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")
wheelhouse = _declare("--wheelhouse", "wheelhouse_dir", type=FsPath(file_okay=False), default=None,
                      help="Local wheel cache (default: wheelhouse/ next to the matrix file).")
arch = _declare("--arch", "arch", default=None, help="SM archs, e.g. 80,90.")
image_paths = _declare("--image-paths", "image_paths", is_flag=True,
                       help="With --launcher process: run the engine at the image's paths (the --python interpreter "
                            "must have the image's prefix and site-packages, e.g. /opt/venv; CUDA_HOME and the model "
                            "root as in the image; the caches at its root), so the compile caches it fills are the "
                            "image's (their keys hold absolute paths). scripts/gpu-host-run --image-paths sets such "
                            "an interpreter up.")


def cache_root(then: str):
    """--cache-root DIR, the one declaration smoke, bench and warm take (builder/deploy/runtime/caches.py of_cell);
    `then` is what the verb does there."""
    def not_empty(ctx, param, value):
        if value is not None and not value.strip():  # "" would be the image's own root, said without a word
            raise UserError("--cache-root: empty; name the directory, or leave the flag out for the image's own root")
        return value

    return _declare("--cache-root", "cache_root", default=None, metavar="DIR", callback=not_empty,
                    help="With --launcher process: the directory the engine's compile caches go to, each at its "
                         "variable (engine data compile_caches); default the image's own root (/opt/jit-cache)" + then)


profile = _declare("--profile", multiple=True,
                   help="Profiles to use (default: the matrix's default; 'all' for every one).")

# what smoke and bench start: the same engine, the same way (`run_flags` below: one typed value)
model = _declare("--model", "model", default=flag_default("model"), show_default=True,
                 help="A local checkpoint directory; 'tiny': a generated Qwen3.5-class FP8 model served with dummy "
                      "weights; or shape:27b: one generated at the published shape of the Qwen3.5/3.6 27B (block FP8, "
                      "dummy weights; give the engine more memory through --engine-args).")
drafter = _declare("--drafter", default=None,
                   help="The DFlash2 drafter (default: the tiny drafter with --model tiny, else the data's).")
launcher = _declare("--launcher", type=Choice(["auto", "docker", "process"]), default=flag_default("launcher"),
                    show_default=True,
                    help="docker: a container of the image; process: the engine installed for --python on this host "
                         "(no Docker).")
python = _declare("--python", "python", default=flag_default("python"), show_default=True,
                  help="The interpreter whose environment holds the engine (process launcher).")
GPUS_HELP = ("auto: the GPUs when nvidia-smi finds some; all: every GPU (refused without one); none: no GPUs (CPU "
             "engines, test doubles); or device ids like 0,1.")
gpus = _declare("--gpus", default=flag_default("gpus"), show_default=True, help=GPUS_HELP)
boot_timeout = _declare("--boot-timeout", type=Number(0, MAX_BOOT_TIMEOUT, "a number of seconds", lo_open=True),
                        default=flag_default("boot_timeout"), show_default=True,
                        help=f"Seconds the engine may take to become ready (at most {MAX_BOOT_TIMEOUT:.0f}).")
port = _declare("--port", "port", type=Number(1, 65535, "a TCP port", integer=True), default=None, help="Port on 127.0.0.1 for the engine (default: a free one).")
engine_args = _declare("--engine-args", default="",
                       help="More engine flags, one shell-quoted string (e.g. '--enforce-eager').")
env = _declare("--env", "env", multiple=True, help="NAME=VALUE for the engine's environment (repeat).")
TP_HELP = ("Tensor parallel: the GPUs one engine shards the model over. Adds the engine's own flag from the engine "
           "data (vLLM --tensor-parallel-size, SGLang --tp-size) and asks N GPUs; more than the host has, or an "
           "engine without the flag, is refused.")
tp = _declare("--tp", "tp", type=Number(1, 64, "a tensor-parallel size", integer=True), default=1, show_default=True,
              help=TP_HELP)


def run_flags(f):
    """The flags that start an engine (smoke, bench): passes `run` (deploy.runflags.RunFlags), converted once."""

    @model
    @drafter
    @launcher
    @python
    @gpus
    @boot_timeout
    @port
    @engine_args
    @env
    @tp
    @wraps(f)
    def wrapper(*args, model, drafter, launcher, python, gpus, boot_timeout, port, engine_args, env, tp, **kwargs):
        from ..deploy.smoke import shapemodel

        shapemodel.check(model)  # a generated shape builder does not know: refused before any image or boot
        run = RunFlags.convert(model=model, drafter=drafter, launcher=launcher, python=python, gpus=gpus,
                               port_=port, boot_timeout_=boot_timeout, engine_args_=engine_args, env=env, tp_=tp)
        return f(*args, run=run, **kwargs)

    return wrapper


def out_dir(default_key: str, what: str):
    """--out-dir DIR (smoke and bench alike); --report-dir is smoke's former name, kept as an alias that says so."""

    def note(ctx, param, value):
        if value is not None:
            click.echo("note: --report-dir is an alias of --out-dir", err=True)
        return value

    def decorate(f):
        @click.option("--out-dir", "out_dir", type=FsPath(file_okay=False), default=None,
                      help=f"{what} (default: {flag_default(default_key)}).")
        @click.option("--report-dir", "report_dir", type=FsPath(file_okay=False), default=None, hidden=True,
                      callback=note, expose_value=True)
        @wraps(f)
        def wrapper(*args, out_dir, report_dir, **kwargs):
            if out_dir is not None and report_dir is not None and out_dir != report_dir:
                raise UserError("--out-dir and --report-dir (its alias) name two directories: give one")
            chosen = Path(out_dir or report_dir or flag_default(default_key))
            files.writable_dir(chosen, "--report-dir" if report_dir is not None else "--out-dir")  # before any work
            return f(*args, out_dir=chosen, **kwargs)

        return wrapper

    return decorate


def process_only(run, **given: bool) -> None:
    """Refuse, before any work, the flags (name -> given) that only the process launcher takes: an image runs at its
    own paths, its caches at its own root."""
    for name, was_given in given.items():
        if was_given and run.launcher != "process":
            raise UserError(f"--{name.replace('_', '-')}: only with --launcher process (an image runs at its own paths, "
                            "its caches at its own root)")


def given_matrix(matrix_path: str):
    """The matrix when there is one: the file --matrix names. Its default, matrix.toml, may be absent: smoke,
    bench and serve of an image need none (what the image is comes from its labels and the engine data)."""
    if Path(matrix_path).is_file() or matrix_path != flag_default("matrix"):
        return matrix_mod.load(Path(matrix_path))
    return None


# -- groups of flags, each one typed value --------------------------------------------------------------------
def selection(f):
    """The selectors of every verb that works on cells: passes `m` (the loaded matrix) and `sel`."""

    @matrix
    @click.option("--engine", multiple=True, help="Only cells of this engine (repeat or comma-separate).")
    @arch
    @click.option("--cuda", multiple=True, help="Only profiles of this CUDA version (13.0, 13.0.3 or cu130).")
    @profile
    @click.option("--only", multiple=True, help="Glob(s) on cell ids to keep, e.g. 'vllm-*' or '*-{cu121,cu130}-*'.")
    @click.option("--skip", multiple=True, help="Glob(s) on cell ids to drop.")
    @click.option("--base-devel", default=None, help="Devel base image for every selected cell (a mirror or a local base).")
    @click.option("--base-runtime", default=None, help="Runtime base image for every selected cell.")
    @wraps(f)
    def wrapper(*args, matrix_path, engine, arch, cuda, profile, only, skip, base_devel, base_runtime, **kwargs):
        for flag, value in (("--base-devel", base_devel), ("--base-runtime", base_runtime)):
            if value is not None:
                grammar.check(grammar.image_ref, value, flag)
        for flag, globs in (("--only", only), ("--skip", skip)):
            for pattern in globs:
                Glob(pattern, flag)  # a malformed glob is refused here, before the matrix is read
        sel = matrix_mod.Selection(
            engines=split(engine),
            archs=archs_mod.parse(arch) if arch is not None else None,
            cuda=split(cuda),
            profiles=split(profile),
            only=tuple(only),
            skip=tuple(skip),
            base_devel=base_devel,
            base_runtime=base_runtime,
        )
        return f(*args, m=matrix_mod.load(Path(matrix_path)), sel=sel, **kwargs)

    return wrapper


def verification(f):
    """--verify-key PUB (repeatable), --verify-policy FILE and --require-verified: whether a published image verifies
    (builder/image/verify.py) is said before it runs; with --require-verified one that does not is refused."""

    @click.option("--verify-key", "verify_keys", multiple=True, type=FsPath(dir_okay=False), metavar="PUB.pem",
                  help="Check the image's signed SBOM and provenance with this public key (repeatable; default: the "
                       "matrix's [defaults] ledger_public_key) and say whether it verifies, as `builder verify` does.")
    @click.option("--verify-policy", "verify_policy", type=FsPath(dir_okay=False), default=None, metavar="FILE",
                  help="The keys (with expiry dates) a verification trusts, as `builder verify --policy` reads them.")
    @click.option("--require-verified", "require_verified", is_flag=True,
                  help="Refuse an image that does not verify (exit 1; exit 2 when no key is given to check it with).")
    @wraps(f)
    def wrapper(*args, verify_keys, verify_policy, require_verified, **kwargs):
        kwargs["verification"] = Verification(tuple(verify_keys), verify_policy, require_verified)
        return f(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Verification:
    keys: tuple[str, ...] = ()
    policy: str | None = None
    required: bool = False


def git_mirrors(f):
    """--git-mirror UPSTREAM=MIRROR (repeatable), under `selection`: sets the git mirrors of this run's host git
    commands (builder/gitmirror.py), from the flags, else BUILDER_GIT_MIRRORS, else [defaults] git_mirrors."""

    @click.option("--git-mirror", "git_mirror", multiple=True, metavar="UPSTREAM=MIRROR",
                  help="Fetch git URLs that start with UPSTREAM from MIRROR instead (git's insteadOf; the longest "
                       "UPSTREAM wins; repeatable; replaces BUILDER_GIT_MIRRORS and [defaults] git_mirrors). The "
                       "upstream URL stays what the lock records.")
    @wraps(f)
    def wrapper(*args, m, git_mirror, **kwargs):
        from .. import gitmirror

        gitmirror.activate(gitmirror.choose(tuple(git_mirror), table=m.defaults.get("git_mirrors")))
        return f(*args, m=m, **kwargs)

    return wrapper


def cache(plan_flag: bool = False):
    """--cache-remote / --no-remote (and for plan --remote): passes `cache_flags` (options.CacheFlags)."""

    def decorate(f):
        @click.option("--cache-remote", "cache_remotes", multiple=True, metavar="SPEC",
                      help="A remote wheel store, replacing [defaults.cache] remotes (repeatable): registry (the "
                           "matrix's registry + /wheels), registry:HOST[:PORT]/REPO or index:URL.")
        @click.option("--no-remote", is_flag=True, help="The local wheelhouse only: no registry or index look-ups or pushes.")
        @wraps(f)
        def wrapper(*args, cache_remotes, no_remote, look_remote=False, **kwargs):
            flags = CacheFlags(tuple(cache_remotes), no_remote, look_remote or bool(cache_remotes) or not plan_flag)
            return f(*args, cache_flags=flags, **kwargs)

        if plan_flag:
            wrapper = click.option("--remote", "look_remote", is_flag=True,
                                   help="Also look each wheel up in the remote stores (network): local hit / remote "
                                        "hit (pull) / build. Without it plan asks only the local wheelhouse.")(wrapper)
        return wrapper

    return decorate


# The flags build, publish and verify-repro share. verify-repro takes the REPRO subset: its two builds start
# from nothing, so wheel cache, layer cache, smoke and progress flags do not apply.
_BUILD = {
    "ca_bundle": _declare("--ca-bundle", type=FsPath(dir_okay=False), default=lambda: os.environ.get("BUILDER_CA_BUNDLE"),
                          help="CA bundle for HTTPS inside the build, passed as a BuildKit secret (never a layer). "
                               "Env: BUILDER_CA_BUNDLE."),
    "allow_unpinned": _declare("--allow-unpinned", is_flag=True,
                               help="Build git sources known only by tag (the lock could not resolve a commit)."),
    "max_jobs": _declare("--max-jobs", type=Number(1, 4096, "a number of jobs", integer=True), default=None, help="Override MAX_JOBS (default: from cores and free RAM)."),
    "nvcc_threads": _declare("--nvcc-threads", type=Number(1, 4096, "a number of threads", integer=True), default=None, help="Override NVCC_THREADS."),
    "log_dir": _declare("--log-dir", type=FsPath(file_okay=False), default=flag_default("log_dir"), show_default=True,
                        help="One log file per cell (verify-repro: LOG_DIR/verify-repro/{first,second}/<cell>.log)."),
    "work_dir": _declare("--work-dir", type=FsPath(file_okay=False), default=flag_default("work_dir"),
                         show_default=True,
                         help="Rendered Dockerfiles, exported wheels before they enter the wheelhouse, BuildKit metadata "
                              "(verify-repro: WORK_DIR/verify-repro/<cell>/{first,second})."),
    "pins_dir": _declare("--pins-dir", type=FsPath(file_okay=False), default=None,
                         help="Where runtime-pins/<cell>.txt files live (default: runtime-pins/ next to the matrix)."),
    "builder": _declare("--builder", "buildx_builder", default=None, metavar="NAME[,NAME...]",
                        help="The buildx builder to build on (`docker buildx ls`; a docker context name is one): another "
                             "machine, a remote BuildKit. A comma list spreads the cells over several builders (build, "
                             "publish), each cell always on the same one (docs/ci.md), the builders at once. Default: "
                             "the current one."),
    "wheelhouse": wheelhouse,
    "dry_run": _declare("--dry-run", is_flag=True, help="Print the exact buildx commands; run nothing."),
    "keep_going": _declare("--keep-going", is_flag=True,
                           help="After a failure go on: the failed cell's other wheels are still compiled and cached, then "
                                "the next cells."),
    "refresh_pins": _declare("--refresh-pins", is_flag=True,
                             help="Resolve the runtime's pure-Python dependencies again instead of using "
                                  "runtime-pins/<cell>.txt."),
    "no_cache": _declare("--no-cache", is_flag=True,
                         help="Ignore BuildKit's layer cache (wheels already in the wheelhouse are still reused)."),
    "no_smoke": _declare("--no-smoke", is_flag=True,
                         help="Skip the smoke step (shown skipped in the table and --json; nothing of the cell can then "
                              "be published)."),
    "smoke_model": _declare("--smoke-model", default=flag_default("smoke_model"), show_default=True,
                            help="What the smoke step serves: a local checkpoint directory, 'tiny' or shape:27b "
                                 "(generated, dummy weights)."),
    "progress_mode": _declare("--progress", "progress_mode", type=Choice(["auto", "tty", "plain", "quiet", "raw"]),
                              default=flag_default("progress"), show_default=True,
                              help="Compile progress: tty = one updating line per compile (objects done/total, elapsed, "
                                   "ETA); plain = a status line at most every 60 s (CI; GitHub Actions log groups); quiet "
                                   "= step lines only; raw = the build output itself. auto: tty on a terminal, else "
                                   "plain. The full output is always in the log."),
    "quiet": _declare("--quiet", is_flag=True, help="Same as --progress quiet: only step lines and the closing table."),
    "layer_cache": _declare("--layer-cache", default=lambda: os.environ.get("BUILDER_LAYER_CACHE"), metavar="REPO",
                            help="Share BuildKit's layer cache through a registry repository (--cache-from/--cache-to "
                                 "type=registry, mode=max): 'registry' is the matrix's registry + /buildcache. Env: "
                                 "BUILDER_LAYER_CACHE."),
    "reuse_from": _declare("--reuse-from", default=lambda: os.environ.get("BUILDER_REUSE_FROM") or None,
                           metavar="REGISTRY",
                           help="Take an unchanged cell's image from REGISTRY/<engine>:<tag> instead of building it: "
                                "only when the registry's image carries this build's content key and builder's ledger "
                                "record for that key (REGISTRY/<engine>:builder-ledger-<key>, pushed by publish) names "
                                "its digest. Default: the matrix's registry ('registry'); 'none' (or --no-remote): "
                                "never. publish always reuses from its --registry. Env: BUILDER_REUSE_FROM."),
    "layer_compression": _declare("--layer-compression", type=Choice(["zstd", "gzip"]), default=None,
                                  help="Compress the runtime image's layers with zstd or gzip (gzip: for Docker Engine "
                                       "before 23 or containerd before 1.5). Default: the matrix's layer_compression "
                                       "(zstd)."),
    "provenance": _declare("--provenance", is_flag=True,
                           help="Attach BuildKit's SLSA provenance attestation (mode=max) to the runtime image. It holds "
                                "build times, so an attested image's digest differs per build; the image manifest itself "
                                "does not."),
    "as_json": as_json,
}
ca_bundle = _BUILD["ca_bundle"]  # also `snapshot criu`'s, which builds with BuildKit too
_DEST = {"builder": "buildx_builder", "wheelhouse": "wheelhouse_dir"}  # where click puts a flag's value
_REPRO = ("ca_bundle", "allow_unpinned", "max_jobs", "nvcc_threads", "work_dir", "log_dir", "pins_dir", "builder",
          "layer_compression", "as_json")


def build(repro: bool = False):
    """The build flags: passes `flags` (options.BuildFlags); build and publish take them all (with the cache
    flags), verify-repro the ones its two builds from nothing can use."""
    names = _REPRO if repro else tuple(_BUILD)

    def decorate(f):
        @wraps(f)
        def wrapper(*args, **kwargs):
            given = {name: kwargs.pop(_DEST.get(name, name)) for name in names}
            if "progress_mode" in given:
                mode, quiet = given.pop("progress_mode"), given.pop("quiet")
                given["progress"] = "quiet" if quiet else mode
            if "no_smoke" in given:
                given["smoke"] = not given.pop("no_smoke")
            host = HostFlags(given.pop("builder"), given.pop("layer_cache", None), bool(given.pop("provenance", False)))
            flags = BuildFlags(**given, cache=kwargs.pop("cache_flags", CacheFlags()), host=host)
            return f(*args, flags=flags, **kwargs)

        decorated = wrapper
        if not repro:
            decorated = cache()(decorated)
        for name in reversed(names):
            decorated = _BUILD[name](decorated)
        return decorated

    return decorate


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave option `name` (its parameter name) on the command line or in its environment
    variable, not its default: a flag that does nothing in this combination is refused, not dropped."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
