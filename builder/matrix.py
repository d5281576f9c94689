"""matrix.toml → validated, frozen profiles (the first stage of the pipeline; it reads no lock).

Layers, resolved once: built-in defaults → matrix.toml [defaults] → profile → CLI selectors (--arch ...).
Every user mistake becomes a UserError naming the key or value; nothing runs before validation passes.
resolve.py turns profiles + matrix.lock into cells.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import archs as archs_mod
from . import engines
from .cache.config import parse_cache_table
from .engines import Knowledge, did_you_mean
from .errors import UserError

BUILTIN_DEFAULTS = {
    "profile": "cu130",
    "archs": [80, 90],
    "registry": "127.0.0.1:5000/builder",
    "index": "https://pypi.org/simple",
    "model": "Qwen/Qwen3.8-27B-FP8",
    "base_images": {"devel": "nvidia/cuda:{cuda}-devel-{os}", "runtime": "nvidia/cuda:{cuda}-base-{os}"},
    "mirrors": {},
    "knowledge": [],  # extra engine-knowledge TOML files, relative to the matrix file
    "cache": {},  # [defaults.cache]: remote wheel stores, see builder/cache/config.py
}
_TOP_KEYS = {"defaults", "profiles"}
_PROFILE_KEYS = {"cuda", "os", "python", "torch", "flash_attn", "engines", "strategies", "archs", "base_images"}
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
def expand_braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand_braces(pattern[: m.start()] + alt + pattern[m.end() :])]


def matches(cell_id: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(cell_id, p) for pat in patterns for p in expand_braces(pat))


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}")


def _expect(value, kind, where: str):
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{where}: expected {names}, got {type(value).__name__} {value!r}")
    return value


# -- loading --------------------------------------------------------------------------------------------
def load(path: Path) -> Matrix:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such matrix file (use --matrix PATH)")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from None
    _check_keys(raw, _TOP_KEYS, path.name)
    defaults = {**BUILTIN_DEFAULTS, **_expect(raw.get("defaults", {}), dict, "defaults")}
    _check_keys(defaults, set(BUILTIN_DEFAULTS), "defaults")
    defaults["base_images"] = {**BUILTIN_DEFAULTS["base_images"], **_expect(defaults["base_images"], dict, "defaults.base_images")}
    _check_keys(defaults["base_images"], _BASE_KEYS, "defaults.base_images")
    _expect(defaults["mirrors"], dict, "defaults.mirrors")
    archs_mod.from_list(defaults["archs"], "defaults.archs")
    for key in ("profile", "registry", "index", "model"):
        _expect(defaults[key], str, f"defaults.{key}")
    if not re.fullmatch(r"[a-z0-9.:_/-]+", defaults["registry"]):
        raise UserError(f"defaults.registry: {defaults['registry']!r} is not a registry/repository prefix like 127.0.0.1:5000/builder")

    extra = tuple(str((path.parent / p).resolve()) for p in _expect(defaults["knowledge"], list, "defaults.knowledge"))
    kn = engines.load_knowledge(extra)
    defaults["cache"] = parse_cache_table(defaults["cache"], "defaults.cache", defaults["registry"])
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
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", cuda):
        raise UserError(f"{where}.cuda: {cuda!r} is not a CUDA version like 13.0.3")
    if ".".join(cuda.split(".")[:2]) not in kn.known_cuda():
        raise UserError(f"{where}.cuda: CUDA {cuda} is unknown to this toolkit (known: {', '.join(kn.known_cuda())})")
    python = _expect(p["python"], str, f"{where}.python")
    if not re.fullmatch(r"3\.\d+", python):
        raise UserError(f"{where}.python: {python!r} is not a Python version like 3.12")
    engs = _expect(p["engines"], dict, f"{where}.engines")
    if not engs:
        raise UserError(f"{where}.engines: empty: name at least one engine, e.g. {{ vllm = \"0.33.0\" }}")
    for eng, ver in engs.items():
        if eng not in kn.engine_names():
            raise UserError(f"{where}.engines: unknown engine {eng!r}{did_you_mean(eng, kn.engine_names())}; known: {', '.join(kn.engine_names())}")
        _expect(ver, str, f"{where}.engines.{eng}")
        kn.recipe(eng, ver)  # unknown version range → error naming it
    torch = p.get("torch")
    if isinstance(torch, dict):
        for eng, ver in torch.items():
            if eng not in engs:
                raise UserError(f"{where}.torch: {eng!r} is not an engine of this profile ({', '.join(engs)})")
            _expect(ver, str, f"{where}.torch.{eng}")
    elif torch is not None:
        _expect(torch, str, f"{where}.torch")
    fa = p.get("flash_attn")
    if fa is not None:
        kn.recipe("flash-attn", _expect(fa, str, f"{where}.flash_attn"))
    strategies = tuple(_expect(p.get("strategies", []), list, f"{where}.strategies"))
    for s in strategies:
        if s not in engines.STRATEGIES:
            raise UserError(f"{where}.strategies: unknown strategy {s!r}{did_you_mean(str(s), engines.STRATEGIES)}; known: {', '.join(engines.STRATEGIES)}")
    if len(set(strategies)) != len(strategies):
        raise UserError(f"{where}.strategies: a strategy is listed twice: {list(strategies)}")
    bases = {**defaults["base_images"], **_expect(p.get("base_images", {}), dict, f"{where}.base_images")}
    _check_keys(bases, _BASE_KEYS, f"{where}.base_images")
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


