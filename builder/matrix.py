"""matrix.toml → validated, frozen cells.

Layers, resolved once: built-in defaults → matrix.toml [defaults] → profile → CLI selectors (--arch ...).
Every user mistake becomes a UserError naming the key or value; nothing runs before validation passes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import engines
from .engines import Knowledge, Recipe, did_you_mean
from .errors import UserError
from .lock import LOCK_NAME, Lock

BUILTIN_DEFAULTS = {
    "profile": "cu130",
    "archs": [80, 90],
    "registry": "127.0.0.1:5000/builder",
    "index": "https://pypi.org/simple",
    "model": "Qwen/Qwen3.8-27B-FP8",
    "base_images": {"devel": "nvidia/cuda:{cuda}-devel-{os}", "runtime": "nvidia/cuda:{cuda}-base-{os}"},
    "mirrors": {},
    "knowledge": [],  # extra engine-knowledge TOML files, relative to the matrix file
}
_TOP_KEYS = {"defaults", "profiles"}
_PROFILE_KEYS = {"cuda", "os", "python", "torch", "flash_attn", "engines", "strategies", "archs", "base_images"}
_BASE_KEYS = {"devel", "runtime"}


@dataclass(frozen=True)
class Source:
    """Where a package's source comes from, pinned: an sdist with its sha256, or a git commit."""

    kind: str  # "sdist" | "git" | "local"
    url: str = ""
    sha256: str = ""
    filename: str = ""
    repository: str = ""
    tag: str = ""
    commit: str = ""
    subdir: str = "."
    path: str = ""  # local sources: a directory, passed to BuildKit as a named context

    @property
    def pinned(self) -> bool:
        return bool(self.commit) if self.kind == "git" else bool(self.sha256)

    @property
    def ref(self) -> str:
        if self.kind == "sdist":
            return f"{self.filename}@sha256:{self.sha256}"
        if self.kind == "local":
            return f"local:{Path(self.path).name}@sha256:{self.sha256}"
        return f"{self.repository}@{self.commit or self.tag + ' (unpinned tag)'}"


@dataclass(frozen=True)
class Package:
    """One package a cell compiles into a wheel."""

    recipe: Recipe
    source: Source
    archs: tuple[int, ...]  # requested archs
    deps_pins: tuple[tuple[str, str], ...] = ()  # fetch-plan source named by tag → commit (matrix.lock)

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def version(self) -> str:
        return self.recipe.version

    @property
    def knobs(self) -> tuple[tuple[str, str], ...]:
        return self.recipe.knob_values(self.archs)

    @property
    def built_archs(self) -> tuple[int, ...]:
        return self.recipe.built_archs(self.archs)

    def unpinned(self) -> list[str]:
        """What this package would fetch by a movable name (a tag) rather than a commit or hash."""
        from . import deps

        out = [] if self.source.pinned else [f"source {self.source.ref}"]
        d = deps.for_package(self)
        if d:
            out += [f"CMake dependency {u}" for u in d["unpinned"]]
        return out


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
class Cell:
    id: str
    engine: str
    version: str
    profile: Profile
    torch: str
    archs: tuple[int, ...]
    packages: tuple[Package, ...]
    strategies: tuple[str, ...]
    base_devel: str
    base_runtime: str
    image: str  # repository without tag
    tag: str
    build_tools: tuple[str, ...] = ()

    @property
    def engine_recipe(self) -> Recipe:
        return next(p.recipe for p in self.packages if p.name == self.engine)

    @property
    def python(self) -> str:
        return self.profile.python

    @property
    def cuda(self) -> str:
        return self.profile.cuda

    @property
    def ref(self) -> str:
        return f"{self.image}:{self.tag}"

    def summary(self) -> dict:
        """The facts programs read about a cell (plan --json, matrix)."""
        return {
            "profile": self.profile.name,
            "engine": self.engine,
            "version": self.version,
            "cuda": self.cuda,
            "torch": self.torch,
            "python": self.python,
            "archs": list(self.archs),
            "image": self.ref,
        }


@dataclass(frozen=True)
class Matrix:
    path: Path
    raw: dict
    defaults: dict
    profiles: dict[str, Profile]
    lock: Lock = field(compare=False)
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
def parse_archs(text: str) -> tuple[int, ...]:
    """'80,90' / '8.0,9.0' / 'sm_80,sm_90' → (80, 90)."""
    out = []
    for tok in text.replace(" ", ",").split(","):
        tok = tok.strip()
        if not tok:
            continue
        m = re.fullmatch(r"(?:sm_?)?(\d{2,3})|(\d+)\.(\d)", tok)
        if not m:
            raise UserError(f"--arch: {tok!r} is not an SM arch; write e.g. 80,90 (or 8.0,9.0)")
        out.append(int(m.group(1)) if m.group(1) else int(m.group(2)) * 10 + int(m.group(3)))
    if not out:
        raise UserError("--arch: no arch given; write e.g. --arch 80,90")
    return tuple(sorted(set(out)))


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


