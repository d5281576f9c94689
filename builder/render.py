"""render: a cell → its multi-stage Dockerfile. Pure and deterministic (golden-file tested)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from . import deps, gencode_filter, templates
from .image import launchline
from .image import labels as labels_mod
from . import archs as archs_mod
from .compile_cache import SCCACHE_VERSION
from .errors import UserError
from .resolve import Cell, Package

if TYPE_CHECKING:
    from .plan import CellPlan

def _sed_literal(text: str, replacement: bool = False) -> str:
    """Escape text for a literal match (or replacement) in `sed 's|...|...|g'`."""
    if "'" in text or "\n" in text:
        raise ValueError(f"a patch text cannot hold quotes or newlines: {text!r}")
    special = "\\&|" if replacement else "\\.*[]^$|"
    return "".join("\\" + c if c in special else c for c in text)


def scm_pretend_variable(dist: str) -> str:
    """setuptools-scm's per-distribution override of the version it would read from git."""
    return "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_" + re.sub(r"[-_.]+", "_", dist).upper()


def package_context(pkg: Package, torch: str = "") -> dict:
    r = pkg.recipe
    archs = r.effective_archs(pkg.archs, pkg.cuda)  # what the engine's own CMake keeps (vLLM: 10.3 → 10.0)
    env_knobs = [(k.env, k.value(archs)) for k in r.arch_knobs if k.env]
    cmake_defines = r.cmake_defines(pkg.archs, pkg.cuda)  # arch knobs, and binary switches passed OFF
    scm = [(scm_pretend_variable(r.pypi), r.version)] if r.setuptools_scm else []
    dep = deps.for_package(pkg)
    gencode = r.gencode_filter(pkg.archs) if not pkg.from_index else {}
    return {
        "name": r.name,
        "dist": r.pypi,
        "version": r.version,
        "template": r.template,
        "source": pkg.source,
        "submodules": list(r.git_submodules),
        "env": [(k, dockerfile_quoted(v, expand=True)) for k, v in env_knobs + list(r.build_env) + scm
                + ([("NVCC_APPEND_FLAGS", " ".join(pkg.nvcc_flags))] if pkg.nvcc_flags else [])],
        "cmake_defines": cmake_defines + (dep["cmake_defines"] if dep else []),
        "knobs": pkg.knobs,
        "built_archs": list(pkg.built_sass),
        "build_requirements": list(r.build_requirements),
        "build_requirements_list": list(r.build_requirements_list),
        "build_command": r.build_command,
        "compile_threads_define": r.compile_threads_define,
        "deps": dep,
        "rust_toolchain": r.rust_toolchain,
        "source_remove": list(r.source_remove),
        "source_version": r.source_version,
        # the nvcc launcher that selects the archs of a CMake with hard-coded gencode lists (sglang-kernel)
        "gencode_filter": dockerfile_quoted(json.dumps(gencode, sort_keys=True), expand=True) if gencode else "",
        "gencode_filter_lines": gencode_filter_script_lines() if gencode else [],
        "patches": [
            {**pt, "sed": f"s|{_sed_literal(pt['replace'])}|{_sed_literal(pt['with'], replacement=True)}|g"}
            for pt in r.patches_for(torch)
        ],
    }


def gencode_filter_script_lines() -> list[str]:
    """builder/gencode_filter.py, each line shell-quoted for a `printf '%s\\n'` RUN that writes it in the image."""
    return [shlex.quote(line) for line in Path(gencode_filter.__file__).read_text().splitlines()]


def entrypoint(cell: Cell) -> list[str]:
    """The launch command up to the model argument (the model is the container's CMD / args): launchline.split,
    the one derivation serve and smoke L3 use too."""
    return launchline.split(cell.engine_recipe.launch)[0]


def labels(cell: Cell, keys: dict[str, str]) -> list[tuple[str, str]]:
    """The image's io.builder.* labels as rendered (builder/image/labels.py writes them; audited ones read build args)."""
    return [(k, v) for k, v, _ in labels_mod.written(cell, keys)]


@functools.cache
def libcuda_stub_symbols() -> list[str]:
    """The functions NVIDIA's libcuda link stub defines (builder/data/libcuda-stub-symbols.txt, with its source)."""
    text = resources.files("builder").joinpath("data/libcuda-stub-symbols.txt").read_text()
    names = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
    if bad:
        raise RuntimeError(f"builder/data/libcuda-stub-symbols.txt: not C identifiers: {bad[:3]}")
    return names


