"""resolve: validated profiles + matrix.lock → frozen cells whose every source is pinned.

The matrix says what the user wants (engine versions, CUDA, archs); the lock says what those versions pin
(torch, companion packages, sdist sha256, git commits). This is the only stage that reads both; plan and
everything after it see only cells.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import archs as archs_mod
from . import files, grammar
from .engines import Recipe
from .errors import UserError
from .lockfile import LOCK_NAME, Lock
from .matrix import Matrix, Profile, Selection, matches, selected_profiles


def lock_path(m: Matrix) -> Path:
    return m.path.with_name(LOCK_NAME)


@dataclass(frozen=True)
class Source:
    """Where a package's source comes from, pinned: an sdist with its sha256, or a git commit."""

    kind: str  # "sdist" | "git" | "local" | "index" (a published wheel, not compiled: profiles.<name>.source)
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
        if self.kind == "index":
            return f"index:{self.filename}@sha256:{self.sha256}"
        return f"{self.repository}@{self.commit or self.tag + ' (unpinned tag)'}"


@dataclass(frozen=True)
class Package:
    """One package a cell compiles into a wheel."""

    recipe: Recipe
    source: Source
    archs: tuple[int, ...]  # requested archs
    deps_pins: tuple[tuple[str, str], ...] = ()  # fetch-plan source named by tag → commit (matrix.lock)
    cuda: str = ""  # the cell's CUDA (what a package builds beyond its knobs can depend on it)
    nvcc_flags: tuple[str, ...] = ()  # NVCC_APPEND_FLAGS of its compile (engine data, per CUDA): reproducible objects
    base_gcc: str = ""  # the GCC of the devel base's OS (engine data base_os), "" when unknown
    # source = "auto": the route (index wheel or compile), predicted by resolve, decided by build (builder/route.py)
    route: object | None = None

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def version(self) -> str:
        return self.recipe.version

    @property
    def from_index(self) -> bool:
        """Taken as published from the index, not compiled: its archs are what upstream shipped (the audit
        decides whether they cover the cell's), no knob applies."""
        return self.source.kind == "index"

    @property
    def cache_archs(self) -> tuple[int, ...]:
        """The archs a cached wheel of this package must have been audited for. A wheel from the index is one
        file for every arch list (its key is the file): any cached copy is reused, and this build's audit
        decides for these archs."""
        return () if self.from_index else self.archs

    @property
    def compiled_here(self) -> bool:
        """Whether a build compiles this package's CUDA code."""
        return self.recipe.compiled and not self.from_index

    @property
    def may_compile(self) -> bool:
        """Whether a build may compile it: compiled here, or on the auto route with a prediction that left something
        to build's audit (CI sends such a cell to a compile runner). A prediction from the engine data's record of
        the very file (by sha256) is what the audit will find."""
        return self.compiled_here or bool(self.route and not self.route.known and self.recipe.compiled)

    @property
    def knobs(self) -> tuple[tuple[str, str], ...]:
        return () if self.from_index else self.recipe.knob_values(self.archs, self.cuda)

    @property
    def built_archs(self) -> tuple[int, ...]:
        return () if self.from_index else self.recipe.built_archs(self.archs, self.cuda)

    @property
    def arch_scoped(self) -> tuple:
        """The engine data's arch scopes as this build makes the binaries (Recipe.arch_scopes: a target that compiles
        one family only is asked for that family's GPUs); a wheel from the index has the static ones."""
        return self.recipe.arch_scoped if self.from_index else self.recipe.arch_scopes(self.archs, self.cuda)

    @property
    def built_sass(self) -> tuple[str, ...]:
        """Every SASS name the wheel will carry (sm_90a and the like included): what plan and labels show.
        Unknown before the audit for a wheel taken from the index: ()."""
        return () if self.from_index else self.recipe.built_sass(self.archs, self.cuda)

    def gcc_problem(self, gcc: str | None = None) -> str:
        """Why the devel base's GCC (`gcc`, measured; else the OS's from the engine data) is too old for this
        package's build, "" when it is not (or when nothing is known)."""
        have = self.base_gcc if gcc is None else gcc
        need = self.recipe.min_gcc
        if not need or not have or not self.compiled_here or Version(have) >= Version(need):
            return ""
        return (f"{self.name} {self.version} needs GCC >= {need} (its CMake configure stops otherwise); the devel "
                f"base has GCC {have}: use a base whose OS has a newer one (e.g. ubuntu24.04, trixie)")

    def unpinned(self) -> list[str]:
        """What this package would fetch by a movable name (a tag) rather than a commit or hash."""
        from . import deps

        out = [] if self.source.pinned else [f"source {self.source.ref}"]
        if self.from_index:
            return out
        d = deps.for_package(self)
        if d:
            out += [f"CMake dependency {u}" for u in d["unpinned"]]
        return out


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
    # what the runtime needs to compile kernels at run time (engine data runtime_jit + the CUDA table), or None
    runtime_jit: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    # what the engine compiles at its first request (engine data serve_jit), each with its needs and reason
    serve_jit: tuple[dict, ...] = dataclasses.field(default=(), compare=False, hash=False)
    # the JIT modules the engine builds at its first requests (engine data jit_modules), each with its generator,
    # the GPU families that select it, the libraries it links, and why it is not built by smoke where it is not
    jit_modules: tuple[dict, ...] = dataclasses.field(default=(), compare=False, hash=False)
    jit_prebuilt: bool = False  # profiles.<name>.jit = "prebuilt": those modules are built into the image
    # profiles.<name>.criu = true: what the image's CRIU is built from (builder/data/criu/criu.toml), else None
    criu: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    # every compile cache of the engine, (variable, directory under the image's one cache root): engine data
    # compile_caches; the runtime image sets them, `builder warm` captures that root, L3 boots with them
    compile_caches: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False, hash=False)
    cache_root: str = dataclasses.field(default="", compare=False, hash=False)
    warm_allowance: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False, hash=False)

    @property
    def warm_globs(self) -> tuple[str, ...]:
        """What a boot from a warm layer may still write under the cache root (warm_allowance's globs)."""
        return tuple(g for g, _ in self.warm_allowance)

    @property
    def jit_builds(self) -> tuple[dict, ...]:
        """The modules smoke's JIT layer (and a prebuilt image) builds: those it builds at all, for the cell's archs
        in the families that select each; each with `archs` narrowed to those."""
        out = []
        for m in self.jit_modules:
            archs = [a for a in self.archs if a in m["archs"]]
            if archs and not m["not_built"]:
                out.append({**m, "archs": archs})
        return tuple(out)

    def jit_runs(self, m: dict) -> tuple[tuple[str, str], ...]:
        """The builds of one module of jit_builds, each (label, arch value for its framework). A prebuilt image's
        framework that names its cache after the whole arch set it reads (arch_scope "set": FlashInfer) reads the
        cell's archs (the image pins its arch_env to them): one build for that set, whatever GPUs the host mixes.
        Otherwise one build per arch, as one GPU's process builds it."""
        if self.jit_prebuilt and m["arch_scope"] == "set":
            return (("+".join(archs_mod.sm(a) for a in self.archs), self.jit_arch_set),)
        return tuple((archs_mod.sm(a), archs_mod.dotted(a)) for a in m["archs"])

    @property
    def jit_arch_set(self) -> str:
        """The cell's archs as an arch list ("8.0 9.0"): what a prebuilt image pins a set-scoped framework to."""
        return " ".join(archs_mod.dotted(a) for a in self.archs)

    @property
    def jit_links(self) -> tuple[str, ...]:
        """Every library the engine's JIT modules link (all of them, built by smoke or not): the runtime gives each an
        unversioned link. cuda is the driver's (the libcuda link stub stands in for it)."""
        return tuple(dict.fromkeys(lib for m in self.jit_modules for lib in m["links"] if lib != "cuda"))

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


