"""The paths a runtime image runs its engine at: the venv (interpreter prefix and site-packages), CUDA_HOME of the
engine's nvcc JIT, the compile caches' one root, and where a model is mounted. The templates write them
(dockerfiles/macros.j2 python_venv, stages/runtime.j2; tests/test_warm_host.py holds the rendered Dockerfile to these
values). They matter beyond the image because the compile caches' keys hold absolute paths (vLLM's compile-cache hash,
DeepGEMM's include path, the model's path in vLLM's config hash: docs/warm.md): a capture made on a GPU host without
Docker is only the image's when the engine ran there at these very paths (`--image-paths`, which checks the
interpreter it is given, and scripts/gpu-host-run --image-paths, which sets such an interpreter up)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass

from ..errors import UserError
from .launchline import MODEL_ROOT  # where `builder serve` and smoke mount a model (a directory of that name under it)

VENV = "/opt/venv"
CUDA_JIT_HOME = "/opt/cuda-jit"  # the nvcc wheels' toolkit, linked there (stages/runtime.j2)


@dataclass(frozen=True)
class Paths:
    prefix: str  # sys.prefix of the engine's interpreter
    purelib: str  # its site-packages
    cuda_home: str  # "" when the image has no nvcc JIT
    cache_root: str  # "" when the engine data gives the release no compile caches
    model_root: str = MODEL_ROOT

    def to_json(self) -> dict:
        return asdict(self)


def of(cell) -> Paths:
    """The runtime image's paths for `cell` (a matrix Cell)."""
    return Paths(prefix=VENV, purelib=f"{VENV}/lib/python{cell.python}/site-packages",
                 cuda_home=CUDA_JIT_HOME if cell.runtime_jit else "", cache_root=cell.cache_root or "")


PROBE = ("import json, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, "
         "'purelib': sysconfig.get_paths()['purelib'], 'python': '%d.%d' % sys.version_info[:2]}))")


def interpreter(python: str) -> dict:
    """What `python` is: its prefix, site-packages and version, as it reports them."""
    try:
        res = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"--python {python}: cannot run it ({exc})") from None
    if res.returncode != 0:
        raise UserError(f"--python {python}: exit {res.returncode}: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def check(python: str, paths: Paths, cell) -> dict:
    """Refuse an interpreter that does not run at the image's paths (a capture made there would not be the image's);
    what it reported otherwise."""
    got = interpreter(python)
    wrong = [f"{k} {got.get(k)} (the image's: {want})" for k, want in
             (("prefix", paths.prefix), ("purelib", paths.purelib), ("python", cell.python)) if got.get(k) != want]
    if paths.cuda_home and not os.path.isfile(os.path.join(paths.cuda_home, "bin", "nvcc")):
        wrong.append(f"no {paths.cuda_home}/bin/nvcc (the image's CUDA_HOME)")
    if wrong:
        raise UserError(f"--image-paths: {python} does not run at the image's paths: {'; '.join(wrong)} "
                        "(scripts/gpu-host-run --image-paths sets such an interpreter up on a GPU host)")
    return got


def env(paths: Paths) -> dict[str, str]:
    """The variables the image sets for these paths (the cache variables come with the caches)."""
    bins = [f"{paths.prefix}/bin"] + ([f"{paths.cuda_home}/bin"] if paths.cuda_home else [])
    out = {"VIRTUAL_ENV": paths.prefix, "PATH": ":".join(bins + [os.environ.get("PATH", "")])}
    if paths.cuda_home:
        out["CUDA_HOME"] = paths.cuda_home
    return out