def _archs_value(value, where: str) -> tuple[int, ...]:
    _expect(value, list, where)
    for a in value:
        if not isinstance(a, int) or isinstance(a, bool) or not 30 <= a <= 200:
            raise UserError(f"{where}: {a!r} is not an SM arch number like 80 or 90")
    if not value:
        raise UserError(f"{where}: empty arch list")
    return tuple(sorted(set(value)))


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
    _archs_value(defaults["archs"], "defaults.archs")
    for key in ("profile", "registry", "index", "model"):
        _expect(defaults[key], str, f"defaults.{key}")
    if not re.fullmatch(r"[a-z0-9.:_/-]+", defaults["registry"]):
        raise UserError(f"defaults.registry: {defaults['registry']!r} is not a registry/repository prefix like 127.0.0.1:5000/builder")

    extra = tuple(str((path.parent / p).resolve()) for p in _expect(defaults["knowledge"], list, "defaults.knowledge"))
    kn = engines.load_knowledge(extra)
    profiles_raw = _expect(raw.get("profiles", {}), dict, "profiles")
    if not profiles_raw:
        raise UserError(f"{path.name}: no [profiles.*] table: nothing to build")
    profiles = {name: _profile(kn, name, _expect(p, dict, f"profiles.{name}"), defaults) for name, p in profiles_raw.items()}
    if defaults["profile"] not in profiles:
        raise UserError(f"defaults.profile: {defaults['profile']!r} is not a profile{did_you_mean(defaults['profile'], profiles)}")
    lock = Lock.load(path.with_name(LOCK_NAME))
    return Matrix(path=path, raw=raw, defaults=defaults, profiles=profiles, lock=lock, knowledge=kn)


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
        archs=_archs_value(p["archs"], f"{where}.archs") if "archs" in p else None,
        base_images=bases,
    )


# -- cells ----------------------------------------------------------------------------------------------
def _mirror(image: str, mirrors: dict[str, str]) -> str:
    for prefix, repl in mirrors.items():
        if image == prefix or image.startswith(prefix + ":") or image.startswith(prefix + "/"):
            return repl + image[len(prefix) :]
    return image


def _tree_sha256(root: Path) -> str:
    """Content hash of a source directory: relative paths, modes and bytes of every file."""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + oct(f.stat().st_mode & 0o111).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def _source(m: Matrix, r: Recipe) -> Source:
    if r.source == "local":
        root = (m.path.parent / r.source_subdir).resolve()
        if not root.is_dir():
            raise UserError(f"{r.name}: local source {root} is not a directory")
        return Source("local", path=str(root), sha256=_tree_sha256(root))
    lock = m.lock
    entry = lock.get(r.name, r.version)
    if r.source == "sdist":
        if not entry.sdist:
            raise UserError(f"{LOCK_NAME}: {r.name} {r.version} has no sdist recorded; run `builder lock`")
        return Source("sdist", url=entry.sdist["url"], sha256=entry.sdist["sha256"], filename=entry.sdist["filename"], subdir=r.source_subdir)
    g = entry.git
    return Source("git", repository=g["repository"], tag=g["tag"], commit=g.get("commit", ""), subdir=r.source_subdir)


def _torch_for(m: Matrix, engine: Recipe) -> str:
    if engine.torch_pin == "none":
        return ""
    lock = m.lock
    entry = lock.get(engine.name, engine.version)
    if engine.torch_pin.startswith("via:"):
        via = engine.torch_pin.split(":", 1)[1]
        return _torch_for(m, m.knowledge.recipe(via, entry.pins[via]))
    if not entry.torch:
        raise UserError(f"{LOCK_NAME}: {engine.name} {engine.version} records no torch pin; run `builder lock`")
    return entry.torch


