"""The options of a run: frozen and typed, built once from the command line's flags and the matrix.

The defaults are data (builder/data/defaults.toml): matrix.toml's [defaults] falls back to its [matrix] table,
the flags (builder/cli/flags.py) to its [flags] table. Before a build starts, `summary` says in one paragraph
what differs from them, so a log shows what this run was asked to do differently.

Layer: below the verbs (builder/cli/), above the stages: it knows the matrix, the steps' BuildOptions and the
wheel cache, and nothing of click.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import files, grammar, redact
from .errors import UserError


DEFAULTS_FILE = "defaults.toml"


def defaults() -> dict:
    """builder/data/defaults.toml: {"matrix": ..., "flags": ...}."""
    return files.package_data(DEFAULTS_FILE)


def flag_default(name: str):
    return defaults()["flags"][name]


@dataclass(frozen=True)
class CacheFlags:
    """--cache-remote / --no-remote (and plan's --remote): which remote wheel stores a verb uses."""

    remotes: tuple[str, ...] = ()
    no_remote: bool = False
    look_remote: bool = True  # plan asks the remotes only with --remote (or --cache-remote)


@dataclass(frozen=True)
class HostFlags:
    """--builder / --layer-cache / --provenance: where BuildKit builds and what it shares."""

    builder: str | None = None
    layer_cache: str | None = None
    provenance: bool = False


@dataclass(frozen=True)
class BuildFlags:
    """What build, publish and verify-repro take from the command line (their defaults: [flags])."""

    work_dir: str = field(default_factory=lambda: flag_default("work_dir"))
    log_dir: str = field(default_factory=lambda: flag_default("log_dir"))
    pins_dir: str | None = None
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    ca_bundle: str | None = None
    allow_unpinned: bool = False
    wheelhouse: str | None = None
    dry_run: bool = False
    keep_going: bool = False
    refresh_pins: bool = False
    no_cache: bool = False
    smoke: bool = True
    smoke_model: str = field(default_factory=lambda: flag_default("smoke_model"))
    progress: str = field(default_factory=lambda: flag_default("progress"))
    as_json: bool = False
    reuse_from: str | None = None  # --reuse-from: a registry whose image of an unchanged cell is pulled, not built
    layer_compression: str | None = None  # --layer-compression; None: the matrix's
    cache: CacheFlags = CacheFlags()
    host: HostFlags = HostFlags()


def _layer_cache(m, value: str | None) -> str | None:
    if value == "registry":
        value = f"{m.defaults['registry']}/buildcache"
    if value:
        grammar.check(grammar.image_name, value, "--layer-cache")
        port = re.match(r"[^/:]+:([0-9]+)/", value)
        if "/" not in value or (port and not 0 < int(port.group(1)) < 65536):
            raise UserError(f"--layer-cache: {redact.describe(value)} is not a registry repository HOST[:PORT]/PATH "
                            "(port 1-65535)")
    return value or None


def _reuse_from(m, value: str | None, publish, no_remote: bool = False):
    """Where an unchanged cell's image may come from (builder/image/reuse.py): publish's own registry, which it pushes
    to; for build, --reuse-from, else the matrix's registry (where CI publishes: a teammate's build takes the
    published cell instead of compiling it), bound to its ledger record as any reuse. Nowhere with --no-remote or
    --reuse-from none."""
    if publish is not None:
        if value is not None and _reuse_path(m, value).path != publish.registry:
            raise UserError(f"--reuse-from {value}: publish reuses only what its --registry {publish.registry} "
                            "already serves (leave --reuse-from out)")
        return publish.where
    if value == "none" or (value is None and no_remote):
        return None
    # by default the registry is asked on builder's own initiative: its credentials are read when it is asked, and an
    # unreadable docker login then means "build", said in one line (builder/steps/image.py)
    return _reuse_path(m, "registry" if value is None else value, credentials=value is not None)


def _reuse_path(m, value: str, credentials: bool = True):
    from .registry_api import RegistryPath

    own = m.defaults["registry"]  # the matrix's registry is the command's own; another --reuse-from host is not
    return RegistryPath.parse(own if value == "registry" else value, "--reuse-from",
                              "images are read from PATH/<engine>:<tag>", given=_host_of(own), credentials=credentials)


def _host_of(registry: str) -> str:
    import re

    return re.sub(r"^(docker|https?)://", "", registry).split("/", 1)[0]


def ca_bundle_path(value: str | None) -> Path | None:
    """--ca-bundle (or BUILDER_CA_BUNDLE) as a path, resolved; "" is refused (it would mean no bundle, unsaid). Every
    verb that builds with BuildKit takes it so (build, publish, verify-repro, snapshot criu)."""
    if value == "":
        raise UserError("--ca-bundle (or BUILDER_CA_BUNDLE): an empty path; leave it out for no CA bundle")
    return Path(value).resolve() if value else None


def build_options(m, flags: BuildFlags, source_date_epoch: str, *, publish=None, repro: bool = False):
    """The steps' BuildOptions, assembled here only. `publish`: the Target of `builder publish`; `repro`: the
    two builds of verify-repro (no layer cache, no shared compile cache, no progress display)."""
    from . import pins
    from .image import ledger

    compile_cache = None if repro else m.defaults["cache"].get("compile")
    if compile_cache is not None:  # its credentials' variables are checked now, not at the compile's start
        compile_cache.credentials()
    from .progress import Display
    from .steps import BuildOptions

    from .cache.config import selected_remotes

    ca_bundle = ca_bundle_path(flags.ca_bundle)
    from . import fanout

    builders = fanout.parse(flags.host.builder)
    if repro and len(builders) > 1:
        raise UserError(f"--builder {flags.host.builder}: verify-repro builds its two builds on one builder; give one")
    # --cache-remote specs are refused now (exit 2), before the summary names them or any remote is asked
    selected_remotes(m.defaults["cache"]["remotes"], flags.cache.remotes, flags.cache.no_remote, m.defaults["registry"])
    return BuildOptions(
        work_dir=Path(flags.work_dir).resolve(),
        log_dir=Path(flags.log_dir).resolve(),
        index_url=m.defaults["index"],
        dry_run=flags.dry_run,
        keep_going=flags.keep_going,
        max_jobs=flags.max_jobs,
        nvcc_threads=flags.nvcc_threads,
        ca_bundle=ca_bundle,
        allow_unpinned=flags.allow_unpinned,
        source_date_epoch=source_date_epoch,
        pins_dir=Path(flags.pins_dir).resolve() if flags.pins_dir else m.path.resolve().parent / pins.DIR_NAME,
        refresh_pins=flags.refresh_pins,
        no_cache=flags.no_cache or repro,
        smoke=flags.smoke,
        smoke_model=flags.smoke_model,
        display=None if repro else Display(flags.progress),
        compile_cache=compile_cache,
        compile_dist=None if repro else m.defaults["cache"].get("dist"),
        compile_dist_cores=0 if repro else m.defaults["cache"].get("dist_cores", 0),
        builder=builders[0] if len(builders) == 1 else None,
        builders=builders,
        layer_cache=None if repro else _layer_cache(m, flags.host.layer_cache),
        attest=("type=provenance,mode=max",) if flags.host.provenance and not repro else (),
        layer_compression=flags.layer_compression or m.defaults["layer_compression"],
        publish=publish,
        reuse_from=None if repro else _reuse_from(m, flags.reuse_from, publish, flags.cache.no_remote),
        image_ledger=ledger.ledger_dir(wheelhouse_at(m.path, flags.wheelhouse).root),
        **_ledger_keys(m, publish),
    )


def _ledger_keys(m, publish) -> dict:
    """The matrix's ledger public key (a registry's record is adopted only when it signed it) and, for publish, the
    signer of BUILDER_LEDGER_SIGNING_KEY (builder/image/signing.py). Refused now, in one line: a key file that is not
    a public key, a signing key that is not one or is not the matrix key's pair, and a publish that would push an
    unsigned record where the matrix names a key."""
    from .image import signing

    named = m.defaults.get(signing.MATRIX_KEY)
    trusted = signing.public_key(Path(m.path).resolve().parent / named, f"defaults.{signing.MATRIX_KEY}") \
        if named else None
    signer = signing.signer_from_env() if publish is not None else None
    if signer is not None and trusted is not None and signer.public_key.keyid != trusted.keyid:
        raise UserError(f"{signing.ENV}: its key ({signing.short(signer.public_key.keyid)}) is not the pair of the "
                        f"matrix's {signing.MATRIX_KEY} {named} (key {signing.short(trusted.keyid)}): records it signs "
                        "would never be adopted")
    if publish is not None and trusted is not None and signer is None:
        raise UserError(f"publish: the matrix names {signing.MATRIX_KEY} {named}, so the ledger records publish pushes "
                        f"must be signed: set {signing.ENV} to that key's PEM private key (CI: a secret)")
    return {"ledger_key": trusted, "ledger_signer": signer}


# -- the wheel cache a verb uses ------------------------------------------------------------------------------
def wheelhouse_at(matrix_path: Path, wheelhouse_dir: str | None):
    """--wheelhouse, else wheelhouse/ next to the matrix file: a directory or one that can become one."""
    from .cache.local import Wheelhouse
    from .plan import default_wheelhouse

    wh = Wheelhouse(Path(wheelhouse_dir)) if wheelhouse_dir else default_wheelhouse(Path(matrix_path))
    for p in (wh.root, *wh.root.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise UserError(f"--wheelhouse: {wh.root}" + (" is a file" if p == wh.root else f": {p} is a file")
                                + ", not a directory")
            break
    return wh


def wheel_cache(m, wheelhouse_dir: str | None, flags: CacheFlags, say):
    """The wheelhouse in front of the remote stores the flags or the matrix select (a remote that is down:
    exit 3 here)."""
    from .cache.config import selected_remotes
    from .cache.tiered import cache_for

    specs = selected_remotes(m.defaults["cache"]["remotes"], flags.remotes, flags.no_remote, m.defaults["registry"])
    return cache_for(wheelhouse_at(m.path, wheelhouse_dir), specs if flags.look_remote else (), say)


# -- the summary ----------------------------------------------------------------------------------------------
def _spell(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return redact.describe(value) if isinstance(value, dict) else str(value)


def differences(m, sel=None, flags: BuildFlags | None = None, publish=None) -> list[str]:
    """Every option of this run that differs from builder/data/defaults.toml, in the order a reader looks."""
    out: list[str] = []
    if m is not None:
        if m.path.name != flag_default("matrix") or m.path.resolve().parent != Path.cwd().resolve():
            out.append(f"matrix {m.path}")
        base = defaults()["matrix"]
        for key, value in (m.raw.get("defaults") or {}).items():
            if isinstance(value, dict) and isinstance(base.get(key), dict) and base[key]:  # base_images, runners
                out += [f"defaults.{key}.{k} = {_spell(v)}" for k, v in value.items() if v != base[key].get(k)]
            elif value != base.get(key):
                out.append(f"defaults.{key} = {_spell(value)}")
    if sel is not None:
        for name in ("engines", "cuda", "profiles", "only", "skip"):
            values = getattr(sel, name)
            if values:
                out.append(f"--{name.rstrip('s') if name in ('engines', 'profiles') else name} {','.join(values)}")
        if sel.archs is not None:
            out.append(f"--arch {','.join(map(str, sel.archs))}")
        for name in ("base_devel", "base_runtime"):
            if getattr(sel, name):
                out.append(f"--{name.replace('_', '-')} {getattr(sel, name)}")
    if flags is not None:
        plain = BuildFlags()
        for f in fields(BuildFlags):
            value, default = getattr(flags, f.name), getattr(plain, f.name)
            if f.name in ("cache", "host", "as_json") or value == default:
                continue
            flag = {"smoke": "--no-smoke", "wheelhouse": "--wheelhouse", "progress": "--progress"}.get(
                f.name, "--" + f.name.replace("_", "-"))
            out.append(flag if isinstance(value, bool) else f"{flag} {value}")
        if flags.cache.no_remote:
            out.append("--no-remote")
        out += [f"--cache-remote {r}" for r in flags.cache.remotes]
        for name, value in (("--builder", flags.host.builder), ("--layer-cache", flags.host.layer_cache)):
            if value:
                out.append(f"{name} {value}")
        if flags.host.provenance:
            out.append("--provenance")
    if publish is not None:
        out.append(f"publish to {publish.registry}" + ("" if publish.aliases else " (no aliases)"))
    return out


def summary(m, sel=None, flags: BuildFlags | None = None, publish=None, width: int = 110) -> str:
    """One paragraph: what differs from the defaults (cibuildwheel prints its options the same way)."""
    diff = [redact.redact(d) for d in differences(m, sel, flags, publish)]  # no user:password@ of a URL
    text = ("options: " + "; ".join(diff) + "; everything else as builder/data/defaults.toml says") if diff else \
        "options: the defaults of builder/data/defaults.toml"
    return textwrap.fill(text, width=width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)
