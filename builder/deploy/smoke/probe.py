"""The smoke probe: a self-contained script that runs *inside* the image (or the Python environment of a GPU
host without Docker) and reports, as one JSON line, what the engine there says about itself.

It imports nothing from builder (the image has no builder) and only the standard library until it is asked
to import the engine. Usage: ``python3 probe.py COMMAND SPEC_JSON``; the last line of stdout is
``BUILDER-PROBE-RESULT: {json}``.

Commands:
  env      L0: Python, the versions of the named distributions, torch and the CUDA it was built for
  imports  L1: the named modules, every compiled extension of the named distributions, the engine's own
           checks that its fast kernels are on, the tools its JIT paths need
  parse    L2: the engine's own argument parser on each strategy's flags, the resolved values read back,
           and (where the data says so) the engine's own name resolution of a value
  jit      JIT: each compile the engine does at its first request (engine data serve_jit), done here without
           a GPU: a C extension against the Python headers, Triton's own C build of its CUDA utilities and
           launcher plus a kernel per arch for an explicit target, nvcc linking -lcuda as FlashInfer's JIT does;
           and each JIT module the engine builds (engine data jit_modules) through the framework's own generator,
           once per arch, each in a fresh interpreter (`jit-module`: frameworks read their arch list and cache
           directory from the environment when they are imported)
  jit-module  one such build in this process: the generator called, its result's build method run
"""

import contextlib
import importlib
import inspect
import io
import json
import os
import platform
import re
import shutil
import sys
import sysconfig
import time
import traceback

MARK = "BUILDER-PROBE-RESULT: "


def _dist_version(name):
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _call(spec):
    """'pkg.module:attr.attr' → the object."""
    mod, _, attr = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def _first_importable(specs):
    errors = []
    for spec in specs:
        try:
            return _call(spec)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{spec}: {type(exc).__name__}: {exc}")
    raise ImportError("none of these could be imported: " + "; ".join(errors))


def _short(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 800 else text[:800] + "..."


# -- L0 ----------------------------------------------------------------------------------------------------
def cmd_env(spec):
    out = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "executable": sys.executable,
        "machine": platform.machine(),
        "dists": {name: _dist_version(name) for name in spec.get("dists", [])},
        "cuda_env": os.environ.get("CUDA_VERSION"),
    }
    if spec.get("torch"):
        try:
            import torch

            out["torch"] = torch.__version__
            out["torch_cuda"] = torch.version.cuda
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            out["torch_error"] = _short(exc)
    libs = []
    for d in ("/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", sysconfig.get_paths()["purelib"]):
        for root, _dirs, files in os.walk(d) if os.path.isdir(d) else ():
            libs += [f for f in files if re.fullmatch(r"libcudart\.so\.\d+(\.\d+)*", f)]
            if root.count(os.sep) - d.count(os.sep) > 4:
                _dirs[:] = []
    out["libcudart"] = sorted(set(libs))
    return out


# -- L1 ----------------------------------------------------------------------------------------------------
def _extension_files(dist):
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None
    found = []
    for f in d.files or []:
        name = str(f)
        if name.endswith(".so") or ".so." in os.path.basename(name):
            path = str(f.locate())
            if os.path.isfile(path):
                found.append((name, os.path.realpath(path)))
    return found


_EXT_SUFFIX = re.compile(r"(\.cpython-(\d+)[^.]*|\.abi3)?\.so$")


def _module_name(relpath):
    """vllm/_C.abi3.so → ('vllm._C', None); .cpython-310-x86_64-linux-gnu.so → (name, '310')."""
    m = _EXT_SUFFIX.search(relpath)
    if not m or ".so." in os.path.basename(relpath):
        return None, None
    mod = relpath[: m.start()].replace("/", ".")
    return mod, m.group(2)