def runtime_requirements(cell: Cell) -> list[str]:
    """Shell words for the runtime's pip install besides torch and the wheels.

    The engine's extras (the wheel alone lacks sglang[srt]'s server dependencies) are asked of the wheel
    file itself, `"<file>.whl[srt]"`: pip ignores an explicit file when `sglang[srt]` is asked by name and
    refuses the pair when both are given, so naming the file is the only form that installs the compiled
    wheel with its extras. Then the run-time JIT toolchain, if the engine needs one."""
    r = cell.engine_recipe
    out = []
    if r.install_extras:
        stem = re.sub(r"[-_.]+", "_", r.pypi).lower()
        out.append(f'"$(echo /wheels/{stem}-[0-9]*.whl)[{",".join(r.install_extras)}]"')
    return out + [f"'{req}'" for req in (cell.runtime_jit["pip"] if cell.runtime_jit else [])]


def prebuilt_builds(cell: Cell) -> dict:
    """jit = "prebuilt": per framework, its cache directory and the environment the image keeps (its cache variable;
    for a framework that names its cache after the arch set, its arch variable pinned to the cell's archs), then one
    build per module and arch (cell.jit_runs) through the module's own generator or loader, into that directory (what
    smoke's JIT layer builds, and then finds built). Afterwards the cache is readable and writable by any user."""
    if not cell.jit_prebuilt:
        return {}
    env, builds = {}, []
    for m in cell.jit_builds:
        env[m["cache_env"]] = m["cache_dir"]
        if m["arch_scope"] == "set" and m["arch_env"]:
            env[m["arch_env"]] = cell.jit_arch_set
        mod, _, fn = m["generator"].partition(":")
        for label, arch in cell.jit_runs(m):
            spec = {"module": mod, "function": fn, "kwargs": m["kwargs"], "objects": m["objects"], "build": m["build"],
                    "arch_env": m["arch_env"], "arch_context": m["arch_context"], "arch": arch,
                    "answer_gpu": m["answer_gpu"], "name": f"{m['name']}@{label}"}
            builds.append({"name": m["name"], "label": label, "spec": json.dumps(spec, sort_keys=True),
                           "arch_env_prefix": f'{m["arch_env"]}="{arch}"' if m["arch_env"] else ""})
    for b in builds:
        if "'" in b["spec"]:
            raise UserError(f"{cell.id}: the JIT module {b['name']}'s data holds a single quote, which the prebuild's "
                            "shell word cannot carry")
    return {"env": sorted(env.items()), "builds": builds,
            "roots": sorted({m["cache_dir"].rsplit("/", 1)[0] for m in cell.jit_builds}), "program": PREBUILD_PROGRAM}


# The prebuild of one module (its spec, JSON, in argv[1]), as smoke's probe builds it (probe.py cmd_jit_module): the
# functions named by answer_gpu answer True (no GPU at image-build time), object arguments are imported, the arch
# context (SGLang's override_jit_cuda_arch) is entered, then the generator or loader is called and, for a generator,
# its build method. One line, no single quote: it is a shell word of the RUN.
PREBUILD_PROGRAM = (
    'import contextlib, importlib, json, sys, time; s = json.loads(sys.argv[1]); t = time.monotonic(); '
    'get = lambda n, sep: getattr(importlib.import_module(n.rpartition(sep)[0]), n.rpartition(sep)[2]); '
    '[setattr(importlib.import_module(n.partition(":")[0]), n.partition(":")[2], lambda *a, **k: True) '
    'for n in s["answer_gpu"]]; '
    'kw = dict(s["kwargs"], **{k: get(v, ".") for k, v in s["objects"].items()}); '
    'ctx = get(s["arch_context"], ":")(*map(int, s["arch"].split("."))) if s["arch_context"] else contextlib.nullcontext(); '
    'ctx.__enter__(); r = get(s["module"] + ":" + s["function"], ":")(**kw); '
    's["build"] and getattr(r, s["build"])(); '
    'print("prebuilt %s in %.1fs" % (s["name"], time.monotonic() - t))'
)