# The glibc of each base OS (major 2): which manylinux wheels its Python can install.
_GLIBC_MINOR = {"ubuntu20.04": 31, "ubuntu22.04": 35, "ubuntu24.04": 39, "rockylinux8": 28, "rockylinux9": 34,
                "ubi8": 28, "ubi9": 34, "bullseye": 31, "bookworm": 36, "trixie": 41}
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def _wheel_tags(python: str, os_tag: str, where: str) -> list:
    """The wheel tags pip in the cell's runtime accepts, best first (CPython of the profile, the base OS's glibc,
    the machine the images are built on)."""
    import platform

    from packaging import tags

    if os_tag not in _GLIBC_MINOR:
        raise UserError(f"{where}.os: the glibc of {os_tag} is unknown to this toolkit, so no wheel from the index "
                        f"can be chosen for it (known: {', '.join(_GLIBC_MINOR)}); build the package instead")
    machine = _MACHINES.get(platform.machine().lower(), platform.machine().lower())
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms = []
    for minor in range(_GLIBC_MINOR[os_tag], 4, -1):
        platforms.append(f"manylinux_2_{minor}_{machine}")
        if minor in legacy:
            platforms.append(f"{legacy[minor]}_{machine}")
    platforms.append(f"linux_{machine}")
    version = tuple(int(x) for x in python.split("."))
    return [*tags.cpython_tags(version, platforms=platforms), *tags.compatible_tags(version, platforms=platforms)]