def _load_extension(relpath, path):
    """Import a Python extension by its module name, or dlopen a plain shared library."""
    import ctypes

    mod, tag = _module_name(relpath)
    here = "%d%d" % sys.version_info[:2]
    if tag and tag != here:
        return "other-python", f"built for CPython {tag[0]}.{tag[1:]}, this is {here[0]}.{here[1:]}"
    if mod and all(p.isidentifier() for p in mod.split(".")):
        try:
            importlib.import_module(mod)
            return "ok", "imported"
        except ImportError as exc:
            if "module export function" not in str(exc):  # a real extension that fails to load
                # a package __init__ that imports its extensions and re-raises with words of its own (vLLM's
                # vllm_flash_attn) hides why: load the file itself, past the package, for its own verdict
                return _load_file(mod, path) if "." in mod else _classify(exc)
        except Exception as exc:  # noqa: BLE001
            return _classify(exc)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return "ok", "dlopen"
    except OSError as exc:
        return _classify(exc)


def _load_file(mod, path):
    """Load an extension module from its file without importing its package (not put in sys.modules)."""
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location(mod, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return "ok", "loaded from its file (its package's __init__ failed to import)"
    except Exception as exc:  # noqa: BLE001
        return _classify(exc)


def _classify(exc):
    text = _short(exc)
    chain, seen = [], exc
    while seen is not None and len(chain) < 5:  # the cause a wrapper re-raised with words of its own
        chain.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    if any("libcuda.so" in t or "libnvidia-ml" in t or "CUDA driver" in t for t in chain):
        return "needs-driver", text
    return "failed", text


def cmd_imports(spec):
    out = {"modules": {}, "extensions": [], "checks": [], "tools": {}, "so_files": []}
    if spec.get("torch"):
        try:
            importlib.import_module("torch")  # extensions resolve torch's symbols through it
        except Exception as exc:  # noqa: BLE001
            out["modules"]["torch"] = ["failed", _short(exc)]
    for mod in spec.get("modules", []):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                importlib.import_module(mod)
            out["modules"][mod] = ["ok", ""]
        except Exception as exc:  # noqa: BLE001
            out["modules"][mod] = ["failed", _short(exc)]
    for dist in spec.get("dists", []):
        files = _extension_files(dist)
        if files is None:
            out["extensions"].append({"dist": dist, "file": None, "status": "failed", "detail": "not installed"})
            continue
        seen = set()
        for rel, path in sorted(files):
            out["so_files"].append(path)
            mod, _tag = _module_name(rel)
            status, detail = _load_extension(rel, path)
            key = mod or rel
            if status == "ok" and key in seen:
                continue
            seen.add(key)
            out["extensions"].append({"dist": dist, "file": rel, "status": status, "detail": detail})
    for code in spec.get("checks", []):  # the engine's own checks, as Python statements that raise
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, "<runtime check>", "exec"), {})
            out["checks"].append({"code": code, "error": None})
        except Exception as exc:  # noqa: BLE001 - AssertionError carries the check's own words
            out["checks"].append({"code": code, "error": _short(exc)})
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for tool in spec.get("tools", []):
        beside = os.path.join(cuda_home, "bin", tool)
        out["tools"][tool] = shutil.which(tool) or (beside if os.access(beside, os.X_OK) else None)
    return out


