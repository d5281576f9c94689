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
"""

import contextlib
import importlib
import io
import json
import os
import platform
import re
import shutil
import sys
import sysconfig
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


COMMANDS = {"env": cmd_env, "imports": cmd_imports, "parse": cmd_parse}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print("usage: probe.py {env|imports|parse} SPEC_JSON", file=sys.stderr)
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