def make_cell(m: Matrix, prof: Profile, engine: str, archs: tuple[int, ...], archs_from: str = "",
              base_devel: str | None = None, base_runtime: str | None = None) -> Cell:
    version = prof.engines[engine]
    where = f"profiles.{prof.name}"
    archs_from = archs_from or f"{where}.archs"
    kn = m.knowledge
    eng = kn.recipe(engine, version)

    if Version(prof.cuda) < Version(eng.min_cuda):
        raise UserError(f"{where}.cuda: {engine} {version} needs CUDA >= {eng.min_cuda}, the profile has {prof.cuda}")
    # torch: the engine's own pin; a hand-typed one must agree with it
    torch = _torch_for(m, eng)
    stated = prof.torch.get(engine) if isinstance(prof.torch, dict) else prof.torch
    if stated is not None and torch and Version(stated) != Version(torch):
        raise UserError(
            f"{where}.torch: {engine} {version} pins torch=={torch} in its own metadata, not {stated}; "
            f"remove the torch key or set it to {torch}"
        )
    locked = m.lock.get(engine, version) if eng.source != "local" else None
    pins = locked.pins if locked else {}
    if locked and locked.requires_python and Version(prof.python + ".0") not in SpecifierSet(locked.requires_python):
        raise UserError(f"{where}.python: {engine} {version} requires Python {locked.requires_python}, not {prof.python}")

    # the CUDA toolkit must be able to target every arch
    possible = kn.cuda_archs(prof.cuda)
    for a in archs:
        if a not in possible:
            lo, hi = min(possible), max(possible)
            raise UserError(
                f"{archs_from}: arch {a} cannot be targeted by CUDA {prof.cuda} of profile {prof.name} "
                f"(its nvcc emits sm_{lo}..sm_{hi}: {', '.join(map(str, possible))})"
            )

    recipes = [eng] + [kn.recipe(c, pins[c]) for c in eng.companions]
    if prof.flash_attn:
        recipes.append(kn.recipe("flash-attn", prof.flash_attn))
    packages = []
    for r in recipes:
        if Version(prof.cuda) < Version(r.min_cuda):
            raise UserError(f"{where}.cuda: {r.name} {r.version} needs CUDA >= {r.min_cuda}, the profile has {prof.cuda}")
        problems = r.arch_problems(archs)
        if problems:
            raise UserError(f"{archs_from} (profile {prof.name}): " + "; ".join(problems))
        dep_pins = m.lock.get(r.name, r.version).deps if r.fetch_plan else {}
        packages.append(Package(recipe=r, source=_source(m, r), archs=archs,
                                deps_pins=tuple(sorted((k, v["commit"]) for k, v in dep_pins.items() if v.get("commit")))))

    for s in prof.strategies:
        why = eng.strategy_problem(s)
        if why:
            raise UserError(f"{where}.strategies: {why}")

    py = prof.python.replace(".", "")
    sm = ".".join(str(a) for a in archs)
    torch_part = f"-torch{torch}" if torch else ""
    cell_id = f"{engine}-{version}-{prof.cuda_tag}{torch_part}-py{py}-sm{sm}"
    bases = {k: _mirror(v.format(cuda=prof.cuda, os=prof.os), m.defaults["mirrors"]) for k, v in prof.base_images.items()}
    return Cell(
        id=cell_id,
        engine=engine,
        version=version,
        profile=prof,
        torch=torch,
        archs=archs,
        packages=tuple(packages),
        strategies=prof.strategies,
        base_devel=base_devel or bases["devel"],
        base_runtime=base_runtime or bases["runtime"],
        image=f"{m.defaults['registry']}/{engine}",
        tag=cell_id[len(engine) + 1 :],
        build_tools=kn.build_tools(),
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


def select(m: Matrix, sel: Selection) -> list[Cell]:
    profiles = selected_profiles(m, sel)

    cells: list[Cell] = []
    for prof in profiles:
        if sel.archs:
            archs, archs_from = sel.archs, "--arch"
        elif prof.archs:
            archs, archs_from = prof.archs, f"profiles.{prof.name}.archs"
        else:
            archs, archs_from = tuple(m.defaults["archs"]), "defaults.archs"
        for engine in prof.engines:
            if sel.engines and engine not in sel.engines:
                continue
            cells.append(make_cell(m, prof, engine, archs, archs_from, sel.base_devel, sel.base_runtime))
    seen: dict[str, Cell] = {}
    for c in cells:
        if c.id in seen:
            raise UserError(f"two cells share the id {c.id} (profiles {seen[c.id].profile.name} and {c.profile.name})")
        seen[c.id] = c
    if sel.only:
        cells = [c for c in cells if matches(c.id, sel.only)]
    if sel.skip:
        cells = [c for c in cells if not matches(c.id, sel.skip)]
    if not cells:
        raise UserError("the selection is empty: " + _describe(sel, m))
    return cells


def _describe(sel: Selection, m: Matrix) -> str:
    parts = []
    parts.append(f"profile {','.join(sel.profiles) or m.defaults['profile']}")
    if sel.engines:
        parts.append(f"engine {','.join(sel.engines)}")
    if sel.cuda:
        parts.append(f"cuda {','.join(sel.cuda)}")
    if sel.only:
        parts.append(f"only {','.join(sel.only)}")
    if sel.skip:
        parts.append(f"skip {','.join(sel.skip)}")
    return "no cell matches " + ", ".join(parts) + " (see `builder plan --profile all`)"