# -- L2 ----------------------------------------------------------------------------------------------------
def _read_back(obj, dotted):
    for part in dotted.split("."):
        if isinstance(obj, dict):
            if part not in obj:
                raise KeyError(dotted)
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    if hasattr(obj, "name") and hasattr(obj, "value") and not isinstance(obj, (str, int, float)):
        obj = obj.name  # an enum
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def cmd_parse(spec):
    out = {"cases": []}
    try:
        args_cls = _call(spec["args_class"])
        make_parser = _first_importable(spec["parser"])
    except Exception as exc:  # noqa: BLE001
        out["error"] = _short(exc)
        return out
    resolver = spec.get("name_resolver")
    for case in spec["cases"]:
        res = {"name": case["name"], "argv": case["argv"], "ok": False, "error": None, "resolved": {}, "stage": "parse"}
        err = io.StringIO()
        try:
            parser = make_parser()
            args_cls.add_cli_args(parser)
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = parser.parse_args(case["argv"])
                args = args_cls.from_cli_args(ns)
            for key in case.get("read", []):
                try:
                    res["resolved"][key] = _read_back(args, key)
                except (KeyError, AttributeError):
                    res["resolved"][key] = "<missing>"
            if resolver:
                res["stage"] = "resolve"
                value = _read_back(args, resolver["attr"])
                resolved = _call(resolver["call"])(value)
                res["resolved"][resolver["attr"] + "@resolved"] = _read_back(resolved, "name") \
                    if hasattr(resolved, "name") else str(resolved)
            res["ok"] = True
        except SystemExit as exc:  # argparse refuses: exit 2 and a message on stderr
            res["error"] = (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
        except Exception as exc:  # noqa: BLE001
            res["error"] = _short(exc)
        out["cases"].append(res)
    return out


# -- JIT ---------------------------------------------------------------------------------------------------
def _c_compiler():
    """The C compiler Triton picks: $CC, else gcc, else clang."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def _python_include():
    scheme = sysconfig.get_default_scheme() if hasattr(sysconfig, "get_default_scheme") else "posix_prefix"
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def _missing_c_prerequisites():
    """What a C build against this Python lacks, in words that name the missing piece (or None)."""
    problems = []
    if not _c_compiler():
        problems.append("no C compiler (no $CC, gcc or clang on PATH)")
    include = _python_include()
    if not os.path.isfile(os.path.join(include, "Python.h")):
        problems.append(f"no Python.h in {include} (the Python headers: python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    return "; ".join(problems) or None


def _run(argv, cwd=None, env=None):
    import subprocess

    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"{os.path.basename(argv[0])} exited {proc.returncode}: {tail}")
    return proc


def _compile_failed(what, exc):
    """The compile's own failure, with what the image lacks for it where that is known (the compile is always
    tried: the verdict is the compiler's, the words name the missing piece)."""
    missing = _missing_c_prerequisites()
    return RuntimeError(f"{what}: {exc}" + (f"\n  the image lacks: {missing}" if missing else ""))


def _needed(path):
    """The NEEDED entries of a shared object (readelf, from binutils beside gcc), or None without readelf."""
    exe = shutil.which("readelf")
    if not exe:
        return None
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _run([exe, "-d", path]).stdout)


def _check_links_libcuda(what, path):
    """A module linked -lcuda must record NEEDED libcuda.so.1, or it cannot resolve the driver's functions when it
    loads on a GPU (a link stub without symbols makes the linker drop the library)."""
    needed = _needed(path)
    if needed is None:
        return "not checked: no readelf"
    if "libcuda.so.1" not in needed:
        raise RuntimeError(f"{what} links -lcuda but records no NEEDED libcuda.so.1 (it has {needed}): on a GPU it "
                           "would not load (undefined symbol); is the libcuda link stub empty?")
    return "NEEDED libcuda.so.1"


