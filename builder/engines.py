"""Engine knowledge: the data in data/engines.toml, resolved for one package version.

The code here only knows generic *formats* (how to spell an arch list for a knob, how ranges merge);
which package uses which knob, pin source, build command or strategy flags is data.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import archs as archs_mod
from . import files, redact, schema
from .errors import UserError

from .schema import did_you_mean  # noqa: F401 - callers name it from here too


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

    def archs_for(self, archs: tuple[int, ...]) -> tuple[int, ...]:
        """The archs this knob is given: a requested arch it does not recognise is served by the highest recognised
        one whose SASS runs on it (flash-attn's FLASH_ATTN_CUDA_ARCHS has no 103: its sm_100 runs on 10.3); one with
        no such substitute is left out (arch_problems refuses it)."""
        if self.accepted is None:
            return archs
        out = {a if a in self.accepted else archs_mod.sass_substitute(a, self.accepted) for a in archs}
        return tuple(sorted(a for a in out if a is not None))

    def value(self, archs: tuple[int, ...]) -> str:
        return archs_mod.spell(self.format, self.archs_for(archs), self.threshold)


@dataclass(frozen=True)
class Strategy:
    name: str
    versions: SpecifierSet
    why_not: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # the engine's environment under this strategy
    forbid_log: tuple[str, ...] = ()  # log lines that mean the strategy did not take effect
    expect: tuple[tuple[str, object], ...] = ()  # smoke L2: dotted path in the parsed args -> value
    k: int = 0  # draft tokens per draft (smoke L3: draft tokens = drafts x k), 0 when not a fixed ratio
    drafter: str = ""  # the default drafter checkpoint ({drafter} in the flags)
    # JIT modules only this strategy selects: (module, archs, selected_by, not_built, engine versions), as a rule's
    # jit_modules and the releases whose code selects each ("" all the strategy's)
    jit_modules: tuple[tuple[str, tuple[int, ...], str, str, str], ...] = ()
    cold_boot_s: int = 0  # a cold boot under this strategy as measured (0: none): the budget of an image recording none


@dataclass(frozen=True)
class Binary:
    """One compiled file of a release as upstream builds it: the CMake target that makes it, its SASS targets and
    the kernels per SASS target (fatbin entries per arch) — or, for an engine whose CMake selects each target's archs
    itself (vLLM), the CMake arch lists the target passes to the engine's intersection rule (`cmake_archs`)."""

    files: str  # glob inside the wheel, the same string as its arch_scoped entry
    target: str
    sass: tuple[str, ...] = ()
    units: int = 0  # 0: not counted
    # the target's CMake arch lists ("9.0a", "10.0f", "8.0+PTX"; "CUDA_ARCHS": the build's whole list), each
    # intersected with the build's archs by the recipe's cmake_archs rule; the target compiles the union of the results
    cmake_archs: tuple[tuple[str, ...], ...] = ()
    # "first": only the first list with a non-empty result is compiled (qutlass.cmake: one family per build)
    pick: str = "all"
    source: str = ""  # the upstream file and lines the lists were read from


@dataclass(frozen=True)
class BinarySwitch:
    """A CMake option that builds one arch-scoped binary at all (sglang-kernel's SGL_KERNEL_ENABLE_FA3 → flash_ops):
    passed OFF when no requested GPU loads that binary (its arch_scoped entry, the same `files` glob)."""

    files: str
    cmake: str
    why: str


@dataclass(frozen=True)
class BinaryPlan:
    binary: Binary
    sass: tuple[str, ...]  # what a build for the requested archs keeps
    switched_off: str = ""  # the CMake option passed OFF so that the binary is not built at all ("" when it is)
    ptx: tuple[str, ...] = ()  # PTX it keeps (an engine's "8.0+PTX" entries)
    # the lists of a pick = "first" target that would have compiled something: more than one means the build
    # chose the first and the GPUs of the others get no code from this binary
    candidates: tuple[tuple[str, ...], ...] = ()

    @property
    def units(self) -> int:
        return len(self.sass) * self.binary.units

    @property
    def default_units(self) -> int:
        return len(self.binary.sass) * self.binary.units

    @property
    def chose_one(self) -> bool:
        return len(self.candidates) > 1


@dataclass(frozen=True)
class CMakeArchs:
    """An engine's own filter of the requested archs (vLLM: CUDA_ARCHS = cuda_archs_loose_intersection(
    CUDA_SUPPORTED_ARCHS, the archs of torch's -gencode flags)); every target's lists are intersected with the result.
    `supported`: (min_cuda, CMake arch list), complete lists, the one with the highest min_cuda not above the cell's
    CUDA applies."""

    rule: str
    supported: tuple[tuple[str, tuple[str, ...]], ...]

    def supported_for(self, cuda: str) -> tuple[str, ...] | None:
        fits = [(Version(m), archs) for m, archs in self.supported if cuda and Version(cuda) >= Version(m)]
        return max(fits)[1] if fits else None

    def intersect(self, src: tuple[str, ...], tgt: list[str]) -> list[str]:
        if self.rule == archs_mod.LOOSE_INTERSECTION:
            return archs_mod.loose_intersection(src, tgt)
        raise ValueError(f"unknown CMake arch rule {self.rule!r}; known: {archs_mod.LOOSE_INTERSECTION}")

    def kept(self, archs: tuple[int, ...], cuda: str) -> tuple[int, ...]:
        """The requested archs as the engine's CMake keeps them (10.3 → 10.0 with nvcc 13.0); unchanged where the
        data has no supported list for this CUDA."""
        supported = self.supported_for(cuda)
        if supported is None:
            return archs
        out = self.intersect(supported, archs_mod.cmake_spelled(archs))
        return tuple(sorted({int(a.replace(".", "")) for a in out}))


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
    tag_subdirs: tuple[tuple[str, str], ...] = ()  # (tag, subdir): where the tree kept the package at that tag
    git_repository: str = ""
    git_tag: str = ""
    min_cuda: str = "0"
    min_arch: int = 0
    min_cmake: str = ""
    min_gcc: str = ""  # the oldest GCC the build accepts
    build_requirements: tuple[str, ...] = ()  # requirements files of the source tree
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
    tp_flag: str = ""  # the engine's tensor-parallel flag (--tensor-parallel-size, --tp-size); "" none
    ready_path: str = ""  # answers only once the engine serves, warm-up done ("": the OpenAI model list)
    health_wait_s: int = 0  # the longest the engine takes to answer its health / ready path (0: at once)
    shutdown_flag: str = ""  # the engine's own flag bounding its drain after SIGTERM ("" none)
    ready_log: str = ""
    metrics: tuple[str, ...] = ()
    rust_toolchain: str = ""  # a Rust toolchain the build needs (when no fetch plan supplies one)
    fetch_plan: bool = False  # CMake downloads sources at configure time: fetch them in their own stage
    patches: tuple[tuple[tuple[str, str], ...], ...] = ()  # literal source edits, each a sorted (key, value) tuple
    source_remove: tuple[str, ...] = ()  # paths of the source tree the build leaves out
    source_version: str = ""  # the file (under source_subdir) whose version the source stage holds to the pinned one
    resolve_as_of: str = ""  # first resolves take only files uploaded before this UTC time ("": no limit)
    resolve_as_of_exempt: tuple[str, ...] = ()  # exact pins taken although uploaded later
    setuptools_scm: bool = False  # version from git: the build pretends the pinned version
    git_submodules: tuple[str, ...] = ()
    companion_versions: tuple[tuple[str, str], ...] = ()  # companions its metadata does not pin
    install_extras: tuple[str, ...] = ()
    serve_modules: tuple[str, ...] = ()
    stray_files: tuple[str, ...] = ()  # site-packages files dependencies ship by mistake: removed after install
    # site-packages directories of per-arch sources (JIT sources read only when compiling for that arch): the files
    # and directories named for a GPU generation newer than the cell's are removed after install
    arch_sources: tuple[str, ...] = ()
    runtime_jit: bool = False
    runtime_checks: tuple[str, ...] = ()
    serve_jit: tuple[str, ...] = ()  # what it compiles at its first request (the knowledge's serve_jit table)
    # the JIT modules it builds at its first requests: (module, archs, selected_by, not_built) per entry
    jit_modules: tuple[tuple[str, tuple[int, ...], str, str], ...] = ()
    jit_paths: tuple[tuple[str, str, str], ...] = ()  # (path, covered_by, not_covered): every JIT path, covered or why not
    compile_caches: tuple[str, ...] = ()  # the compile caches it fills at its first boot (the knowledge's compile_caches)
    warm_allowance: tuple[tuple[str, str], ...] = ()  # (glob, why): what a boot from a warm layer may still write
    fetch_overrides: tuple[tuple[str, str], ...] = ()
    builds_extra_sass: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (min_cuda, SASS names), complete sets
    arch_scoped: tuple[archs_mod.ArchScope, ...] = ()  # binaries for some arch families only, by design
    holds: tuple[str, ...] = ()  # kinds of binaries in its wheel ("CUDA kernels", "Rust", "C++ against torch", ...)
    bound_to: tuple[str, ...] = ()  # what those binaries only load with ("torch", "CUDA", "CPython ABI3")
    arch_select: str = ""  # "gencode-filter": builder's nvcc launcher selects the archs per CMake target
    binaries: tuple[Binary, ...] = ()
    binaries_cuda: str = ""
    binary_switches: tuple[BinarySwitch, ...] = ()  # options that build one arch-scoped binary at all
    cmake_archs: CMakeArchs | None = None  # the engine's CMake filters the requested archs itself (vLLM)
    smoke: dict = field(default_factory=dict, compare=False, hash=False)  # see schema.SMOKE
    strategies: dict[str, Strategy] = field(default_factory=dict, compare=False, hash=False)

    # -- archs -------------------------------------------------------------------------------------------
    def subdir_at(self, tag: str) -> str:
        """source_subdir of a git source at `tag`: tag_subdirs' entry for it, else source_subdir."""
        return dict(self.tag_subdirs).get(tag, self.source_subdir)

    def effective_archs(self, archs: tuple[int, ...], cuda: str = "") -> tuple[int, ...]:
        """The archs the engine's own CMake keeps of the requested ones (cmake_archs; vLLM 0.33.0 with nvcc 13.0:
        10.3 → 10.0, 12.1 → 12.0), the requested ones where it has no such filter. The knobs are given these: the
        build gets the list its CMake would compute anyway, so that two requests that compile the same binaries
        (--arch 100 and 100,103) are one build, one cache key (builder/plan.py key_inputs)."""
        if self.cmake_archs is None or not self.compiled:
            return archs
        return self.cmake_archs.kept(archs, cuda)

    def knob_values(self, archs: tuple[int, ...], cuda: str = "") -> tuple[tuple[str, str], ...]:
        """Every switch --arch sets: the arch knobs (given the archs the engine's CMake keeps), then each binary
        switch passed OFF for these archs."""
        kept = self.effective_archs(archs, cuda)
        return tuple((k.name, k.value(kept)) for k in self.arch_knobs) + \
            tuple((s.cmake, "OFF") for s in self.switched_off(archs))

    def cmake_defines(self, archs: tuple[int, ...], cuda: str = "") -> list[tuple[str, str]]:
        """The CMake defines (-D / -Ccmake.define) --arch gives the build: knobs spelled as CMake defines, and
        the binary switches passed OFF."""
        kept = self.effective_archs(archs, cuda)
        return [(k.cmake, k.value(kept)) for k in self.arch_knobs if k.cmake] + \
            [(s.cmake, "OFF") for s in self.switched_off(archs)]

    def switched_off(self, archs: tuple[int, ...]) -> tuple[BinarySwitch, ...]:
        """The binary switches whose binary no requested GPU loads (engine data arch_scoped): passed OFF."""
        scopes = {s.files: s for s in self.arch_scoped}
        return tuple(s for s in self.binary_switches if archs and not any(scopes[s.files].covers(a) for a in archs))

    def built_archs(self, archs: tuple[int, ...], cuda: str = "") -> tuple[int, ...]:
        """The SASS archs the build will really emit for the requested archs."""
        if not self.compiled:
            return ()
        archs = self.effective_archs(archs, cuda)
        if not self.builds_always:
            for knob in self.arch_knobs:
                archs = knob.archs_for(archs)
            return tuple(sorted(archs))
        out = set(self.builds_always)
        if any(k.format == "switch-below" and k.value(archs) == "ON" for k in self.arch_knobs):
            out |= set(self.builds_switch)
        return tuple(sorted(out))

    def describe_binaries(self, torch: str, cuda: str, python: str) -> str:
        """"Rust, C++ against torch; bound to torch 2.14.1, CPython 3.12" (plan, labels, the audit step)."""
        holds = ", ".join(self.holds) or ("CUDA kernels" if self.compiled else "pure Python")
        spelled = []
        for b in self.bound_to:
            if b == "torch" and torch:
                spelled.append(f"torch {torch}")
            elif b == "CUDA" and cuda:
                spelled.append(f"CUDA {'.'.join(cuda.split('.')[:2])}")
            elif b.startswith("CPython") and "ABI3" not in b and python:
                spelled.append(f"CPython {python}")
            else:
                spelled.append(b)
        return holds + (f"; bound to {', '.join(spelled)}" if spelled else "")

    def scope_of(self, b: Binary) -> archs_mod.ArchScope | None:
        return next((s for s in self.arch_scoped if s.files == b.files), None)

    def gencode_filter(self, archs: tuple[int, ...]) -> dict:
        """The gencode filter's configuration for these archs (builder/gencode_filter.py), {} without one."""
        if self.arch_select != "gencode-filter":
            return {}
        targets = {}
        for b in self.binaries:
            scope = self.scope_of(b)
            if scope is not None:
                targets[b.target] = {"all_but": list(scope.all_but)} if scope.all_but else {"archs": list(scope.archs)}
        return {"archs": sorted(archs), "targets": dict(sorted(targets.items())), "log_dir": "/tmp/gencode-filter"}

    def binary_plans(self, archs: tuple[int, ...], cuda: str) -> tuple[BinaryPlan, ...]:
        """Per binary, the SASS a build for `archs` makes (the gencode filter's own rule applied to what upstream
        builds), where the engine data knows the release's binaries for this CUDA; () elsewhere."""
        from . import gencode_filter

        if not self.binaries or not cuda or ".".join(cuda.split(".")[:2]) != self.binaries_cuda:
            return ()
        if self.cmake_archs is not None:
            return self._cmake_binary_plans(archs, cuda)
        config = self.gencode_filter(archs)
        off = {s.files: s.cmake for s in self.switched_off(archs)}
        # with the below-sm_90 switch OFF the CMake writes no sm_8x entry at all: the filter's fallback (a target
        # no requested GPU loads keeps its first entry) picks from what is left
        below = [k for k in self.arch_knobs if k.format == "switch-below"]
        switched_off = bool(below) and all(k.value(archs) == "OFF" for k in below)
        out = []
        for b in self.binaries:
            if b.files in off:  # its CMake option is passed OFF: the target is not built at all
                out.append(BinaryPlan(b, (), switched_off=off[b.files]))
                continue
            listed = tuple(c for c in b.sass if not (switched_off and int(re.sub(r"\D", "", c)) < below[0].threshold)) \
                if switched_off else b.sass
            if not config:
                out.append(BinaryPlan(b, listed))
                continue
            scope = config["targets"].get(b.target)
            kept = tuple(c for c in listed if gencode_filter.keep(c, archs, scope)) or listed[:1]
            out.append(BinaryPlan(b, kept))
        return tuple(out)

    def _cmake_binary_plans(self, archs: tuple[int, ...], cuda: str) -> tuple[BinaryPlan, ...]:
        """Per binary, what the engine's CMake compiles for `archs`: each of the target's lists intersected (the
        recipe's cmake_archs rule) with the archs the CMake keeps; a target none of whose lists selects anything
        makes no file (vLLM: "... will not compile", an empty custom target), so it has no plan."""
        kept = archs_mod.cmake_spelled(self.effective_archs(archs, cuda))
        out = []
        for b in self.binaries:
            results = [tuple(kept) if lst == ("CUDA_ARCHS",) else tuple(self.cmake_archs.intersect(lst, kept))
                       for lst in b.cmake_archs]
            selecting = tuple(r for r in results if r)
            chosen = selecting[:1] if b.pick == "first" else selecting
            codes = dict.fromkeys(c for r in chosen for entry in r for c in archs_mod.cmake_codes(entry))
            if not codes:
                continue
            sass = tuple(sorted((c for c in codes if c.startswith("sm_")), key=_code_order))
            ptx = tuple(sorted((c for c in codes if c.startswith("compute_")), key=_code_order))
            out.append(BinaryPlan(b, sass, ptx=ptx, candidates=selecting if b.pick == "first" else ()))
        return tuple(out)

    def arch_scopes(self, archs: tuple[int, ...], cuda: str) -> tuple[archs_mod.ArchScope, ...]:
        """arch_scoped as a build for `archs` makes the binaries: a target that compiles one of its lists only
        (pick = "first": qutlass.cmake builds sm_100f when 10.x and 12.x are both asked) is asked only for the GPUs
        the chosen list's code runs on, so the audit expects exactly what the build makes. The build's audit and the
        cache manifest use these; the static entries elsewhere."""
        narrowed = {}
        for bp in self.binary_plans(archs, cuda):
            scope = self.scope_of(bp.binary)
            if bp.binary.pick != "first" or scope is None or scope.all_but:
                continue
            codes = [_code_parts(c) for c in bp.sass + bp.ptx]
            runs = tuple(g for g in scope.archs if any(archs_mod.runs_on(k, a, v, g) for k, a, v in codes))
            if runs != scope.archs:
                narrowed[scope.files] = archs_mod.ArchScope(
                    scope.files, runs, f"{scope.why}; this build compiles {', '.join(bp.sass)} only")
        return tuple(narrowed.get(s.files, s) for s in self.arch_scoped)

    def binary_notes(self, archs: tuple[int, ...], cuda: str) -> list[str]:
        """What plan says of a target that compiled one of its lists only (and which GPUs get no code from it)."""
        out = []
        for bp in self.binary_plans(archs, cuda):
            if not bp.chose_one:
                continue
            scope = self.scope_of(bp.binary)
            name = scope.why.split(" (")[0] if scope else bp.binary.target
            families = " and ".join(f"{_major_of(r[0])}.x" for r in bp.candidates)
            source = bp.binary.source.split(":")[0].rsplit("/", 1)[-1] or "its CMake"
            out.append(f"{name}: built for {', '.join(bp.sass)} only ({families} both asked; {source} picks one family)")
        return out

    def built_sass(self, archs: tuple[int, ...], cuda: str) -> tuple[str, ...]:
        """Every SASS name the build emits with this CUDA: the selected archs plus what the package builds
        regardless of them (builds_extra_sass), e.g. sm_90a and the Blackwell code of sglang-kernel — or, where
        the engine data lists the release's binaries as upstream built them, the union of what each keeps. Where
        the engine's CMake selects the archs itself (cmake_archs, vLLM), the archs it keeps for its general kernels
        (CUDA_ARCHS: 10.3 → sm_100): the data lists only some of its targets, whose code plan shows per binary."""
        per_binary = self.binary_plans(archs, cuda)
        if per_binary and self.cmake_archs is None:
            return tuple(sorted({s for bp in per_binary for s in bp.sass}, key=_code_order))
        names = {archs_mod.sm(a) for a in self.built_archs(archs, cuda)}
        if self.compiled and cuda:
            fits = [(Version(m), s) for m, s in self.builds_extra_sass if Version(cuda) >= Version(m)]
            if fits:
                names |= set(max(fits)[1])
        return tuple(sorted(names, key=lambda n: (int(re.sub(r"\D", "", n)), n)))

    def predicted_audit(self, archs: tuple[int, ...], cuda: str):
        """The audit's verdict (builder/audit.py, the same coverage rules and arch scopes) on the binaries a build for
        `archs` makes, as binary_plans predicts them; None where the engine data does not know the release's
        binaries for this CUDA. Plan refuses what this fails, so the build's audit and the gencode filter agree."""
        from .audit import audit_recorded

        plans = self.binary_plans(archs, cuda)
        if not plans:
            return None
        recorded = {_recorded_path(bp.binary): list(bp.sass + bp.ptx) for bp in plans if not bp.switched_off}
        return audit_recorded(f"{self.name}-{self.version}", recorded, list(archs), self.arch_scopes(archs, cuda))

    def arch_problems(self, archs: tuple[int, ...], cuda: str = "") -> list[str]:
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
            for a in archs:  # an arch a recognised one's SASS serves is given that one (ArchKnob.archs_for)
                if a not in knob.accepted and archs_mod.sass_substitute(a, knob.accepted) is None:
                    problems.append(
                        f"{self.name} {self.version}: {knob.name} only recognises "
                        f"{', '.join(map(str, knob.accepted))}, and no SASS of those runs on "
                        f"{archs_mod.dotted(a)}; {a} would be silently dropped"
                    )
        if self.cmake_archs is not None and (supported := self.cmake_archs.supported_for(cuda)) is not None:
            for a in archs:
                if not self.cmake_archs.intersect(supported, [archs_mod.dotted(a)]):
                    problems.append(
                        f"{self.name} {self.version}: its CMake keeps no arch for {archs_mod.dotted(a)} with CUDA "
                        f"{cuda} (supported: {';'.join(supported)}); {a} would be silently dropped")
        predicted = self.predicted_audit(archs, cuda)
        if predicted is not None:  # per binary, what the gencode filter / the engine's CMake keeps, asked where it loads
            upstream = {_recorded_path(b): b for b in self.binaries}
            scopes = self.arch_scopes(archs, cuda)
            for failed in predicted.failures:
                b = upstream[failed.path.rsplit("!", 1)[1]]
                scope = archs_mod.scope_for(_recorded_path(b), scopes)
                built = (f"compiles {', '.join(failed.names('sass') + failed.names('ptx'))} for these archs "
                         f"({b.source})" if b.cmake_archs else f"is built upstream for {', '.join(b.sass)}")
                problems.append(
                    f"{self.name} {self.version} on CUDA {self.binaries_cuda}: {b.files.rstrip('*')} "
                    f"(loaded on {scope.spelled if scope else 'every GPU'}) {built}, none of which runs on "
                    f"{', '.join(map(archs_mod.sm, failed.missing))}"
                )
            return problems
        if self.builds_always:
            built = self.built_sass(archs, cuda)
            for a in archs:
                if a >= self.min_arch and not any(archs_mod.runs_on("sass", int(re.sub(r"\D", "", n)), n[-1] if n[-1] in "af" else "", a)
                                                  for n in built):
                    problems.append(
                        f"{self.name} {self.version} hard-codes its archs ({', '.join(built)}); "
                        f"{archs_mod.sm(a)} cannot be selected"
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
            return f"{self.name} has no strategy {redact.describe(name)}{did_you_mean(name, self.strategies)}"
        s = self.strategies[name]
        if Version(self.version) not in s.versions:
            return f"{name} cannot run on {self.name} {self.version}: {s.why_not}; versions that can: {self.name}{s.versions}"
        return None


def _jit_module_uses(table: dict) -> tuple[tuple[str, tuple[int, ...], str, str], ...]:
    return tuple((e["module"], tuple(e["archs"]), e["selected_by"], e.get("not_built", ""))
                 for e in table.get("jit_modules", ()))


def _code_order(name: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", name)), name


def _code_parts(name: str) -> tuple[str, int, str]:
    """"sm_100f" → ("sass", 100, "f"); "compute_80" → ("ptx", 80, "")."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", name)
    return ("sass" if m.group(1) == "sm" else "ptx"), int(m.group(2)), m.group(3)


def _major_of(cmake_arch: str) -> str:
    return cmake_arch.split(".", 1)[0]


def _recorded_path(b: Binary) -> str:
    """A path inside the wheel that a binary's glob (and so its arch scope) matches: what the audit is handed."""
    return b.files.replace("*", ".so")


def _read_toml(path) -> dict:
    return files.load_toml(Path(path), "engine knowledge file")


class Knowledge:
    """The built-in engine data, plus any extra files a matrix names (an in-house package, a test fixture)."""

    def __init__(self, data: dict, origin: dict[str, str]):
        """`data`: the merged, checked files (see load_knowledge); `origin`: the file each package came from."""
        self.data = data
        self.origin = origin
        self._recipes: dict[tuple[str, str], Recipe] = {}

    def engine_names(self) -> list[str]:
        return [n for n, p in self.data["packages"].items() if p["kind"] == "engine"]

    def strategy_names(self) -> tuple[str, ...]:
        """Every strategy some engine of the data defines, in file order: the names matrix.toml, smoke, serve
        and bench accept (a strategy added to the data needs no code change)."""
        return tuple(dict.fromkeys(s for p in self.data["packages"].values() for s in p.get("strategies", {})))

    def known_cuda(self) -> list[str]:
        return list(self.data["cuda"])

    def index_wheel(self, sha256: str) -> dict | None:
        """What the data knows of a published wheel's device code (index_wheels), by its sha256, or None."""
        return self.data.get("index_wheels", {}).get(sha256)

    def base_gcc(self, os_tag: str) -> str:
        """The GCC version of the base OS's devel image, "" where the data does not know that OS."""
        return self.data.get("base_os", {}).get(os_tag, {}).get("gcc", "")

    def cuda_archs(self, cuda: str) -> tuple[int, ...]:
        """The archs nvcc of this CUDA version can target (by major.minor)."""
        mm = ".".join(cuda.split(".")[:2])
        table = self.data["cuda"]
        if mm not in table:
            raise UserError(f"CUDA {cuda}: unknown to this toolkit; known: {', '.join(table)}")
        return tuple(table[mm]["archs"])

    def nvcc_append_flags(self, cuda: str) -> tuple[str, ...]:
        """Flags every nvcc call of a build gets (NVCC_APPEND_FLAGS) with this CUDA: what makes its objects
        reproducible."""
        mm = ".".join(cuda.split(".")[:2])
        return tuple(self.data["cuda"].get(mm, {}).get("nvcc_append_flags", ()))

    def runtime_jit(self, cuda: str) -> dict | None:
        """What a runtime image needs to compile kernels at run time with this CUDA (None: nothing known)."""
        mm = ".".join(cuda.split(".")[:2])
        return self.data["cuda"].get(mm, {}).get("runtime_jit")

    def serve_jit(self, name: str, python: str) -> dict:
        """One serve-time compile path of the knowledge, its apt packages spelt for this Python."""
        table = self.data.get("serve_jit", {})
        if name not in table:
            raise UserError(f"serve_jit {redact.describe(name)} is named by an engine rule and defined nowhere in the engine "
                            f"knowledge{did_you_mean(name, table)}; known: {', '.join(table) or 'none'}")
        entry = dict(table[name])
        return {"name": name, "why": entry["why"], "probe": entry["probe"],
                "apt": [a.replace("{python}", python) for a in entry.get("apt", ())],
                "libcuda_stub": entry.get("libcuda_stub", False), "needs_runtime_jit": entry.get("needs_runtime_jit", False)}

    def jit_module(self, name: str) -> dict:
        """One JIT module of the knowledge with its framework's settings; its links include the framework's."""
        modules, frameworks = self.data.get("jit_modules", {}), self.data.get("jit_frameworks", {})
        if name not in modules:
            raise UserError(f"jit_modules {redact.describe(name)} is named by an engine rule and defined nowhere in the engine "
                            f"knowledge{did_you_mean(name, modules)}; known: {', '.join(modules) or 'none'}")
        entry = modules[name]
        fw = entry["framework"]
        if fw not in frameworks:
            raise UserError(f"jit_modules.{name}.framework: {fw!r} is defined nowhere in the engine knowledge "
                            f"(jit_frameworks){did_you_mean(fw, frameworks)}; known: {', '.join(frameworks) or 'none'}")
        frame = frameworks[fw]
        return {"name": name, "framework": fw, "generator": entry["generator"], "kwargs": dict(entry.get("kwargs", {})),
                "objects": dict(entry.get("objects", {})), "downloads": entry.get("downloads", ""),
                "defined_in": entry["defined_in"], "links": list(dict.fromkeys([*frame["links"], *entry["links"]])),
                "arch_env": frame.get("arch_env", ""), "arch_context": frame.get("arch_context", ""),
                "arch_scope": frame.get("arch_scope", "device"), "answer_gpu": list(frame.get("answer_gpu", ())),
                "cache_env": frame["cache_env"], "cache_dir": f"{self.jit_cache_root()}/{frame['cache_subdir']}",
                "build": frame.get("build", "")}

    def compile_caches_of(self, recipe: "Recipe") -> tuple[tuple[str, str], ...]:
        """(variable, directory) of every compile cache the release fills (its rules' compile_caches), each under the
        image's one root (jit_cache_root/<subdir>). A cache whose variable is also a JIT framework's cache variable
        must name the same directory (a prebuilt module is then found where the engine looks)."""
        table, frameworks = self.data.get("compile_caches", {}), self.data.get("jit_frameworks", {})
        out: dict[str, str] = {}
        for name in recipe.compile_caches:
            if name not in table:
                raise UserError(f"compile_caches {redact.describe(name)} is named by {recipe.name} {recipe.version}'s rules and defined "
                                f"nowhere in the engine knowledge{did_you_mean(name, table)}; known: "
                                f"{', '.join(table) or 'none'}")
            entry = table[name]
            for fw, frame in frameworks.items():
                if frame["cache_env"] == entry["env"] and frame["cache_subdir"] != entry["subdir"]:
                    raise UserError(f"compile_caches.{name}: {entry['env']} is jit_frameworks.{fw}'s cache variable too, "
                                    f"under {frame['cache_subdir']!r}, not {entry['subdir']!r}: one directory per variable")
            out[entry["env"]] = f"{self.jit_cache_root()}/{entry['subdir']}"
        return tuple(out.items())

    def cache_root_of(self, recipe: "Recipe") -> str:
        """A release's cache root, the one directory its compile caches go under in its image (a cell's cache_root,
        whether resolved from the matrix or read from an image's labels): jit_cache_root when its rules name compile
        caches, "" when they name none."""
        return self.jit_cache_root() if recipe.compile_caches else ""

    def jit_cache_root(self) -> str:
        """The image's one directory for the JIT caches of prebuilt modules (jit_cache_root)."""
        root = self.data.get("jit_cache_root")
        if not root:
            raise UserError("the engine knowledge names JIT modules but no jit_cache_root (the image's JIT cache directory)")
        return root

    def jit_modules_of(self, recipe: "Recipe", strategies: tuple[str, ...] = ()) -> tuple[dict, ...]:
        """The JIT modules a release builds at its first requests (its rules' jit_modules) and those the cell's
        strategies add (a strategy's jit_modules: DFlash2's top-k), each with its framework's settings; `strategy`
        names the strategy that selects it ("" for the release's own)."""
        uses = [(use, "") for use in recipe.jit_modules]
        for s in strategies:
            if s in recipe.strategies and not recipe.strategy_problem(s):
                uses += [(use[:4], s) for use in recipe.strategies[s].jit_modules
                         if Version(recipe.version) in SpecifierSet(use[4])]
        out: dict[str, dict] = {}
        for (name, mod_archs, selected_by, not_built), strategy in uses:
            if name in out:  # several strategies (or the release and a strategy) select it: one build
                out[name]["strategy"] = ", ".join(x for x in (out[name]["strategy"], strategy) if x)
                continue
            out[name] = {**self.jit_module(name), "archs": list(mod_archs), "selected_by": selected_by,
                         "not_built": not_built, "strategy": strategy}
        return tuple(out.values())

    def build_tools(self) -> tuple[str, ...]:
        tools = self.data["build_tools"]
        return (*tools["pip"], tools["cmake"])

    def recipe_pypi(self, name: str) -> str:
        """The PyPI project name of a package (same for every version)."""
        return self._package(name)["pypi"]

    def _package(self, name: str) -> dict:
        pkgs = self.data["packages"]
        if name not in pkgs:
            raise UserError(f"unknown package {redact.describe(name)}{did_you_mean(name, pkgs)}; known: {', '.join(pkgs)}")
        return pkgs[name]

    def recipe(self, name: str, version: str) -> Recipe:
        key = (name, version)
        if key not in self._recipes:
            self._recipes[key] = _make_recipe(name, self._package(name), version, self.origin[name])
        return self._recipes[key]


@cache
def _builtin_checked(known: tuple[str, ...]) -> dict:
    """The built-in engines.toml, checked against its shape given every package name the files know (a process
    that loads several knowledge files, as the tests do, parses and checks it once per set of names)."""
    data = tomllib.loads(resources.files("builder").joinpath("data/engines.toml").read_text())
    schema.check("engines.toml", data, schema.BUILT_IN, known)
    return data


@cache
def load_knowledge(extra: tuple[str, ...] = ()) -> Knowledge:
    builtin = files.package_data("engines.toml")  # parsed once; only its package names are read here
    files_ = [("engines.toml", builtin, schema.BUILT_IN), *((path, _read_toml(path), schema.EXTRA) for path in extra)]
    # torch_pin = "via:<package>" and companions may name a package of any of the files
    names = [n for _, data, _ in files_ if isinstance(data.get("packages"), dict) for n in data["packages"]]
    known = tuple(dict.fromkeys(names))
    files_[0] = ("engines.toml", copy.deepcopy(_builtin_checked(known)), schema.BUILT_IN)
    merged: dict[str, dict] = {"packages": {}, "cuda": {}, "build_tools": {}, "serve_jit": {}, "base_os": {},
                               "index_wheels": {}, "jit_frameworks": {}, "jit_modules": {}, "compile_caches": {}}
    origin: dict[str, str] = {}
    root = ""
    warm_keys: dict[str, list] = {"keys": [], "flags": []}  # an extra file's own (builder/data/warmkeys.toml's shape)
    for file, data, shape in files_:
        if shape is not schema.BUILT_IN:  # the built-in file was checked by _builtin_checked
            schema.check(file, data, shape, known)
        for section in warm_keys:
            warm_keys[section] += data.get("warm_keys", {}).get(section, [])
        for section, table in merged.items():
            table.update(data.get(section, {}))
        root = data.get("jit_cache_root", root)
        origin.update(dict.fromkeys(data.get("packages", {}), file))
    merged["jit_cache_root"] = root  # type: ignore[assignment]  # one value, not a section
    merged["warm_keys"] = warm_keys
    return Knowledge(merged, origin)


def parse_version(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UserError(f"{what}: {redact.describe(text)} is not a version") from None


def recipe(name: str, version: str) -> Recipe:
    """A recipe from the built-in knowledge."""
    return load_knowledge().recipe(name, version)


def _binary_switches(name: str, merged: dict, file: str) -> tuple[BinarySwitch, ...]:
    """The merged rules' binary_switches, each tied to the arch_scoped entry that says which GPUs load its binary."""
    scoped = {e["files"] for e in merged.get("arch_scoped", ())}
    out = []
    for e in merged.get("binary_switches", ()):
        if e["files"] not in scoped:
            raise UserError(f"{file}: packages.{name}: binary_switches entry {e['cmake']} names {e['files']!r}, which "
                            "no arch_scoped entry of the same version names (that entry says which GPUs load it)")
        out.append(BinarySwitch(e["files"], e["cmake"], e["why"]))
    return tuple(out)


def _merged_rules(name: str, pkg: dict, version: str, file: str) -> dict:
    """The package's rules that match `version`, merged in order (a later rule's keys win; smoke key by key)."""
    v = parse_version(version, name)
    merged: dict = {}
    matched = False
    for rule in pkg["rules"]:
        if v in SpecifierSet(rule["versions"]):  # ranges were checked when the knowledge was loaded
            matched = True
            merged.update({k: val for k, val in rule.items() if k not in ("versions", "smoke")})
            merged["smoke"] = {**merged.get("smoke", {}), **rule.get("smoke", {})}  # key by key
    if not matched:
        ranges = " | ".join(r["versions"] for r in pkg["rules"])
        raise UserError(f"{name} {version}: no engine knowledge for this version (known ranges: {ranges})")
    if "source" not in merged:  # each rule may leave it out, so only the merged rules can miss it
        raise UserError(f"{file}: packages.{name}.rules: no rule for version {version} sets 'source' "
                        f"(expected {schema.RULE.optional['source'].noun})")
    return merged


def _arch_knobs(merged: dict) -> tuple[ArchKnob, ...]:
    return tuple(ArchKnob(format=k["format"], env=k.get("env"), cmake=k.get("cmake"),
                          accepted=tuple(k["accepted"]) if "accepted" in k else None, threshold=k.get("threshold"))
                 for k in merged.get("arch_knobs", []))


def _strategies(pkg: dict) -> dict[str, Strategy]:
    return {
        sname: Strategy(sname, SpecifierSet(s["versions"]), s["why_not"], tuple(s["flags"]),
                        env=tuple(sorted(s.get("env", {}).items())), forbid_log=tuple(s.get("forbid_log", ())),
                        expect=tuple(s.get("expect", {}).items()), k=s.get("k", 0), drafter=s.get("drafter", ""),
                        cold_boot_s=s.get("cold_boot_s", 0),
                        jit_modules=tuple((*use, e.get("versions", "")) for use, e in zip(_jit_module_uses(s),
                                                                                       s.get("jit_modules", ()))))
        for sname, s in pkg.get("strategies", {}).items()
    }


def _make_recipe(name: str, pkg: dict, version: str, file: str) -> Recipe:
    """The Recipe of one version, from a package that load_knowledge checked against the schema."""
    merged = _merged_rules(name, pkg, version, file)
    builds = merged.get("builds_archs", {})
    return Recipe(
        name=name,
        version=version,
        pypi=pkg["pypi"],
        kind=pkg["kind"],
        template=pkg["template"],
        torch_pin=merged.get("torch_pin", pkg["torch_pin"]),
        mem_gb_per_nvcc_thread=float(pkg["mem_gb_per_nvcc_thread"]),  # the schema accepts an integer too
        compiled=pkg.get("compiled", True),
        parallelism=pkg.get("parallelism", "jobs-x-threads"),
        source=merged["source"],
        source_subdir=merged.get("source_subdir", "."),
        tag_subdirs=tuple(sorted(merged.get("tag_subdirs", {}).items())),
        git_repository=merged.get("git_repository", ""),
        git_tag=merged.get("git_tag", "").replace("{version}", version),
        min_cuda=merged.get("min_cuda", "0"),
        min_arch=merged.get("min_arch", 0),
        min_cmake=merged.get("min_cmake", ""),
        min_gcc=merged.get("min_gcc", ""),
        build_requirements=tuple(merged.get("build_requirements", ())),
        build_requirements_list=tuple(merged.get("build_requirements_list", ())),
        build_command=merged.get("build_command", ""),
        build_env=tuple(sorted(merged.get("build_env", {}).items())),
        arch_knobs=_arch_knobs(merged),
        builds_always=tuple(builds.get("always", ())),
        builds_switch=tuple(builds.get("switch", ())),
        compile_threads_define=merged.get("compile_threads_define", ""),
        pin_extras=tuple(merged.get("pin_extras", ())),
        companions=tuple(merged.get("companions", ())),
        launch=tuple(merged.get("launch", ())),
        health=merged.get("health", ""),
        tp_flag=merged.get("tp_flag", ""),
        ready_path=merged.get("ready_path", ""),
        health_wait_s=merged.get("health_wait_s", 0),
        shutdown_flag=merged.get("shutdown_flag", ""),
        ready_log=merged.get("ready_log", ""),
        metrics=tuple(merged.get("metrics", ())),
        rust_toolchain=merged.get("rust_toolchain", ""),
        fetch_plan=merged.get("fetch_plan", False),
        patches=tuple(tuple(sorted(pt.items())) for pt in merged.get("patches", [])),
        source_remove=tuple(merged.get("source_remove", ())),
        source_version=merged.get("source_version", ""),
        resolve_as_of=merged.get("resolve_as_of", ""),
        resolve_as_of_exempt=tuple(merged.get("resolve_as_of_exempt", ())),
        setuptools_scm=merged.get("setuptools_scm", False),
        git_submodules=tuple(merged.get("git_submodules", ())),
        companion_versions=tuple(sorted(merged.get("companion_versions", {}).items())),
        install_extras=tuple(merged.get("install_extras", ())),
        serve_modules=tuple(merged.get("serve_modules", ())),
        stray_files=tuple(merged.get("stray_files", ())),
        arch_sources=tuple(merged.get("arch_sources", ())),
        runtime_jit=merged.get("runtime_jit", False),
        runtime_checks=tuple(merged.get("runtime_checks", ())),
        serve_jit=tuple(merged.get("serve_jit", ())),
        jit_modules=_jit_module_uses(merged),
        jit_paths=tuple((e["path"], e.get("covered_by", ""), e.get("not_covered", "")) for e in merged.get("jit_paths", ())),
        compile_caches=tuple(merged.get("compile_caches", ())),
        warm_allowance=tuple((e["glob"], e["why"]) for e in merged.get("warm_allowance", ())),
        fetch_overrides=tuple(sorted(merged.get("fetch_overrides", {}).items())),
        builds_extra_sass=tuple((e["min_cuda"], tuple(e["sass"])) for e in merged.get("builds_extra_sass", ())),
        arch_scoped=tuple(archs_mod.ArchScope.from_json(e) for e in merged.get("arch_scoped", ())),
        holds=tuple(merged.get("holds", ())),
        bound_to=tuple(merged.get("bound_to", ())),
        arch_select=merged.get("arch_select", ""),
        binaries=tuple(Binary(b["files"], b["target"], tuple(b.get("sass", ())), b.get("units", 0),
                              tuple(tuple(lst) for lst in b.get("cmake_archs", ())), b.get("pick", "all"),
                              b.get("source", ""))
                       for b in merged.get("binaries", ())),
        binaries_cuda=merged.get("binaries_cuda", ""),
        binary_switches=_binary_switches(name, merged, file),
        cmake_archs=CMakeArchs(merged["cmake_archs"]["rule"],
                               tuple((e["min_cuda"], tuple(e["archs"])) for e in merged["cmake_archs"]["supported"]))
        if "cmake_archs" in merged else None,
        smoke=merged.get("smoke", {}),
        strategies=_strategies(pkg),
    )

