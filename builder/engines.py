"""Engine knowledge: the data in data/engines.toml, resolved for one package version.

The code here only knows generic *formats* (how to spell an arch list for a knob, how ranges merge);
which package uses which knob, pin source, build command or strategy flags is data.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import UserError

STRATEGIES = ("MTP2", "MTP7", "DFlash2")

_PACKAGE_KEYS = {"pypi", "kind", "template", "torch_pin", "mem_gb_per_nvcc_thread", "parallelism", "compiled", "rules", "strategies"}
_RULE_KEYS = {
    "versions", "source", "source_subdir", "git_repository", "git_tag", "min_cuda", "min_arch", "min_cmake",
    "build_requirements", "build_requirements_list", "build_command", "build_env", "arch_knobs", "builds_archs",
    "compile_threads_define", "torch_pin", "pin_extras", "companions", "launch", "health", "ready_log", "metrics",
    "cmake_args", "rust_toolchain", "fetch_plan", "patches",
}
_KNOB_FORMATS = {"torch", "cmake-real", "semicolon", "switch-below"}


def did_you_mean(word: str, choices) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def arch_name(arch: int) -> str:
    return f"sm_{arch}"


@dataclass(frozen=True)
class ArchKnob:
    """One switch that selects GPU archs for a package, and how to spell the arch list for it."""

    format: str
    env: str | None = None
    cmake: str | None = None
    accepted: tuple[int, ...] | None = None
    threshold: int | None = None

    @property
    def name(self) -> str:
        return self.env or self.cmake or "?"

    def value(self, archs: tuple[int, ...]) -> str:
        if self.format == "torch":  # "8.0 9.0"
            return " ".join(f"{a // 10}.{a % 10}" for a in archs)
        if self.format == "cmake-real":  # "80-real;90-real"
            return ";".join(f"{a}-real" for a in archs)
        if self.format == "semicolon":  # "80;90"
            return ";".join(str(a) for a in archs)
        if self.format == "switch-below":  # ON when any requested arch is below the threshold
            return "ON" if any(a < (self.threshold or 0) for a in archs) else "OFF"
        raise AssertionError(self.format)


@dataclass(frozen=True)
class Strategy:
    name: str
    versions: SpecifierSet
    why_not: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Recipe:
    """Everything the toolkit knows about building and running one package version."""

    name: str
    version: str
    pypi: str
    kind: str
    template: str
    torch_pin: str
    mem_gb_per_nvcc_thread: float
    compiled: bool
    parallelism: str  # "total-threads" (MAX_JOBS is all threads) | "jobs-x-threads"
    source: str
    source_subdir: str = "."
    git_repository: str = ""
    git_tag: str = ""
    min_cuda: str = "0"
    min_arch: int = 0
    min_cmake: str = ""
    build_requirements: str = ""
    build_requirements_list: tuple[str, ...] = ()
    build_command: str = ""
    build_env: tuple[tuple[str, str], ...] = ()
    arch_knobs: tuple[ArchKnob, ...] = ()
    builds_always: tuple[int, ...] = ()
    builds_switch: tuple[int, ...] = ()
    compile_threads_define: str = ""
    pin_extras: tuple[str, ...] = ()
    companions: tuple[str, ...] = ()
    launch: tuple[str, ...] = ()
    health: str = ""
    ready_log: str = ""
    metrics: tuple[str, ...] = ()
    cmake_args: str = ""
    rust_toolchain: str = ""  # a Rust toolchain the build needs (when no fetch plan supplies one)
    fetch_plan: bool = False  # CMake downloads sources at configure time: fetch them in their own stage
    patches: tuple[tuple[tuple[str, str], ...], ...] = ()  # literal source edits, each a sorted (key, value) tuple
    strategies: dict[str, Strategy] = field(default_factory=dict, compare=False, hash=False)

    # -- archs -------------------------------------------------------------------------------------------
    def knob_values(self, archs: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
        return tuple((k.name, k.value(archs)) for k in self.arch_knobs)

    def built_archs(self, archs: tuple[int, ...]) -> tuple[int, ...]:
        """The SASS archs the build will really emit for the requested archs."""
        if not self.compiled:
            return ()
        if not self.builds_always:
            return tuple(sorted(archs))
        out = set(self.builds_always)
        if any(k.format == "switch-below" and k.value(archs) == "ON" for k in self.arch_knobs):
            out |= set(self.builds_switch)
        return tuple(sorted(out))

    def arch_problems(self, archs: tuple[int, ...]) -> list[str]:
        """Why the requested archs cannot be built as asked (empty when they can)."""
        problems: list[str] = []
        if not self.compiled:
            return problems
        for a in archs:
            if a < self.min_arch:
                problems.append(f"{self.name} {self.version} supports sm_{self.min_arch} and newer, not sm_{a}")
        for knob in self.arch_knobs:
            if knob.accepted is None:
                continue
            for a in archs:
                if a not in knob.accepted:
                    hint = ""
                    lower = [x for x in knob.accepted if x // 10 == a // 10 and x <= a]
                    if lower:
                        hint = f"; sm_{lower[-1]} SASS runs on {a // 10}.{a % 10}: ask for {lower[-1]}"
                    problems.append(
                        f"{self.name} {self.version}: {knob.name} only recognises "
                        f"{', '.join(map(str, knob.accepted))}; {a} would be silently dropped{hint}"
                    )
        built = self.built_archs(archs)
        if self.builds_always:
            for a in archs:
                if a >= self.min_arch and not any(b // 10 == a // 10 and b <= a for b in built):
                    problems.append(
                        f"{self.name} {self.version} hard-codes its archs ({', '.join(map(arch_name, built))}); "
                        f"sm_{a} cannot be selected"
                    )
        return problems

    def patches_for(self, torch: str) -> list[dict]:
        """The source edits that apply when building against this torch."""
        out = []
        for raw in self.patches:
            pt = dict(raw)
            if not torch or Version(torch) in SpecifierSet(pt.get("when_torch", "")):
                out.append(pt)
        return out

    # -- strategies --------------------------------------------------------------------------------------
    def strategy(self, name: str) -> Strategy:
        return self.strategies[name]

    def strategy_problem(self, name: str) -> str | None:
        if name not in self.strategies:
            return f"{self.name} has no strategy {name!r}{did_you_mean(name, self.strategies)}"
        s = self.strategies[name]
        if Version(self.version) not in s.versions:
            return f"{name} cannot run on {self.name} {self.version}: {s.why_not}; versions that can: {self.name}{s.versions}"
        return None


def _read_toml(path) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such engine knowledge file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from None


class Knowledge:
    """The built-in engine data, plus any extra files a matrix names (an in-house package, a test fixture)."""

    def __init__(self, data: dict):
        _check_knowledge(data)
        self.data = data
        self._recipes: dict[tuple[str, str], Recipe] = {}

    def engine_names(self) -> list[str]:
        return [n for n, p in self.data["packages"].items() if p["kind"] == "engine"]

    def known_cuda(self) -> list[str]:
        return list(self.data["cuda"])

    def cuda_archs(self, cuda: str) -> tuple[int, ...]:
        """The archs nvcc of this CUDA version can target (by major.minor)."""
        mm = ".".join(cuda.split(".")[:2])
        table = self.data["cuda"]
        if mm not in table:
            raise UserError(f"CUDA {cuda}: unknown to this toolkit; known: {', '.join(table)}")
        return tuple(table[mm]["archs"])

    def build_tools(self) -> tuple[str, ...]:
        tools = self.data["build_tools"]
        return (*tools["pip"], tools["cmake"])

    def recipe_pypi(self, name: str) -> str:
        """The PyPI project name of a package (same for every version)."""
        return self._package(name)["pypi"]

    def _package(self, name: str) -> dict:
        pkgs = self.data["packages"]
        if name not in pkgs:
            raise UserError(f"unknown package {name!r}{did_you_mean(name, pkgs)}; known: {', '.join(pkgs)}")
        return pkgs[name]

    def recipe(self, name: str, version: str) -> Recipe:
        key = (name, version)
        if key not in self._recipes:
            self._recipes[key] = _make_recipe(name, self._package(name), version)
        return self._recipes[key]


@cache
def load_knowledge(extra: tuple[str, ...] = ()) -> Knowledge:
    data = tomllib.loads(resources.files("builder").joinpath("data/engines.toml").read_text())
    for path in extra:
        more = _read_toml(path)
        for key in more:
            if key not in ("packages", "cuda", "build_tools"):
                raise UserError(f"{path}: unknown key {key!r}; allowed: packages, cuda, build_tools")
        data["packages"].update(more.get("packages", {}))
        data["cuda"].update(more.get("cuda", {}))
        data["build_tools"].update(more.get("build_tools", {}))
    return Knowledge(data)


def _check_knowledge(data: dict) -> None:
    """The data file is code too: reject typos in it as early as typos in matrix.toml."""
    for name, pkg in data["packages"].items():
        for key in pkg:
            if key not in _PACKAGE_KEYS:
                raise UserError(f"engines.toml: packages.{name}: unknown key {key!r}{did_you_mean(key, _PACKAGE_KEYS)}")
        for rule in pkg.get("rules", []):
            for key in rule:
                if key not in _RULE_KEYS:
                    raise UserError(f"engines.toml: packages.{name}.rules: unknown key {key!r}{did_you_mean(key, _RULE_KEYS)}")
            for knob in rule.get("arch_knobs", []):
                if knob["format"] not in _KNOB_FORMATS:
                    raise UserError(f"engines.toml: packages.{name}: unknown knob format {knob['format']!r}")
            try:
                SpecifierSet(rule["versions"])
            except (InvalidSpecifier, KeyError):
                raise UserError(f"engines.toml: packages.{name}.rules: {rule.get('versions')!r} is not a version range "
                                "like \">=0.6,<0.7\"") from None


def parse_version(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UserError(f"{what}: {text!r} is not a version") from None


def recipe(name: str, version: str) -> Recipe:
    """A recipe from the built-in knowledge."""
    return load_knowledge().recipe(name, version)


def _make_recipe(name: str, pkg: dict, version: str) -> Recipe:
    v = parse_version(version, name)
    merged: dict = {}
    matched = False
    for rule in pkg["rules"]:
        if v in SpecifierSet(rule["versions"]):  # ranges were checked when the knowledge was loaded
            matched = True
            merged.update({k: val for k, val in rule.items() if k != "versions"})
    if not matched:
        ranges = " | ".join(r["versions"] for r in pkg["rules"])
        raise UserError(f"{name} {version}: no engine knowledge for this version (known ranges: {ranges})")
    knobs = tuple(
        ArchKnob(
            format=k["format"],
            env=k.get("env"),
            cmake=k.get("cmake"),
            accepted=tuple(k["accepted"]) if "accepted" in k else None,
            threshold=k.get("threshold"),
        )
        for k in merged.get("arch_knobs", [])
    )
    builds = merged.get("builds_archs", {})
    strategies = {
        sname: Strategy(sname, SpecifierSet(s["versions"]), s["why_not"], tuple(s["flags"]))
        for sname, s in pkg.get("strategies", {}).items()
    }
    return Recipe(
        name=name,
        version=version,
        pypi=pkg["pypi"],
        kind=pkg["kind"],
        template=pkg["template"],
        torch_pin=merged.get("torch_pin", pkg["torch_pin"]),
        mem_gb_per_nvcc_thread=float(pkg["mem_gb_per_nvcc_thread"]),
        compiled=bool(pkg.get("compiled", True)),
        parallelism=pkg.get("parallelism", "jobs-x-threads"),
        source=merged["source"],
        source_subdir=merged.get("source_subdir", "."),
        git_repository=merged.get("git_repository", ""),
        git_tag=merged.get("git_tag", "").replace("{version}", version),
        min_cuda=merged.get("min_cuda", "0"),
        min_arch=int(merged.get("min_arch", 0)),
        min_cmake=merged.get("min_cmake", ""),
        build_requirements=merged.get("build_requirements", ""),
        build_requirements_list=tuple(merged.get("build_requirements_list", ())),
        build_command=merged.get("build_command", ""),
        build_env=tuple(sorted(merged.get("build_env", {}).items())),
        arch_knobs=knobs,
        builds_always=tuple(builds.get("always", ())),
        builds_switch=tuple(builds.get("switch", ())),
        compile_threads_define=merged.get("compile_threads_define", ""),
        pin_extras=tuple(merged.get("pin_extras", ())),
        companions=tuple(merged.get("companions", ())),
        launch=tuple(merged.get("launch", ())),
        health=merged.get("health", ""),
        ready_log=merged.get("ready_log", ""),
        metrics=tuple(merged.get("metrics", ())),
        cmake_args=merged.get("cmake_args", ""),
        rust_toolchain=merged.get("rust_toolchain", ""),
        fetch_plan=bool(merged.get("fetch_plan", False)),
        patches=tuple(tuple(sorted(pt.items())) for pt in merged.get("patches", [])),
        strategies=strategies,
    )