def _jit_python_c(spec, work):
    """A C extension against this Python's headers, built with the compiler Triton uses, then imported."""
    if not _c_compiler():
        raise _compile_failed("no C extension can be built", "no compiler to run")
    src = os.path.join(work, "builder_jit_probe.c")
    with open(src, "w") as f:
        f.write('#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "builder_jit_probe", NULL, -1, NULL};\n'
                "PyMODINIT_FUNC PyInit_builder_jit_probe(void) { return PyModule_Create(&m); }\n")
    so = os.path.join(work, "builder_jit_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
    try:
        _run([_c_compiler(), src, "-O2", "-shared", "-fPIC", "-I" + _python_include(), "-o", so])
    except RuntimeError as exc:
        raise _compile_failed("a C extension against the Python headers does not build", exc) from None
    sys.path.insert(0, work)
    importlib.import_module("builder_jit_probe")
    return {"compiler": _c_compiler(), "include": _python_include()}


_TRITON_KERNEL = """import triton
import triton.language as tl


@triton.jit
def builder_probe_add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)
"""


def _jit_triton(spec, work):
    """What Triton compiles at the first kernel launch, without a GPU, through Triton's own code: its CUDA
    utilities module (driver.c, #include <Python.h>; from Triton 3.5 it holds the launcher too) and, where this
    Triton builds one per kernel, the kernel's launcher — each built by Triton's C build, not loaded (loading needs
    the driver's libcuda.so.1) — and the kernel itself for every arch of the cell (an explicit target)."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(work, "triton-cache")  # nothing from an earlier compile
    import triton
    from triton.backends.nvidia import driver as nv
    from triton.runtime import build

    built, linked = [], {}

    class _NotLoaded:  # what Triton gets instead of the loaded module
        def __getattr__(self, name):
            return None

    def not_loaded(name, path):
        built.append(os.path.basename(path))
        linked[os.path.basename(path)] = _check_links_libcuda(f"Triton's {name}", path)
        return _NotLoaded()

    def check_call(argv, **kw):  # Triton's own compiler call, its output kept for the verdict
        _run(argv)
        return 0

    def old_compile_module_from_src(src, name):  # Triton 3.0-3.1: driver.py builds and loads by itself
        path = os.path.join(work, name + ".c")
        with open(path, "w") as f:
            f.write(src)
        so = build._build(name, path, work, nv.library_dirs(), nv.include_dir, nv.libraries)
        return not_loaded(name, so)

    build.subprocess.check_call = check_call
    if hasattr(build, "_load_module_from_path"):  # Triton >= 3.2: every C build loads through here
        build._load_module_from_path = not_loaded
    if getattr(getattr(nv, "compile_module_from_src", None), "__module__", "") == nv.__name__:
        nv.compile_module_from_src = old_compile_module_from_src
    try:
        nv.libcuda_dirs()
    except AssertionError as exc:
        raise RuntimeError("Triton links its launcher against libcuda.so.1 and finds none (no GPU here, and no "
                           f"TRITON_LIBCUDA_PATH naming a link stub): {str(exc).splitlines()[0]}") from None
    try:
        nv.CudaUtils()
    except Exception as exc:  # noqa: BLE001 - the compiler's words, or Triton's "Failed to find C compiler"
        raise _compile_failed("Triton's C build of cuda_utils (at the first kernel launch) failed", exc) from None
    kernel_file = os.path.join(work, "builder_probe_kernel.py")
    with open(kernel_file, "w") as f:
        f.write(_TRITON_KERNEL)
    sys.path.insert(0, work)
    fn = importlib.import_module("builder_probe_kernel").builder_probe_add
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "constexprs" in inspect.signature(ASTSource.__init__).parameters:  # Triton >= 3.2: names
        src = ASTSource(fn=fn, signature={"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 128})
    else:  # Triton 3.0-3.1: argument indices, constants
        src = ASTSource(fn=fn, signature={0: "*fp32", 1: "*fp32", 2: "*fp32", 3: "i32"}, constants={4: 128})
    kernels = {}
    for arch in spec.get("archs", []):
        t0 = time.monotonic()
        try:
            k = triton.compile(src, target=GPUTarget("cuda", int(arch), 32))
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"triton.compile for sm_{arch} failed: {_short(exc)}") from None
        cubin = k.asm.get("cubin") or b""
        if not cubin:
            raise RuntimeError(f"triton.compile for sm_{arch} produced no cubin")
        kernels[f"sm_{arch}"] = {"cubin_bytes": len(cubin), "seconds": round(time.monotonic() - t0, 2)}
    if hasattr(nv, "make_launcher") and spec.get("archs"):  # a launcher per kernel (Triton < 3.5): its C build
        try:
            nv.CudaLauncher(k.src, k.metadata)
        except Exception as exc:  # noqa: BLE001
            raise _compile_failed("Triton's C build of the kernel launcher failed", exc) from None
    return {"triton": triton.__version__, "built": built, "linked": linked, "kernels": kernels}


def _jit_nvcc_libcuda(spec, work):
    """A kernel compiled for every arch of the cell with the image's nvcc (CUDA_HOME) and linked as FlashInfer's
    JIT links its modules: -shared, -L$CUDA_HOME/lib64 and lib64/stubs, -lcudart -lcuda."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not cuda_home:
        raise RuntimeError("CUDA_HOME is not set: a JIT finds no nvcc")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        raise RuntimeError(f"no nvcc at {nvcc}")
    stub = os.path.join(cuda_home, "lib64", "stubs", "libcuda.so")
    if not os.path.exists(stub):
        raise RuntimeError(f"no libcuda link stub at {stub}: a JIT that links -lcuda depends on the container "
                           "runtime providing libcuda.so")
    src = os.path.join(work, "builder_probe.cu")
    with open(src, "w") as f:
        f.write("#include <cuda.h>\n__global__ void k(float *p) { p[threadIdx.x] *= 2.0f; }\n"
                'extern "C" int builder_probe_driver_version(void) { int v = 0; cuDriverGetVersion(&v); return v; }\n')
    so = os.path.join(work, "builder_probe_cu.so")
    argv = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", so, src]
    for arch in spec.get("archs", []):
        argv += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    argv += [f"-L{cuda_home}/lib64", f"-L{cuda_home}/lib64/stubs", "-lcudart", "-lcuda"]
    _run(argv)
    return {"nvcc": nvcc, "stub": stub, "linked": _check_links_libcuda("the nvcc module", so)}


JIT_PATHS = {"python-c": _jit_python_c, "triton": _jit_triton, "nvcc-libcuda": _jit_nvcc_libcuda}

# The lines of a failed build that say why, in the compiler's or linker's own words (ninja prints every command
# line it ran; those are not the reason)
_REASON = re.compile(r"\berror\b|cannot find|undefined reference|No such file|FAILED|fatal|collect2|killed", re.I)


def _build_failure(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    why = [ln for ln in lines if _REASON.search(ln) and len(ln) < 600]
    return "\n".join((why or lines)[-8:])


def _snapshot(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root) if root and os.path.isdir(root) else ():
        for f in files:
            if f.endswith((".o", ".so", ".cubin")):
                path = os.path.join(dirpath, f)
                out[path] = os.stat(path).st_mtime_ns
    return out


def _named(name, sep):
    mod, _, attr = name.rpartition(sep)
    return getattr(importlib.import_module(mod), attr)


def cmd_jit_module(spec):
    """One JIT module built through the framework's own generator or loader: `generator` (module:function) called with
    `kwargs` and `objects` (arguments that are Python objects, module.attribute: torch.bfloat16), then, for a generator,
    the result's `build` method (FlashInfer: JitSpecNvcc.build writes build.ninja and runs ninja); a loader (SGLang's
    load_jit callers) compiles, links and loads it itself. The arch list and the cache directory are already in the
    environment; a framework that takes its one target from a context manager (`arch_context`, SGLang's
    override_jit_cuda_arch) gets it entered with the arch. The functions of `answer_gpu` answer True: the module is keyed
    as on the GPU. Reports the module's library, its size and how many objects / libraries the build (re)made: 0 when
    the cache already held them (a prebuilt image)."""
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            gen = _named(spec["generator"], ":")
            for name in spec.get("answer_gpu", []):
                mod, _, attr = name.partition(":")
                setattr(importlib.import_module(mod), attr, lambda *a, **k: True)
            kwargs = {**spec.get("kwargs", {}), **{k: _named(v, ".") for k, v in spec.get("objects", {}).items()}}
            ctx = contextlib.nullcontext()
            if spec.get("arch_context"):
                major, minor = spec["arch"].split(".")
                ctx = _named(spec["arch_context"], ":")(int(major), int(minor))
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"the generator {spec['generator']} cannot be imported: {_short(exc)}"}
        cache = os.environ.get(spec.get("cache_env") or "", "")
        before = _snapshot(cache)
        try:
            with ctx:
                jit_spec = gen(**kwargs)
                build_dir = str(getattr(jit_spec, "build_dir", "") or "")
                before = {**before, **_snapshot(build_dir)}
                if spec.get("build"):
                    getattr(jit_spec, spec["build"])()
        except Exception as exc:  # noqa: BLE001 - the compiler's or linker's words are in the message (ninja's output)
            text = str(exc)
            return {"ok": False, "seconds": round(time.monotonic() - t0, 2),
                    "error": _build_failure(text) or _short(exc)}
    after = {**_snapshot(cache), **_snapshot(build_dir)}
    made = sorted(p for p, m in after.items() if before.get(p) != m)
    lib = str(getattr(jit_spec, "jit_library_path", "") or "")
    if not lib:  # a loader returns the loaded module: its library is the newest one under the cache
        libs = sorted((m, p) for p, m in after.items() if p.endswith(".so"))
        lib = libs[-1][1] if libs else ""
    out = {"ok": True, "seconds": round(time.monotonic() - t0, 2), "module": getattr(jit_spec, "name", spec["generator"]),
           "library": lib, "built": len(made)}
    if lib and os.path.isfile(lib):
        out["library_bytes"] = os.path.getsize(lib)
        needed = _needed(lib)
        if needed is not None:
            out["needed"] = needed
    return out


def _arch_value(arch):
    return f"{int(arch) // 10}.{int(arch) % 10}"


def _jit_modules(spec):
    """Each module of spec["modules"], once per run (label, arch value: one arch, or a prebuilt image's whole set),
    each build in a fresh interpreter of this probe (a framework may fix its target once per process)."""
    import subprocess
    import tempfile

    out = {}
    for m in spec.get("modules", []):
        runs = m.get("runs") or [[f"sm_{a}", _arch_value(a)] for a in m["archs"]]
        for label, arch in runs:
            key = f"{m['name']}@{label}"
            own = not m.get("cache_dir")  # a prebuilt image's cache is its own; a cache made here is removed after
            cache = m.get("cache_dir") or tempfile.mkdtemp(prefix=f"builder-jit-{m['name']}-")
            env = {**os.environ, m["cache_env"]: cache}
            if m.get("arch_env"):
                env[m["arch_env"]] = arch
            t0 = time.monotonic()
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "jit-module",
                                       json.dumps({**m, "arch": arch})], env=env, capture_output=True, text=True)
            finally:
                if own:
                    shutil.rmtree(cache, ignore_errors=True)
            res = None
            for line in proc.stdout.splitlines():
                if line.startswith(MARK):
                    res = json.loads(line[len(MARK):])
            if res is None or "error" in res and "ok" not in res:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
                res = {"ok": False, "error": (res or {}).get("error") or f"the build exited {proc.returncode}: {tail}"}
            res["seconds"] = res.get("seconds", round(time.monotonic() - t0, 2))
            res["arch"] = arch
            out[key] = res
    return out