def _index_candidate(entry, prof: Profile, r: Recipe) -> tuple[dict | None, str]:
    """The published wheel of `r` this cell's runtime can install (the lock's entry), or None and why none."""
    from packaging.utils import parse_wheel_filename

    where = f"profiles.{prof.name}"
    if not entry.wheels:
        return None, f"the index publishes no Linux wheel of {r.name} {r.version}"
    rank = {t: i for i, t in enumerate(_wheel_tags(prof.python, prof.os, where))}
    best = None
    for w in entry.wheels:
        tags_ = parse_wheel_filename(w["filename"])[3]
        score = min((rank[t] for t in tags_ if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, w)
    if best is None:
        names = ", ".join(w["filename"] for w in entry.wheels)
        return None, (f"no wheel of {r.name} {r.version} on the index installs on Python {prof.python} / {prof.os} "
                      f"(it publishes {names})")
    return best[1], ""


def _wheel_source(w: dict) -> Source:
    return Source("index", url=w["url"], sha256=w["sha256"], filename=w["filename"])


def _index_source(entry, prof: Profile, r: Recipe) -> Source:
    """The published wheel of `r` this cell's runtime can install, pinned by the sha256 matrix.lock records."""
    where = f"profiles.{prof.name}"
    if not entry.wheels:
        raise UserError(f"{LOCK_NAME}: no wheels recorded for {r.name} {r.version}, which {where}.source takes from "
                        "the index; run `builder lock`")
    w, why = _index_candidate(entry, prof, r)
    if w is None:
        raise UserError(f"{where}.source.{r.name}: {why}; build it instead")
    return _wheel_source(w)


def _auto_route(m: Matrix, lock: Lock, r: Recipe, prof: Profile, torch: str, archs: tuple[int, ...]):
    """source = "auto": the compile source, the published wheel, and which of them build is predicted to take."""
    from . import route

    build = _source(m, lock, r)
    entry = lock.get(r.name, r.version)
    if not entry.wheels_read:
        raise UserError(f"{LOCK_NAME}: {r.name} {r.version} records no wheels from the index, which "
                        f"profiles.{prof.name}.source.{r.name} = \"auto\" weighs against compiling; run `builder lock`")
    w, why = _index_candidate(entry, prof, r)
    if w is None:
        return route.no_wheel(r, why, build)
    return route.predict(m.knowledge, r, w, _wheel_source(w), build, torch, prof.cuda, prof.python, archs)


def _source(m: Matrix, lock: Lock, r: Recipe, prof: Profile | None = None) -> Source:
    if prof is not None and prof.from_index(r.name):
        return _index_source(lock.get(r.name, r.version), prof, r)
    if r.source == "local":
        root = (m.path.parent / r.source_subdir).resolve()
        if not root.is_dir():
            raise UserError(f"{r.name}: local source {root} is not a directory")
        grammar.check(grammar.path_argument, str(root), f"{r.name}: local source")
        try:
            digest = _tree_sha256(root)
        except OSError as exc:
            raise UserError(f"{r.name}: local source {root}: cannot read {exc.filename or ''}: {exc.strerror or exc}") from None
        return Source("local", path=str(root), sha256=digest)
    entry = lock.get(r.name, r.version)
    if r.source == "sdist":
        if not entry.sdist:
            raise UserError(f"{LOCK_NAME}: {r.name} {r.version} has no sdist recorded; run `builder lock`")
        return Source("sdist", url=entry.sdist["url"], sha256=entry.sdist["sha256"], filename=entry.sdist["filename"], subdir=r.source_subdir)
    g = entry.git
    return Source("git", repository=g["repository"], tag=g["tag"], commit=g.get("commit", ""), subdir=r.subdir_at(g["tag"]))


def _torch_entry(m: Matrix, lock: Lock, engine: Recipe):
    """The lock entry that pins the cell's torch (the engine's, or the package's it takes torch through); None
    for an engine without torch."""
    if engine.torch_pin == "none":
        return None
    entry = lock.get(engine.name, engine.version)
    if engine.torch_pin.startswith("via:"):
        via = engine.torch_pin.split(":", 1)[1]
        return _torch_entry(m, lock, m.knowledge.recipe(via, entry.pins[via]))
    if not entry.torch:
        raise UserError(f"{LOCK_NAME}: {engine.name} {engine.version} records no torch pin; run `builder lock`")
    return entry


def torch_cuda_problem(entry, cuda: str) -> str:
    """Why the torch a lock entry pins cannot go into a cell of this CUDA ("" when it can, or when the lock does
    not record torch's CUDA): every extension is compiled with the cell's nvcc against that torch and loads only
    with the CUDA runtime torch brings (libcudart.so.<major>)."""
    if entry is None or not entry.torch_cuda:
        return ""
    major = int(entry.torch_cuda["major"])
    if major == int(cuda.split(".")[0]):
        return ""
    return (f"torch {entry.torch} (pinned by {entry.name} {entry.version}) is a CUDA {major} build (its metadata "
            f"requires {entry.torch_cuda['from']}), the profile's CUDA is {cuda}: extensions compiled with nvcc "
            f"{cuda} against it do not load beside its CUDA {major} runtime; use a CUDA {major}.x profile for "
            f"{entry.name} {entry.version}")


def base_refs(m: Matrix, prof: Profile) -> dict[str, str]:
    """The profile's base images ("devel", "runtime") by name, after {cuda}, {os} and the mirrors."""
    return {k: _mirror(v.format(cuda=prof.cuda, os=prof.os), m.defaults["mirrors"]) for k, v in prof.base_images.items()}


def _packages(m: Matrix, lock: Lock, prof: Profile, eng: Recipe, pins: dict, archs: tuple[int, ...], archs_from: str,
              torch: str) -> list[Package]:
    """The cell's packages: the engine, its companions at their locked pins and flash-attn, each with its source (or
    its auto route), checked against the profile's CUDA and the archs."""
    where, engine, version, kn = f"profiles.{prof.name}", eng.name, eng.version, m.knowledge
    missing = [c for c in eng.companions if c not in pins]
    if missing:
        raise UserError(f"{LOCK_NAME}: {engine} {version} records no pin for {', '.join(missing)}; run `builder lock`")
    recipes = [eng] + [kn.recipe(c, pins[c]) for c in eng.companions]
    if prof.flash_attn:
        recipes.append(kn.recipe("flash-attn", prof.flash_attn))
    packages = []
    for r in recipes:
        if Version(prof.cuda) < Version(r.min_cuda):
            raise UserError(f"{where}.cuda: {r.name} {r.version} needs CUDA >= {r.min_cuda}, the profile has {prof.cuda}")
        route = _auto_route(m, lock, r, prof, torch, archs) if prof.auto(r.name) else None
        problems = [] if prof.from_index(r.name) or (route and route.chosen == "index") else r.arch_problems(archs, prof.cuda)
        if problems:
            raise UserError(f"{archs_from} (profile {prof.name}): " + "; ".join(problems))
        source = (route.index if route.chosen == "index" else route.build) if route else _source(m, lock, r, prof)
        compiles = source.kind != "index" or route is not None  # an auto package may still be compiled
        dep_pins = lock.get(r.name, r.version).deps if r.fetch_plan and compiles else {}
        packages.append(Package(recipe=r, source=source, archs=archs, cuda=prof.cuda, base_gcc=kn.base_gcc(prof.os),
                                nvcc_flags=kn.nvcc_append_flags(prof.cuda) if r.compiled and compiles else (),
                                deps_pins=tuple(sorted((k, v["commit"]) for k, v in dep_pins.items() if v.get("commit"))),
                                route=route))
    return packages


def _jit_of(kn, prof: Profile, eng: Recipe, archs: tuple[int, ...]):
    """What the cell compiles at run time: its runtime_jit toolchain, serve_jit paths and JIT modules (each checked
    against the engine data), and whether the profile prebuilds them; (jit, serve_jit, jit_modules, prebuilt)."""
    where, engine, version = f"profiles.{prof.name}", eng.name, eng.version
    jit = kn.runtime_jit(prof.cuda) if eng.runtime_jit else None
    if eng.runtime_jit and jit is None:
        raise UserError(f"{where}.cuda: {engine} {version} compiles kernels at run time (nvcc in the image) and CUDA "
                        f"{prof.cuda} has no runtime_jit entry in the engine knowledge (no nvcc wheels known for it)")

    serve_jit = tuple(kn.serve_jit(name, prof.python) for name in eng.serve_jit)
    for path in serve_jit:
        if path["needs_runtime_jit"] and jit is None:
            raise UserError(f"{where}: {engine} {version} compiles with nvcc at its first request (serve_jit "
                            f"{path['name']}) and its engine data gives it no runtime_jit toolchain")

    jit_modules = list(kn.jit_modules_of(eng, prof.strategies))
    for mod in jit_modules:
        if jit is None:
            raise UserError(f"{where}: {engine} {version} builds the JIT module {mod['name']} at its first requests and "
                            f"its engine data gives it no runtime_jit toolchain")
    served = {p["name"] for p in serve_jit}
    for path, covered_by, _ in eng.jit_paths:
        kind, _, name = covered_by.partition(".")
        if covered_by and not ((kind == "serve_jit" and name in served) or (covered_by == "jit_modules" and jit_modules)):
            raise UserError(f"{engine} {version}: jit_paths {path!r} is covered_by {covered_by!r}, which this version "
                            f"does not have (serve_jit: {', '.join(sorted(served)) or 'none'}; jit_modules: "
                            f"{len(jit_modules)})")
    prebuilt = prof.jit.get(engine) == "prebuilt"
    if prebuilt and not any(not m["not_built"] and set(m["archs"]) & set(archs) for m in jit_modules):
        raise UserError(f"{where}.jit: {engine} {version} builds no JIT module (engine data jit_modules) for the archs "
                        f"{','.join(map(str, archs))}: nothing to prebuild")
    return jit, serve_jit, jit_modules, prebuilt


def _targetable(kn, prof: Profile, archs: tuple[int, ...], archs_from: str) -> None:
    """The profile's CUDA toolkit must be able to target every arch."""
    possible = kn.cuda_archs(prof.cuda)
    for a in archs:
        if a not in possible:
            lo, hi = min(possible), max(possible)
            raise UserError(
                f"{archs_from}: arch {a} cannot be targeted by CUDA {prof.cuda} of profile {prof.name} "
                f"(its nvcc emits sm_{lo}..sm_{hi}: {', '.join(map(str, possible))})"
            )


def make_cell(m: Matrix, lock: Lock, prof: Profile, engine: str, archs: tuple[int, ...], archs_from: str = "",
              base_devel: str | None = None, base_runtime: str | None = None) -> Cell:
    version = prof.engines[engine]
    where = f"profiles.{prof.name}"
    archs_from = archs_from or f"{where}.archs"
    kn = m.knowledge
    eng = kn.recipe(engine, version)

    if Version(prof.cuda) < Version(eng.min_cuda):
        raise UserError(f"{where}.cuda: {engine} {version} needs CUDA >= {eng.min_cuda}, the profile has {prof.cuda}")
    # torch: the engine's own pin; a hand-typed one must agree with it, and its CUDA major with the profile's
    torch_entry = _torch_entry(m, lock, eng)
    torch = torch_entry.torch if torch_entry else ""
    if why := torch_cuda_problem(torch_entry, prof.cuda):
        raise UserError(f"{where}.cuda: {why}")
    stated = prof.torch.get(engine) if isinstance(prof.torch, dict) else prof.torch
    if stated is not None and torch and Version(stated) != Version(torch):
        raise UserError(
            f"{where}.torch: {engine} {version} pins torch=={torch} in its own metadata, not {stated}; "
            f"remove the torch key or set it to {torch}"
        )
    locked = lock.get(engine, version) if eng.source != "local" else None
    pins = locked.pins if locked else {}
    if locked and locked.requires_python and Version(prof.python + ".0") not in SpecifierSet(locked.requires_python):
        raise UserError(f"{where}.python: {engine} {version} requires Python {locked.requires_python}, not {prof.python}")

    _targetable(kn, prof, archs, archs_from)
    packages = _packages(m, lock, prof, eng, pins, archs, archs_from, torch)
    jit, serve_jit, jit_modules, prebuilt = _jit_of(kn, prof, eng, archs)

    for s in prof.strategies:
        why = eng.strategy_problem(s)
        if why:
            raise UserError(f"{where}.strategies: {why}")

    py = prof.python.replace(".", "")
    sm = ".".join(str(a) for a in archs)
    torch_part = f"-torch{torch}" if torch else ""
    # a cell with a wheel taken from the index is another image than the one compiled here: its own id and tag
    # a cell with a package on the "auto" route: one id whatever build decides (its labels say what it took)
    index_part = "-auto" if any(p.route for p in packages) else "-index" if any(p.from_index for p in packages) else ""
    # as are one whose JIT modules are prebuilt and one that carries CRIU (profiles.<name>.criu)
    cell_id = (f"{engine}-{version}-{prof.cuda_tag}{torch_part}-py{py}-sm{sm}{index_part}"
               f"{'-jitprebuilt' if prebuilt else ''}{'-criu' if prof.criu else ''}")
    bases = base_refs(m, prof)
    for k, ref in bases.items():  # the templates and mirrors were checked; what they make must be a reference too
        grammar.check(grammar.image_ref, ref, f"{where}.base_images.{k} (after {{cuda}}, {{os}} and mirrors)")
    bases = {k: lock.pinned_base(ref) for k, ref in bases.items()}  # ref@sha256:... once `builder lock` resolved it
    tag = cell_id[len(engine) + 1 :]
    try:
        grammar.image_tag(tag)
        grammar.image_name(f"{m.defaults['registry']}/{engine}")
    except ValueError as exc:
        raise UserError(f"{where}: the image {m.defaults['registry']}/{engine}:{tag} of cell {cell_id} is no valid "
                        f"image reference ({exc})") from None
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
        tag=tag,
        build_tools=kn.build_tools(),
        runtime_jit=jit,
        serve_jit=serve_jit,
        jit_modules=tuple(jit_modules),
        jit_prebuilt=prebuilt,
        criu=criu_data() if prof.criu else None,
        compile_caches=kn.compile_caches_of(eng),
        cache_root=kn.cache_root_of(eng),
        warm_allowance=eng.warm_allowance,
    )


def criu_data() -> dict:
    """The CRIU a runtime image carries (builder/data/criu/criu.toml), with its patches' paths."""
    data = dict(files.package_data("criu/criu.toml"))
    data["patch_paths"] = tuple(Path(str(resources.files("builder").joinpath("data", "criu", p))) for p in data["patches"])
    return data


def select(m: Matrix, sel: Selection, lock: Lock | None = None) -> list[Cell]:
    """The cells the selectors pick, resolved against matrix.lock (read next to the matrix unless given)."""
    lock = lock if lock is not None else Lock.load(lock_path(m))
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
            cells.append(make_cell(m, lock, prof, engine, archs, archs_from, sel.base_devel, sel.base_runtime))
        has = {p.name for c in cells if c.profile is prof for p in c.packages}
        for name in prof.sources:
            if name not in has and not sel.engines:
                raise UserError(f"profiles.{prof.name}.source: no cell of this profile has the package {name!r} "
                                f"(its cells have {', '.join(sorted(has))})")
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
