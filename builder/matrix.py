"""matrix.toml → validated, frozen profiles (the first stage of the pipeline; it reads no lock).

Layers, resolved once: built-in defaults (builder/data/defaults.toml) → matrix.toml [defaults] → profile → CLI
selectors (--arch ...). The file's shape is schema.MATRIX, checked by the one checker (builder/schema.py); every
user mistake becomes a UserError naming the key or value; nothing runs before validation passes.
resolve.py turns profiles + matrix.lock into cells.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from . import archs as archs_mod
from . import engines, files, redact, schema
from .cache.config import parse_cache_table
from .engines import Knowledge
from .schema import did_you_mean
from .errors import UserError
from .globs import Glob

DEFAULTS_FILE = "defaults.toml"  # builder/data/: its [matrix] table is what [defaults] falls back to
SOURCE_CHOICES = schema.SOURCE_CHOICES


def builtin_defaults() -> dict:
    """A fresh copy of the [defaults] every matrix falls back to, key by key (source_date_epoch unset). The data
    file is held to the same shape as a matrix's [defaults]."""
    data = files.package_data(DEFAULTS_FILE)["matrix"]
    schema.check(f"builder/data/{DEFAULTS_FILE}: matrix", data, schema.DEFAULTS)
    return {**copy.deepcopy(data), "source_date_epoch": None}


@dataclass(frozen=True)
class Profile:
    name: str
    cuda: str
    os: str
    python: str
    torch: dict[str, str] | str | None
    flash_attn: str | None
    engines: dict[str, str]
    strategies: tuple[str, ...]
    archs: tuple[int, ...] | None
    base_images: dict[str, str]
    sources: dict[str, str] = field(default_factory=dict)  # package → "index" | "auto" (absent: built from source)
    jit: dict[str, str] = field(default_factory=dict)  # engine → "prebuilt" (absent: JIT modules built at first request)
    criu: bool = False  # the runtime images carry CRIU (builder snapshot's container route)

    def from_index(self, package: str) -> bool:
        return self.sources.get(package) == "index"

    def auto(self, package: str) -> bool:
        return self.sources.get(package) == "auto"

    @property
    def cuda_tag(self) -> str:  # 13.0.3 → cu130
        major, minor = self.cuda.split(".")[:2]
        return f"cu{major}{minor}"


@dataclass(frozen=True)
class Matrix:
    path: Path
    raw: dict
    defaults: dict
    profiles: dict[str, Profile]
    knowledge: Knowledge = field(compare=False, default=None)


@dataclass(frozen=True)
class Selection:
    """CLI selectors, shared by every verb."""

    engines: tuple[str, ...] = ()
    archs: tuple[int, ...] | None = None
    cuda: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()  # () = the default profile; ("all",) = every profile
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    base_devel: str | None = None  # override the devel / runtime base of every selected cell
    base_runtime: str | None = None


# -- parsing helpers ------------------------------------------------------------------------------------
def matches(cell_id: str, patterns: tuple[str, ...]) -> bool:
    """Whether a cell id matches any of the globs (`*`, `?`, `[...]`, `{a,b}`), matched without expanding
    the braces: linear in the pattern and the id, however many `{a,b}` groups there are."""
    return any(Glob(p).match(cell_id) for p in patterns)


# -- loading --------------------------------------------------------------------------------------------
def load(path: Path) -> Matrix:
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{path}: no such matrix file (use --matrix PATH)")
    raw = files.load_toml(path, "matrix file")
    schema.check("", raw, schema.MATRIX)  # every key and type; below: what only the engine data can judge
    builtin = builtin_defaults()
    defaults = {**builtin, **raw.get("defaults", {})}
    for table in ("base_images", "runners"):
        defaults[table] = {**builtin[table], **defaults[table]}
    archs_mod.from_list(defaults["archs"], "defaults.archs")
    knowledge = defaults["knowledge"]
    extra = tuple(str((path.parent / p).resolve()) for p in knowledge)
    kn = engines.load_knowledge(extra)
    defaults["cache"] = parse_cache_table(defaults["cache"], "defaults.cache", defaults["registry"])
    profiles_raw = raw.get("profiles", {})
    if not profiles_raw:
        raise UserError(f"{path.name}: no [profiles.*] table: nothing to build")
    profiles = {name: _profile(kn, name, p, defaults) for name, p in profiles_raw.items()}
    if defaults["profile"] not in profiles:
        raise UserError(f"defaults.profile: {redact.describe(defaults['profile'])} is not a profile{did_you_mean(defaults['profile'], profiles)}")
    return Matrix(path=path, raw=raw, defaults=defaults, profiles=profiles, knowledge=kn)