def cmd_jit(spec):
    import tempfile

    out = {"paths": {}}
    for path in spec.get("paths", []):
        t0 = time.monotonic()
        res = {"ok": False, "error": None}
        work = tempfile.mkdtemp(prefix=f"builder-jit-{path}-")
        try:
            if path not in JIT_PATHS:
                raise RuntimeError(f"this probe does not know the JIT path {path!r}")
            with contextlib.redirect_stdout(io.StringIO()):
                res["detail"] = JIT_PATHS[path](spec, work)
            res["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported per path
            res["error"] = str(exc) if isinstance(exc, RuntimeError) else _short(exc)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # run on a host (the process route), it would stay in its /tmp
        res["seconds"] = round(time.monotonic() - t0, 2)
        out["paths"][path] = res
    out["modules"] = _jit_modules(spec)
    return out


COMMANDS = {"env": cmd_env, "imports": cmd_imports, "parse": cmd_parse, "jit": cmd_jit, "jit-module": cmd_jit_module}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print("usage: probe.py {env|imports|parse|jit|jit-module} SPEC_JSON", file=sys.stderr)
        return 2
    try:
        result = COMMANDS[argv[1]](json.loads(argv[2]))
    except Exception as exc:  # noqa: BLE001 - the caller gets the failure as data
        result = {"error": _short(exc), "traceback": traceback.format_exc()[-3000:]}
    sys.stdout.flush()
    print(MARK + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
