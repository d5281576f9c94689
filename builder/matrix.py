"""matrix.toml → validated, frozen profiles (the first stage of the pipeline; it reads no lock).

Layers, resolved once: built-in defaults (builder/data/defaults.toml) → matrix.toml [defaults] → profile → CLI selectors (--arch ...).
Every user mistake becomes a UserError naming the key or value; nothing runs before validation passes.
resolve.py turns profiles + matrix.lock into cells.
"""

from __future__ import annotations

import copy
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from . import archs as archs_mod
from . import engines, files, grammar
from .cache.config import parse_cache_table
from .engines import Knowledge, did_you_mean
from .errors import UserError
from .globs import Glob

DEFAULTS_FILE = "defaults.toml"  # builder/data/: its [matrix] table is what [defaults] falls back to


def builtin_defaults() -> dict:
    """A fresh copy of the [defaults] every matrix falls back to, key by key (source_date_epoch unset)."""
    return {**copy.deepcopy(files.package_data(DEFAULTS_FILE)["matrix"]), "source_date_epoch": None}


_RUNNER_KINDS = {"compile", "light", "gpu"}
BASE_PLACEHOLDERS = ("cuda", "os")
_TOP_KEYS = {"defaults", "profiles"}
_PROFILE_KEYS = {"cuda", "os", "python", "torch", "flash_attn", "engines", "strategies", "archs", "base_images", "source"}
# profiles.<name>.source: where a package's wheel comes from. "build" (the default) compiles it from its pinned
# source; "index" takes the release's wheel from defaults.index as published (pinned by sha256 in matrix.lock)
# and lets the audit decide whether it carries the requested archs.
SOURCE_CHOICES = ("build", "index")
_BASE_KEYS = {"devel", "runtime"}


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
    sources: dict[str, str] = field(default_factory=dict)  # package → "index" (absent: built from source)

    def from_index(self, package: str) -> bool:
        return self.sources.get(package) == "index"

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


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}")


def _expect(value, kind, where: str):
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{where}: expected {names}, got {type(value).__name__} {grammar.describe(value)}")
    return value


def _base_template(value, where: str) -> str:
    """A base-image template: an image reference once {cuda} and {os} are filled in."""
    _expect(value, str, where)
    try:
        fields = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise UserError(f"{where}: {grammar.describe(value)}: bad placeholder ({exc}); write {{cuda}} or {{os}}, "
                        "and {{ }} for a literal brace") from None
    for _, name, spec, conv in fields:
        if name is None:
            continue
        if name not in BASE_PLACEHOLDERS or spec or conv:
            raise UserError(f"{where}: {grammar.describe(value)}: unknown placeholder {{{name}{'!' + conv if conv else ''}"
                            f"{':' + spec if spec else ''}}}; known: {{cuda}}, {{os}}")
    grammar.check(grammar.image_ref, value.format(cuda="13.0.3", os="ubuntu24.04"), where)
    return value


