#!/usr/bin/env python3
"""The arch selection of a build whose CMake hard-codes its gencode lists (sglang-kernel): a compiler launcher.

sglang-kernel's CMakeLists writes `-gencode=arch=compute_XX,code=sm_XX` lists per target and per CUDA version and
has no switch that takes the user's archs (only ENABLE_BELOW_SM90, on or off for sm_80/sm_89 together), so
`--arch 80,90` alone changes nothing it compiles. CMake runs every CUDA compile through
CMAKE_CUDA_COMPILER_LAUNCHER (the hook ccache uses); this launcher drops, per CMake target, the gencode entries
whose code loads on no requested GPU that loads that target's binary (the engine data's arch_scoped rules, e.g.
the sm90/ copy of common_ops only on 9.0), then runs the compiler with the rest. The audit afterwards checks
the result in the binaries, as for every package.

The same rule (`keep`) counts the kernel×arch units a build makes (plan, benchmarks). This file is also the
script the build stage runs (standard library only): `python3 gencode_filter.py COMPILER ARGS...`, configured by
the environment variable BUILDER_GENCODE_FILTER: {"archs": [80, 90], "targets": {"<target>": {"archs": [...]}
| {"all_but": [...]}}}.
"""

from __future__ import annotations

import json
import os
import re
import sys

ENV = "BUILDER_GENCODE_FILTER"
_GENCODE_FLAGS = ("-gencode", "--generate-code")
_CODE = re.compile(r"(sm|compute|lto)_(\d+)([af]?)")
_TARGET_DIR = re.compile(r"CMakeFiles/([^/]+)\.dir/")


def runs_on(kind: str, code_arch: int, variant: str, gpu: int) -> bool:
    """Whether device code of `kind` ("sass" | "ptx" | other) compiled for `code_arch` (with variant "", "a"
    or "f") loads on a GPU of compute capability `gpu` — the one copy of this rule (builder.archs.runs_on is
    this function; it lives here because the build stage runs this file alone).

    - arch-specific ('a', sm_90a): exactly that GPU, SASS and PTX alike;
    - SASS, and family-specific ('f') code: the same major, a minor at least as high
      (sm_80 runs on 8.6 and 8.9, not on 9.0; sm_100f runs on 10.0 and 10.3);
    - plain PTX JIT-compiles for any later GPU;
    - LTO IR and unknown kinds are not loadable as they are.
    """
    if variant == "a":
        return code_arch == gpu
    if kind == "sass" or variant == "f":
        return code_arch // 10 == gpu // 10 and code_arch % 10 <= gpu % 10
    if kind == "ptx":
        return code_arch <= gpu
    return False


def loads_on(scope: dict | None, gpu: int) -> bool:
    if not scope:
        return True
    if scope.get("all_but"):
        return gpu not in scope["all_but"]
    return gpu in scope.get("archs", ())


def keep(code: str, archs, scope: dict | None = None) -> bool:
    """Whether one code of a gencode entry ("sm_90a", "compute_80") serves a requested GPU that loads the binary."""
    m = _CODE.fullmatch(code.strip())
    if not m:
        return True  # not an arch this filter understands: left alone
    kind = {"sm": "sass", "compute": "ptx"}.get(m.group(1), "other")
    gpus = [a for a in archs if loads_on(scope, a)]
    return any(runs_on(kind, int(m.group(2)), m.group(3), g) for g in gpus)


def split_entry(value: str) -> tuple[str, list[str]] | None:
    """"arch=compute_90a,code=sm_90a" / "arch=compute_80,code=[sm_80,compute_80]" -> ("compute_90a", codes)."""
    m = re.fullmatch(r"arch=([^,]+),code=(?:\[([^\]]*)\]|(.+))", value)
    if not m:
        return None
    codes = (m.group(2) if m.group(2) is not None else m.group(3)).split(",")
    return m.group(1), [c for c in codes if c]


def filter_args(args: list[str], archs, scope: dict | None) -> tuple[list[str], list[str], list[str]]:
    """(new args, codes kept, codes dropped). A compile left with no entry keeps its first one, so the target
    still builds (a binary no requested GPU loads)."""
    out: list[str | tuple[str, list[str]]] = []  # plain arguments, or (arch, codes) of a gencode entry
    i = 0
    while i < len(args):
        a = args[i]
        value = None
        if a in _GENCODE_FLAGS and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        elif a.startswith(tuple(f + "=" for f in _GENCODE_FLAGS)):
            value = a.split("=", 1)[1]
        parsed = split_entry(value) if value is not None else None
        if parsed is not None:
            out.append(parsed)
        elif value is not None:  # a gencode spelling this filter does not read: passed through unchanged
            out += [a] if "=" in a else [a, value]
        else:
            out.append(a)
        i += 1
    entries = [e for e in out if isinstance(e, tuple)]
    kept = {id(e): [c for c in e[1] if keep(c, archs, scope)] for e in entries}
    if entries and not any(kept.values()):
        kept[id(entries[0])] = list(entries[0][1])
    codes_kept = [c for e in entries for c in kept[id(e)]]
    codes_dropped = [c for e in entries for c in e[1] if c not in kept[id(e)]]
    final = []
    for e in out:
        if isinstance(e, str):
            final.append(e)
        elif kept[id(e)]:
            codes = kept[id(e)]
            final.append(f"-gencode=arch={e[0]},code={codes[0]}" if len(codes) == 1
                         else f"-gencode=arch={e[0]},code=[{','.join(codes)}]")
    return final, codes_kept, codes_dropped


def target_of(args: list[str]) -> str:
    """The CMake target a compile belongs to, from its object path (CMakeFiles/<target>.dir/...)."""
    for i, a in enumerate(args):
        if a in ("-o", "--output-file") and i + 1 < len(args):
            m = _TARGET_DIR.search(args[i + 1])
            if m:
                return m.group(1)
    return ""


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: gencode_filter.py COMPILER [ARGS...]", file=sys.stderr)
        return 2
    config = json.loads(os.environ.get(ENV) or "{}")
    archs = [int(a) for a in config.get("archs", ())]
    if not archs:
        print(f"gencode filter: {ENV} names no archs; refusing to guess", file=sys.stderr)
        return 2
    target = target_of(argv[2:])
    scope = config.get("targets", {}).get(target)
    args, kept, dropped = filter_args(argv[2:], archs, scope)
    marker_dir = config.get("log_dir")
    if dropped and marker_dir and target:  # one line per target in the build log, not one per source file
        os.makedirs(marker_dir, exist_ok=True)
        marker = os.path.join(marker_dir, target)
        if not os.path.exists(marker):
            open(marker, "w").close()
            print(f"gencode filter: {target}: keeps {' '.join(sorted(set(kept)))}; drops {' '.join(sorted(set(dropped)))}",
                  file=sys.stderr)
    os.execvp(argv[1], [argv[1], *args])
    return 127  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv))