def _profile(kn: Knowledge, name: str, p: dict, defaults: dict) -> Profile:
    """One profile, whose shape schema.PROFILE has checked: its names and versions against the engine data."""
    where = f"profiles.{name}"
    cuda = p["cuda"]
    if ".".join(cuda.split(".")[:2]) not in kn.known_cuda():
        raise UserError(f"{where}.cuda: CUDA {cuda} is unknown to this toolkit (known: {', '.join(kn.known_cuda())})")
    engs = p["engines"]
    if not engs:
        raise UserError(f"{where}.engines: empty: name at least one engine, e.g. {{ vllm = \"0.33.0\" }}")
    for eng, ver in engs.items():
        if eng not in kn.engine_names():
            raise UserError(f"{where}.engines: unknown engine {redact.describe(eng)}{did_you_mean(eng, kn.engine_names())}; known: {', '.join(kn.engine_names())}")
        kn.recipe(eng, ver)  # unknown version range → error naming it
    torch = p.get("torch")
    if isinstance(torch, dict):
        for eng in torch:
            if eng not in engs:
                raise UserError(f"{where}.torch: {redact.describe(eng)} is not an engine of this profile ({', '.join(engs)})")
    fa = p.get("flash_attn")
    if fa is not None:
        kn.recipe("flash-attn", fa)
    strategies = tuple(p.get("strategies", []))
    known = kn.strategy_names()  # the engine data's: a strategy added there is known here without a code change
    for s in strategies:
        if s not in known:
            raise UserError(f"{where}.strategies: unknown strategy {redact.describe(s)}{did_you_mean(s, known)}; known: {', '.join(known)}")
    if len(set(strategies)) != len(strategies):
        raise UserError(f"{where}.strategies: a strategy is listed twice: {list(strategies)}")
    sources = p.get("source", {})
    for pkg in sources:
        kn.recipe_pypi(pkg)  # an unknown package name → error naming the known ones
    jit = p.get("jit", {})
    for eng in jit:
        if eng not in engs:
            raise UserError(f"{where}.jit: {redact.describe(eng)} is not an engine of this profile ({', '.join(engs)})")
    return Profile(
        name=name,
        cuda=cuda,
        os=p["os"],
        python=p["python"],
        torch=torch,
        flash_attn=fa,
        engines=dict(engs),
        strategies=strategies,
        archs=archs_mod.from_list(p["archs"], f"{where}.archs") if "archs" in p else None,
        base_images={**defaults["base_images"], **p.get("base_images", {})},
        sources={k: v for k, v in sources.items() if v != "build"},
        jit={k: v for k, v in jit.items() if v != "first-request"},
        criu=p.get("criu", False),
    )


def selected_profiles(m: Matrix, sel: Selection, default_all: bool = False) -> list[Profile]:
    """The profiles --profile / --cuda name (default: the matrix's default profile, or every one), with
    --engine checked against the engines the toolkit knows."""
    if sel.profiles == ("all",) or (default_all and not sel.profiles):
        profiles = list(m.profiles.values())
    elif sel.profiles:
        for name in sel.profiles:
            if name not in m.profiles:
                raise UserError(f"--profile: unknown profile {redact.describe(name)}{did_you_mean(name, m.profiles)}; known: {', '.join(m.profiles)}, all")
        profiles = [m.profiles[n] for n in sel.profiles]
    else:
        profiles = [m.profiles[m.defaults["profile"]]]
    for eng in sel.engines:
        if eng not in m.knowledge.engine_names():
            names = m.knowledge.engine_names()
            raise UserError(f"--engine: unknown engine {redact.describe(eng)}{did_you_mean(eng, names)}; known: {', '.join(names)}")
    if sel.cuda:
        profiles = [p for p in profiles if any(p.cuda == c or p.cuda.startswith(c + ".") or p.cuda_tag == c for c in sel.cuda)]
    return profiles