# -- loading --------------------------------------------------------------------------------------------
def load(path: Path) -> Matrix:
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{path}: no such matrix file (use --matrix PATH)")
    raw = files.load_toml(path, "matrix file")
    _check_keys(raw, _TOP_KEYS, path.name)
    builtin = builtin_defaults()
    defaults = {**builtin, **_expect(raw.get("defaults", {}), dict, "defaults")}
    _check_keys(defaults, set(builtin), "defaults")
    defaults["base_images"] = {**builtin["base_images"], **_expect(defaults["base_images"], dict, "defaults.base_images")}
    _check_keys(defaults["base_images"], _BASE_KEYS, "defaults.base_images")
    for key, value in defaults["base_images"].items():
        _base_template(value, f"defaults.base_images.{key}")
    for prefix, repl in _expect(defaults["mirrors"], dict, "defaults.mirrors").items():
        grammar.check(grammar.image_name, prefix, f"defaults.mirrors: key {grammar.describe(prefix)}")
        grammar.check(grammar.image_name, _expect(repl, str, f"defaults.mirrors.{prefix}"), f"defaults.mirrors.{prefix}")
    archs_mod.from_list(defaults["archs"], "defaults.archs")
    for key in ("profile", "registry", "index", "model"):
        _expect(defaults[key], str, f"defaults.{key}")
    if not grammar._NAME_RE.fullmatch(defaults["registry"]) or len(defaults["registry"]) > 200:
        raise UserError(f"defaults.registry: {grammar.describe(defaults['registry'])} is not a registry/repository "
                        "prefix like 127.0.0.1:5000/builder")
    grammar.check(grammar.index_url, defaults["index"], "defaults.index")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?", defaults["model"], re.ASCII):
        raise UserError(f"defaults.model: {grammar.describe(defaults['model'])} is not a model id like Qwen/Qwen3.8-27B-FP8")
    if defaults["source_date_epoch"] is not None:
        grammar.check(grammar.source_date_epoch, defaults["source_date_epoch"], "defaults.source_date_epoch")

    knowledge = _expect(defaults["knowledge"], list, "defaults.knowledge")
    for i, p in enumerate(knowledge):
        _expect(p, str, f"defaults.knowledge[{i}]")
        grammar.check(grammar.line, p, f"defaults.knowledge[{i}]")
    extra = tuple(str((path.parent / p).resolve()) for p in knowledge)
    kn = engines.load_knowledge(extra)
    defaults["cache"] = parse_cache_table(defaults["cache"], "defaults.cache", defaults["registry"])
    defaults["runners"] = {**builtin["runners"], **_expect(defaults["runners"], dict, "defaults.runners")}
    _check_keys(defaults["runners"], _RUNNER_KINDS, "defaults.runners")
    for kind, labels in defaults["runners"].items():
        if not _expect(labels, list, f"defaults.runners.{kind}") or not all(
                isinstance(x, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", x, re.ASCII) for x in labels):
            raise UserError(f"defaults.runners.{kind}: {grammar.describe(labels)} is not a list of runner labels "
                            'like ["self-hosted", "linux", "x64"]')
    profiles_raw = _expect(raw.get("profiles", {}), dict, "profiles")
    if not profiles_raw:
        raise UserError(f"{path.name}: no [profiles.*] table: nothing to build")
    profiles = {name: _profile(kn, name, _expect(p, dict, f"profiles.{name}"), defaults) for name, p in profiles_raw.items()}
    if defaults["profile"] not in profiles:
        raise UserError(f"defaults.profile: {defaults['profile']!r} is not a profile{did_you_mean(defaults['profile'], profiles)}")
    return Matrix(path=path, raw=raw, defaults=defaults, profiles=profiles, knowledge=kn)


def _profile(kn: Knowledge, name: str, p: dict, defaults: dict) -> Profile:
    where = f"profiles.{name}"
    _check_keys(p, _PROFILE_KEYS, where)
    for key in ("cuda", "os", "python", "engines"):
        if key not in p:
            raise UserError(f"{where}: missing key {key!r}")
    cuda = _expect(p["cuda"], str, f"{where}.cuda")
    if not re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", cuda, re.ASCII):
        raise UserError(f"{where}.cuda: {grammar.describe(cuda)} is not a CUDA version like 13.0.3")
    if ".".join(cuda.split(".")[:2]) not in kn.known_cuda():
        raise UserError(f"{where}.cuda: CUDA {cuda} is unknown to this toolkit (known: {', '.join(kn.known_cuda())})")
    python = _expect(p["python"], str, f"{where}.python")
    if not re.fullmatch(r"3\.[0-9]+", python, re.ASCII):
        raise UserError(f"{where}.python: {grammar.describe(python)} is not a Python version like 3.12")
    grammar.check(grammar.os_tag, _expect(p["os"], str, f"{where}.os"), f"{where}.os")
    engs = _expect(p["engines"], dict, f"{where}.engines")
    if not engs:
        raise UserError(f"{where}.engines: empty: name at least one engine, e.g. {{ vllm = \"0.33.0\" }}")
    for eng, ver in engs.items():
        if eng not in kn.engine_names():
            raise UserError(f"{where}.engines: unknown engine {eng!r}{did_you_mean(eng, kn.engine_names())}; known: {', '.join(kn.engine_names())}")
        grammar.check(grammar.version, _expect(ver, str, f"{where}.engines.{eng}"), f"{where}.engines.{eng}")
        kn.recipe(eng, ver)  # unknown version range → error naming it
    torch = p.get("torch")
    if isinstance(torch, dict):
        for eng, ver in torch.items():
            if eng not in engs:
                raise UserError(f"{where}.torch: {eng!r} is not an engine of this profile ({', '.join(engs)})")
            grammar.check(grammar.version, _expect(ver, str, f"{where}.torch.{eng}"), f"{where}.torch.{eng}")
    elif torch is not None:
        grammar.check(grammar.version, _expect(torch, str, f"{where}.torch"), f"{where}.torch")
    fa = p.get("flash_attn")
    if fa is not None:
        grammar.check(grammar.version, _expect(fa, str, f"{where}.flash_attn"), f"{where}.flash_attn")
        kn.recipe("flash-attn", fa)
    strategies = tuple(_expect(p.get("strategies", []), list, f"{where}.strategies"))
    for s in strategies:
        if s not in engines.STRATEGIES:
            raise UserError(f"{where}.strategies: unknown strategy {s!r}{did_you_mean(str(s), engines.STRATEGIES)}; known: {', '.join(engines.STRATEGIES)}")
    if len(set(strategies)) != len(strategies):
        raise UserError(f"{where}.strategies: a strategy is listed twice: {list(strategies)}")
    own = _expect(p.get("base_images", {}), dict, f"{where}.base_images")
    _check_keys(own, _BASE_KEYS, f"{where}.base_images")
    for key, value in own.items():
        _base_template(value, f"{where}.base_images.{key}")
    bases = {**defaults["base_images"], **own}
    sources = _expect(p.get("source", {}), dict, f"{where}.source")
    for pkg, choice in sources.items():
        kn.recipe_pypi(pkg)  # an unknown package name → error naming the known ones
        if choice not in SOURCE_CHOICES:
            raise UserError(f"{where}.source.{pkg}: {grammar.describe(choice)} is not one of {', '.join(map(repr, SOURCE_CHOICES))}")
    return Profile(
        name=name,
        cuda=cuda,
        os=_expect(p["os"], str, f"{where}.os"),
        python=python,
        torch=torch,
        flash_attn=fa,
        engines=dict(engs),
        strategies=strategies,
        archs=archs_mod.from_list(p["archs"], f"{where}.archs") if "archs" in p else None,
        base_images=bases,
        sources={k: v for k, v in sources.items() if v == "index"},
    )


def selected_profiles(m: Matrix, sel: Selection, default_all: bool = False) -> list[Profile]:
    """The profiles --profile / --cuda name (default: the matrix's default profile, or every one), with
    --engine checked against the engines the toolkit knows."""
    if sel.profiles == ("all",) or (default_all and not sel.profiles):
        profiles = list(m.profiles.values())
    elif sel.profiles:
        for name in sel.profiles:
            if name not in m.profiles:
                raise UserError(f"--profile: unknown profile {name!r}{did_you_mean(name, m.profiles)}; known: {', '.join(m.profiles)}, all")
        profiles = [m.profiles[n] for n in sel.profiles]
    else:
        profiles = [m.profiles[m.defaults["profile"]]]
    for eng in sel.engines:
        if eng not in m.knowledge.engine_names():
            names = m.knowledge.engine_names()
            raise UserError(f"--engine: unknown engine {eng!r}{did_you_mean(eng, names)}; known: {', '.join(names)}")
    if sel.cuda:
        profiles = [p for p in profiles if any(p.cuda == c or p.cuda.startswith(c + ".") or p.cuda_tag == c for c in sel.cuda)]
    return profiles


