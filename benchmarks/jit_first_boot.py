"""What a prebuilt JIT cache saves at an engine's first boot, measured on a GPU host (no Docker: the process
launcher), for vLLM with FlashInfer's FP8 block-scale GEMM (the module vLLM picks first for block-FP8 linear
layers on compute capability 9.0 and FlashInfer JIT-builds at first use).

Four boots of `builder smoke --layers L3` of the same cell and strategy, each with its own FlashInfer workspace
(FLASHINFER_WORKSPACE_BASE), the Triton / torch.compile caches of the host shared:
  cold      everything cold (the first boot of the host: Triton, Inductor and FlashInfer compile)
  jit       the other caches warm, FlashInfer's workspace empty: what the engine JIT-builds at first boot
  prebuilt  the other caches warm, FlashInfer's workspace filled beforehand by the module's own generator and build
            method -- the same call `jit = "prebuilt"` makes at image-build time -- so the boot compiles none of it
Printed: seconds to ready, the first completion's latency, and which module libraries each boot built.

Run on the GPU host after `scripts/gpu-host-run install vllm-0.26.0` and `... install flashinfer-0.6.14`:
    python3 benchmarks/jit_first_boot.py --bundle vllm-0.26.0 --with flashinfer-0.6.14
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = Path(os.environ.get("BUILDER_CARRY_STORE", "/tmp/builder-carry"))
MATRIX = "tests/fixtures/gpu-host/matrix.toml"
# the module and its generator (engine data jit_modules.flashinfer-fp8-blockscale-gemm-sm90)
GENERATOR = ("flashinfer.jit.gemm.fp8_blockscale", "gen_fp8_blockscale_gemm_sm90_module")


def libraries(workspace: Path) -> dict[str, int]:
    return {str(p.relative_to(workspace)): p.stat().st_mtime_ns for p in workspace.rglob("*.so")} if workspace.is_dir() else {}


def prebuild(python: str, env: dict, workspace: Path, arch: str) -> float:
    code = ("import importlib, time; t = time.monotonic(); "
            f"spec = getattr(importlib.import_module({GENERATOR[0]!r}), {GENERATOR[1]!r})(); spec.build(False); "
            "print('built', spec.name, 'in %.1fs' % (time.monotonic() - t))")
    t0 = time.monotonic()
    subprocess.run([python, "-c", code], check=True, cwd=ROOT,
                   env={**env, "FLASHINFER_WORKSPACE_BASE": str(workspace), "FLASHINFER_CUDA_ARCH_LIST": arch})
    return time.monotonic() - t0


def boot(python: str, env: dict, cell: str, serve: dict, workspace: Path, strategy: str, engine_args: str,
         extra_env: list[str], out: Path, timeout: float) -> dict:
    argv = [python, "-m", "builder.cli", "smoke", cell, "--matrix", MATRIX, "--launcher", "process", "--python", python,
            "--layers", "L3", "--strategy", strategy, "--engine-args", engine_args, "--boot-timeout", str(timeout),
            "--report-dir", str(out), "--env", f"FLASHINFER_WORKSPACE_BASE={workspace}"]
    for e in [*serve.get("env", []), *extra_env]:
        argv += ["--env", e]
    before = libraries(workspace)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    sys.stdout.write(proc.stdout[-3000:])
    sys.stderr.write(proc.stderr[-3000:])
    reports = json.loads(next(out.rglob("smoke.json")).read_text())
    l3 = next(r for r in reports[0]["results"] if r["layer"] == "L3")
    after = libraries(workspace)
    return {"status": l3["status"], "reason": l3.get("reason", "")[:300], "figures": l3.get("figures", {}),
            "wall_s": round(wall, 1), "built": sorted(p for p, m in after.items() if before.get(p) != m)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--with", dest="extra", action="append", default=[])
    ap.add_argument("--strategy", default="MTP2")
    ap.add_argument("--arch", default="9.0", help="FLASHINFER_CUDA_ARCH_LIST of the prebuild (the host's GPU)")
    # eager: vLLM's profile run already takes FlashInfer's GEMM for its small-M shapes, so the module is built before
    # the engine is ready (without --enforce-eager, torch.compile and CUDA graph capture add minutes to every boot)
    ap.add_argument("--engine-args", default="--enforce-eager --gdn-prefill-backend triton")
    # the FlashInfer kernel pairs with DeepGEMM for M >= 32; DeepGEMM's own warm-up JIT-compiles 832 kernels
    # (over 5 minutes on the H200's 16 cores): skipped, it is not what this measures
    ap.add_argument("--env", action="append", default=["VLLM_USE_DEEP_GEMM=1", "VLLM_DEEP_GEMM_WARMUP=skip"],
                    help="NAME=VALUE after the spec's")
    ap.add_argument("--boot-timeout", type=float, default=400)
    ap.add_argument("--phases", default="cold,jit,prebuilt")
    args = ap.parse_args()

    spec = tomllib.loads((ROOT / "scripts" / "gpu-host" / f"{args.bundle}.toml").read_text())
    serve = dict(spec["serve"])
    # the spec's own switches that keep FlashInfer / DeepGEMM out are what this measures: drop them
    serve["env"] = [e for e in serve.get("env", []) if not e.startswith(("VLLM_USE_DEEP_GEMM=",))]
    python = str(STORE / f"py-{args.bundle}")
    sites = [STORE / f"site-{n}" for n in [args.bundle, *args.extra]]
    env = {**os.environ, "PYTHONPATH": ":".join(map(str, [*sites, ROOT])),
           "PATH": ":".join([*(str(s / "bin") for s in sites), os.environ.get("PATH", "")])}
    tmp = Path(tempfile.mkdtemp(prefix="jit-first-boot-"))
    rows = {}
    for phase in args.phases.split(","):
        ws = tmp / f"fi-{phase}"
        ws.mkdir()
        row = {}
        if phase == "prebuilt":
            row["prebuild_s"] = round(prebuild(python, env, ws, args.arch), 1)
            row["prebuilt_libraries"] = sorted(libraries(ws))
        row.update(boot(python, env, serve["cell"], serve, ws, args.strategy, args.engine_args, args.env,
                        tmp / f"report-{phase}", args.boot_timeout))
        rows[phase] = row
        print(f"== {phase}: " + json.dumps(row, sort_keys=True), flush=True)
    print(f"\n{'phase':<9} {'status':<6} {'ready s':>8} {'1st latency s':>14} {'prebuild s':>11}  built at boot")
    for phase, r in rows.items():
        f = r.get("figures", {})
        print(f"{phase:<9} {r['status']:<6} {f.get('boot_s', '-')!s:>8} {f.get('latency_s', '-')!s:>14} "
              f"{r.get('prebuild_s', '-')!s:>11}  {', '.join(Path(b).name for b in r['built']) or 'none'}")
    return 0 if all(r["status"] == "pass" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
