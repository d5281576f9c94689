"""`--image-paths`: the process route at the image's paths (image/launchline.ImagePaths). The interpreter it is given is
asked where it runs and refused when that is not the image's prefix and site-packages; the engine then gets the
variables the image sets for those paths."""

from __future__ import annotations

import json
import os
import subprocess

from ...errors import UserError
from ...image.launchline import ImagePaths, image_paths

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


def check(python: str, paths: ImagePaths, cell) -> dict:
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


def of_cell(cell, python: str, cache_root: str | None) -> tuple[ImagePaths, dict]:
    """--image-paths: the image's paths of `cell`, `python` checked to be the image's interpreter (its prefix and
    site-packages), CUDA_HOME and the model root as the image has them, the caches at the image's root (a
    --cache-root elsewhere is refused). The paths, and what the interpreter reported with them."""
    paths = image_paths(cell)
    if cache_root is not None and cache_root.rstrip("/") != paths.cache_root:
        raise UserError(f"--image-paths with --cache-root {cache_root}: the image's cache root is {paths.cache_root}")
    got = check(python, paths, cell)
    return paths, {**paths.to_json(), "python": got["python"]}


def env(paths: ImagePaths) -> dict[str, str]:
    """The variables the image sets for these paths (the cache variables come with the caches)."""
    bins = [f"{paths.prefix}/bin"] + ([f"{paths.cuda_home}/bin"] if paths.cuda_home else [])
    out = {"VIRTUAL_ENV": paths.prefix, "PATH": ":".join(bins + [os.environ.get("PATH", "")])}
    if paths.cuda_home:
        out["CUDA_HOME"] = paths.cuda_home
    return out
