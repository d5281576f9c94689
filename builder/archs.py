"""GPU archs: the one copy of how they are written, checked, spelled for each build knob, and which compiled
code runs on which GPU. matrix, engines, render and audit all read archs through this module.

An arch is an int: compute capability major × 10 + minor (80 = 8.0 = sm_80, 120 = 12.0).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable

from . import gencode_filter as _gencode_filter
from .errors import UserError

# The arch-list spellings build systems understand (engine data names one per knob).
KNOB_FORMATS = ("torch", "cmake-real", "semicolon", "switch-below")


def sm(arch: int) -> str:
    return f"sm_{arch}"


def dotted(arch: int) -> str:
    major, minor = divmod(arch, 10)
    return f"{major}.{minor}"


def parse(text: str, where: str = "--arch") -> tuple[int, ...]:
    """'80,90' / '8.0,9.0' / 'sm_80,sm_90' / '80 90' → (80, 90), sorted and unique."""
    out = []
    for tok in text.replace(" ", ",").split(","):
        tok = tok.strip()
        if not tok:
            continue
        m = re.fullmatch(r"(?:sm_?)?(\d{2,3})|(\d+)\.(\d)", tok)
        if not m:
            raise UserError(f"{where}: {tok!r} is not an SM arch; write e.g. 80,90 (or 8.0,9.0)")
        out.append(int(m.group(1)) if m.group(1) else int(m.group(2)) * 10 + int(m.group(3)))
    if not out:
        raise UserError(f"{where}: no arch given; write e.g. --arch 80,90")
    return tuple(sorted(set(out)))


def from_list(value, where: str) -> tuple[int, ...]:
    """An arch list from a data file (`archs = [80, 90]`), checked; sorted and unique."""
    if not isinstance(value, list):
        raise UserError(f"{where}: expected list, got {type(value).__name__} {value!r}")
    for a in value:
        if not isinstance(a, int) or isinstance(a, bool) or not 30 <= a <= 200:
            raise UserError(f"{where}: {a!r} is not an SM arch number like 80 or 90")
    if not value:
        raise UserError(f"{where}: empty arch list")
    return tuple(sorted(set(value)))


def requested(archs: Iterable[int], where: str = "audit") -> tuple[int, ...]:
    """Archs handed over by code (audit's API): ints, at least one, order kept, duplicates dropped."""
    out: list[int] = []
    for a in archs:
        if isinstance(a, bool) or not isinstance(a, int) or a < 10:
            raise UserError(f"{where}: arch {a!r} is not a compute capability like 80 or 90")
        if a not in out:
            out.append(a)
    if not out:
        raise UserError(f"{where}: no arch to check")
    return tuple(out)


def spell(fmt: str, archs: tuple[int, ...], threshold: int | None = None) -> str:
    """The value of an arch knob in its build system's own spelling."""
    if fmt == "torch":  # TORCH_CUDA_ARCH_LIST="8.0 9.0"
        return " ".join(dotted(a) for a in archs)
    if fmt == "cmake-real":  # "80-real;90-real": SASS only, no PTX
        return ";".join(f"{a}-real" for a in archs)
    if fmt == "semicolon":  # FLASH_ATTN_CUDA_ARCHS="80;90"
        return ";".join(str(a) for a in archs)
    if fmt == "switch-below":  # ON when any requested arch is below the threshold (ENABLE_BELOW_SM90)
        return "ON" if any(a < (threshold or 0) for a in archs) else "OFF"
    raise ValueError(f"unknown knob format {fmt!r}; known: {', '.join(KNOB_FORMATS)}")


# Whether device code of a kind / arch / variant loads on a GPU: one rule, kept where the build stage's gencode
# filter (run alone in the image) can use it too.
runs_on = _gencode_filter.runs_on


def sass_substitute(gpu: int, candidates: Iterable[int]) -> int | None:
    """The highest of `candidates` whose plain SASS runs on `gpu` (ask for 80 when 86 is not selectable)."""
    fits = [c for c in candidates if runs_on("sass", c, "", gpu)]
    return max(fits) if fits else None


@dataclass(frozen=True)
class ArchScope:
    """Binaries a package builds for some arch families only and loads only on those GPUs, by design (vLLM's
    FlashAttention 3 is Hopper-only; sm_80 runs FlashAttention 2 from another library). The audit asks such a
    binary for the requested archs inside `archs` only; every other binary must cover every requested arch."""

    files: str  # a glob on the path inside the wheel / site-packages, e.g. "vllm/vllm_flash_attn/_vllm_fa3_C*"
    archs: tuple[int, ...]  # the GPUs that load it; empty with all_but: every GPU except those
    why: str
    # loaded on every GPU but these (sglang-kernel's sm100/common_ops: load_utils.py takes sm90/ on 9.0 only)
    all_but: tuple[int, ...] = ()

    def covers(self, arch: int) -> bool:
        """Whether a GPU of compute capability `arch` loads this binary."""
        return arch not in self.all_but if self.all_but else arch in self.archs

    @property
    def spelled(self) -> str:
        """'sm_90a, sm_100' / 'every GPU but sm_90' for reports."""
        if self.all_but:
            return "every GPU but " + ", ".join(map(sm, self.all_but))
        return ", ".join(map(sm, self.archs))

    def matches(self, path: str) -> bool:
        inner = path.rsplit("!", 1)[-1]  # "<wheel>!vllm/x.so" → "vllm/x.so"; image paths end with it
        return fnmatch.fnmatchcase(inner, self.files) or fnmatch.fnmatchcase(inner, "*/" + self.files)

    def to_json(self) -> dict:
        out = {"files": self.files, "archs": list(self.archs), "why": self.why}
        if self.all_but:
            out["all_but"] = list(self.all_but)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "ArchScope":
        """From the engine data's arch_scoped entries and the cache manifest's copy of them (to_json)."""
        return cls(data["files"], tuple(data.get("archs", ())), data["why"], tuple(data.get("all_but", ())))


def scope_for(path: str, scopes: Iterable[ArchScope]) -> ArchScope | None:
    return next((s for s in scopes if s.matches(path)), None)


# -- an engine's own CMake arch filter ------------------------------------------------------------------------
# Some engines filter the requested archs themselves, per CMake target, with lists in CMake's spelling
# ("9.0a", "10.0f", "8.0+PTX"). LOOSE_INTERSECTION names vLLM's rule (engine data `cmake_archs`); the code below is
# that function, step by step, so that plan predicts what its configure computes.
LOOSE_INTERSECTION = "cuda_archs_loose_intersection"


def _cmake_version(arch: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.sub(r"[af]$", "", arch).split("."))


def _major(arch: str) -> str:
    return arch.split(".", 1)[0]


def loose_intersection(src: Iterable[str], tgt: Iterable[str]) -> list[str]:
    """vLLM's `cuda_archs_loose_intersection(OUT SRC TGT)` (cmake/utils.cmake of vLLM 0.33.0, lines 400-501): the
    entries of a kernel's arch list `src` ("9.0a;10.0f;8.0+PTX") the build's target archs `tgt` ("10.0;12.0") select.

    1. an x.y[af] source whose x.y is a target is taken as written (10.0f for target 10.0);
    2. else x.ya / x.yf in the targets is taken; else an 'f' source takes the first target of its major
       ("12.0f" with target 12.1 gives "12.1");
    3. a target x.y[af] whose x.y is a plain source is taken as written;
    4. every remaining target takes the highest plain source not above it with its major (any major for a source
       written x.y+PTX), duplicates dropped; +PTX is put back on the sources that had it.
    """
    srcs = list(dict.fromkeys(src))
    ptx: list[str] = []
    for a in list(srcs):
        if a.endswith("+PTX"):
            base = a[: -len("+PTX")]
            ptx.append(base)
            srcs.remove(a)
            srcs.append(base)
    ptx = list(dict.fromkeys(ptx))
    srcs = list(dict.fromkeys(srcs))
    tgts = list(tgt)
    out: list[str] = []

    def drop(items: list[str], value: str) -> None:  # CMake's list(REMOVE_ITEM): every occurrence
        items[:] = [i for i in items if i != value]

    for a in list(srcs):
        if a[-1] in "af" and (base := a[:-1]) in tgts:
            drop(srcs, a)
            for t in (base, base + "a", base + "f"):
                drop(tgts, t)
            out.append(a)
    for a in list(srcs):
        if a[-1] not in "af":
            continue
        drop(srcs, a)
        base = a[:-1]
        if base + "a" in tgts:
            drop(tgts, base + "a")
            out.append(base + "a")
        elif base + "f" in tgts:
            drop(tgts, base + "f")
            out.append(base + "f")
        elif a.endswith("f"):
            for t in tgts:
                if _major(re.sub(r"[af]$", "", t)) == _major(base):
                    drop(tgts, t)
                    out.append(t)
                    break
    for t in list(tgts):
        if t[-1] in "af" and (base := t[:-1]) in srcs:
            drop(tgts, t)
            out.append(t)
            if base not in tgts:
                drop(srcs, base)
    srcs.sort(key=_cmake_version)
    for t in tgts:
        found = None
        for s in srcs:
            if _cmake_version(s) <= _cmake_version(t):
                if s in ptx or _major(s) == _major(t):
                    found = s
            else:
                break
        if found:
            out.append(found)
    out = list(dict.fromkeys(out))
    return [a + "+PTX" if a in ptx else a for a in out]


def cmake_spelled(archs: Iterable[int]) -> list[str]:
    """(100, 120) → ["10.0", "12.0"]: the target list vLLM's CMake extracts from torch's -gencode flags."""
    return [dotted(a) for a in archs]


def cmake_codes(arch: str) -> tuple[str, ...]:
    """The codes one CMake arch entry compiles (vLLM's set_gencode_flags_for_srcs, cmake/utils.cmake 328-368):
    "10.0f" → sm_100f, "8.0+PTX" → sm_80 and compute_80."""
    base = arch[: -len("+PTX")] if arch.endswith("+PTX") else arch
    name = base.replace(".", "")
    return (f"sm_{name}", f"compute_{name}") if arch.endswith("+PTX") else (f"sm_{name}",)


def newer_generations(archs: Iterable[int]) -> str:
    """An extended regular expression matching the SM numbers (2 or 3 digits, as file names spell them) of every GPU
    generation newer than the newest of `archs`: for 80,90 "10[0-9]|11[0-9]|...|19[0-9]". A GPU of such a
    generation runs none of the cell's device code (the audit's verdict), so files read only when compiling for it
    are never read."""
    newest = max(archs) // 10
    return "|".join(f"{major}[0-9]" for major in range(newest + 1, 20))