def context(cell: Cell, index_url: str, keys: dict[str, str], compile_shared: bool = False) -> dict:
    return {
        "cell": cell,
        "index_url": index_url,
        "build_tools": list(cell.build_tools),
        "pip_pin": next((t for t in cell.build_tools if re.match(r"pip[=<>~!]", t)), ""),
        # the first resolve's limit: files uploaded before the engine's release (engine data resolve_as_of)
        "resolve_as_of": cell.engine_recipe.resolve_as_of,
        "resolve_as_of_exempt": list(cell.engine_recipe.resolve_as_of_exempt) if cell.engine_recipe.resolve_as_of else [],
        "sccache_version": SCCACHE_VERSION,
        "compile_shared": compile_shared,
        # a wheel taken from the index has no source, build or wheels stage: the runner downloads it
        "packages": [package_context(p, cell.torch) for p in cell.packages if not p.from_index],
        "constraints": ([f"torch=={cell.torch}"] if cell.torch else []) + [f"{p.name}=={p.version}" for p in cell.packages],
        "import_name": cell.engine.replace("-", "_"),
        "requirements": runtime_requirements(cell),
        "runtime_jit": cell.runtime_jit,
        "serve_jit": list(cell.serve_jit),
        "jit_apt": list(dict.fromkeys([*(cell.runtime_jit["apt"] if cell.runtime_jit else []),
                                       *(a for p in cell.serve_jit for a in p["apt"])])),
        "libcuda_stub": any(p["libcuda_stub"] for p in cell.serve_jit),
        "libcuda_symbols": libcuda_stub_symbols() if any(p["libcuda_stub"] for p in cell.serve_jit) else [],
        # every CUDA library the engine's JIT modules link (engine data jit_modules + jit_frameworks), cudart for
        # the toolchain's own check: each gets an unversioned link beside the versioned file the wheels ship
        "jit_link_libs": list(dict.fromkeys(["cudart", *cell.jit_links])) if cell.runtime_jit else [],
        "jit_prebuilt": prebuilt_builds(cell),
        "criu": cell.criu,  # profiles.<name>.criu: the CRIU the runtime image carries (builder/data/criu/criu.toml)
        # every compile cache of the engine under the image's one root (engine data compile_caches)
        "compile_caches": list(cell.compile_caches),
        "cache_root": cell.cache_root,
        "serve_modules": list(cell.engine_recipe.serve_modules),
        "stray_files": list(cell.engine_recipe.stray_files),
        # what the install leaves that this cell never reads (engine data arch_sources; duplicates; tests)
        "slim": slim_context(cell),
        "runtime_checks": list(cell.engine_recipe.runtime_checks),
        "labels": [(k, dockerfile_quoted(v, expand=arg)) for k, v, arg in labels_mod.written(cell, keys)],
        "label_args": labels_mod.audit_args(cell),
        "entrypoint": entrypoint(cell),
    }


def slim_context(cell: Cell) -> dict:
    """What the runtime's install drops that this cell never reads (macros.j2 slim): per-arch JIT sources of GPU
    generations newer than the cell's (engine data arch_sources), `tests` directories, files shipped twice."""
    return {"arch_sources": list(cell.engine_recipe.arch_sources), "newer": archs_mod.newer_generations(cell.archs)}


def slim_command(cell: Cell, prefix: str, purelib: str) -> str:
    """The runtime install's slim step, the template's own text, as one shell command over the venv at `prefix`
    (its site-packages `purelib`): a GPU host without Docker runs the same step on the venv it boots
    (gpu-host-run --slim). The template links duplicates under the image's venv, /opt/venv, by name."""
    step = str(templates.environment().get_template("macros.j2").module.slim(slim_context(cell))).strip()
    if not step.endswith(" /opt/venv"):
        raise AssertionError(f"macros.j2 slim no longer ends with the venv it links in: {step[-80:]!r}")
    return f"sp={shlex.quote(purelib)} && {step[:-len('/opt/venv')]}{shlex.quote(prefix)}"


def dockerfile_quoted(value: str, expand: bool = False) -> str:
    """Text for inside a double-quoted Dockerfile value (`LABEL k="..."`, `ENV K="..."`): backslashes and
    double quotes escaped, and `$` too unless the value may expand variables (ENV). The grammars keep such
    characters out of every value already; this keeps a slipped one from ending the quoted word."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return out if expand else out.replace("$", "\\$")


def _refuse_control_characters(value, cell_id: str, path: str = "context") -> None:
    """The last guard before text becomes a Dockerfile: no value may hold a newline or another control
    character (a newline would start a new instruction). The values were checked by their grammar where they
    were read, so this only fires on a path that skipped a check — and then names it, instead of rendering."""
    if isinstance(value, str):
        if _CONTROL.search(value):
            raise UserError(f"refusing to render {cell_id}: {path} = {value[:60]!r}... holds a newline or control "
                            "character; it would inject Dockerfile instructions")
    elif isinstance(value, dict):
        for k, v in value.items():
            _refuse_control_characters(k, cell_id, f"{path} key")
            _refuse_control_characters(v, cell_id, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _refuse_control_characters(v, cell_id, f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _refuse_control_characters(getattr(value, f.name), cell_id, f"{path}.{f.name}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def render(plan: CellPlan, index_url: str, compile_shared: bool = False) -> str:
    """The Dockerfile of one planned cell; its labels carry the cache keys plan computed. compile_shared: a
    shared compile cache is configured, so the compile RUNs reach it (builder/compile_cache.py)."""
    cell = plan.cell
    ctx = context(cell, index_url, plan.keys, compile_shared)
    _refuse_control_characters(ctx, cell.id)
    env = templates.environment()  # imports jinja2: a run refused before it renders does not pay for it
    import jinja2

    try:
        text = env.get_template(templates.ENTRY_TEMPLATE).render(**ctx)
    except jinja2.UndefinedError as exc:  # a template bug, not a user error: keep the traceback
        raise RuntimeError(f"template uses an undefined value while rendering {cell.id}: {exc}") from exc
    # collapse runs of blank lines left by control blocks
    lines, blank = [], 0
    for line in text.splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"
