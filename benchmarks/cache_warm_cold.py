"""The wheel cache's payoff on the fixture cell (tests/fixtures/cuda-ext), one run each, on this machine:

  cold         nothing cached (empty wheelhouse, BuildKit --no-cache): the wheel is compiled, audited, stored
               and pushed to the registry (write-through)
  warm remote  an empty wheelhouse, the wheel only in the registry: looked up, downloaded, verified, stored
  warm local   the wheel in the wheelhouse

Goals: the warm builds' wheel step ≤ 5 % of the cold compile; the warm path's own overhead (lookup + download +
verify + store, measured in-process on the same artifact) under 3 s. Also: the verify cost per GB of wheels
(sha256 of the files; and the index form's member-by-member check).

The registry is a real one on 127.0.0.1 with htpasswd auth, run as a container (tests/services.py).

    .venv/bin/python benchmarks/cache_warm_cold.py
    .venv/bin/python benchmarks/cache_warm_cold.py --quick   # the big artifact 64 MB, not 512 MB (the suite's mode)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import CA, FIXTURE_MATRIX, REPO, ensure_local_bases  # noqa: E402


def build(work: Path, wheelhouse: str, *extra: str, env: dict) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "builder.cli", "build", "--matrix", str(FIXTURE_MATRIX), "--arch", "80,90",
            "--ca-bundle", CA, "--wheelhouse", str(work / wheelhouse), "--work-dir", str(work / "w"),
            "--log-dir", str(work / f"logs-{wheelhouse}"), "--pins-dir", str(work / "pins"), "--quiet", "--json", *extra]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, **env})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"build failed ({res.returncode}):\n{res.stderr[-3000:]}")
    (cell,) = json.loads(res.stdout)
    return wall, {s["step"]: s for s in cell["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 64 MB big artifact instead of 512 MB")
    big_parts = 1 if ap.parse_args().quick else 8
    from builder.cache import sha256_file
    from builder.cache.config import parse_spec
    from builder.cache.index import label_for, relabel, verify_labelled
    from builder.cache.local import Wheelhouse
    from builder.cache.tiered import cache_for
    from tests import services

    ensure_local_bases()
    services.build_image(services.REGISTRY_IMAGE, services.SERVICES / "registry")
    work = Path(tempfile.mkdtemp(prefix="builder-bench-cache-"))
    user, password = "bench", "pw-" + os.urandom(6).hex()
    env = {"BUILDER_REGISTRY_USER": user, "BUILDER_REGISTRY_PASSWORD": password}
    os.environ.update(env)
    try:
        with services.registry(user, password) as reg:
            remote = f"registry:{reg.host}/builder-bench/wheels"
            cold_wall, cold = build(work, "wh-cold", "--no-cache", "--cache-remote", remote, env=env)
            remote_wall, warm_remote = build(work, "wh-remote", "--cache-remote", remote, env=env)
            local_wall, warm_local = build(work, "wh-cold", "--no-remote", env=env)
            assert warm_remote["compile"]["artifacts"]["reused"] and warm_local["compile"]["artifacts"]["reused"]
            compile_s = cold["compile"]["seconds"]

            # the warm path in-process, on the same artifact: lookup, then download + verify + store
            (key,) = [p.name for p in (work / "wh-cold" / "cuda-ext").iterdir()]
            cache = cache_for(Wheelhouse(work / "wh-probe"), [parse_spec(remote, "bench", "")])
            t0 = time.perf_counter()
            hit = cache.lookup("cuda-ext", key, (80, 90))
            t1 = time.perf_counter()
            files = cache.fetch(hit, work / "probe-out")
            t2 = time.perf_counter()
            wheel_mb = sum(f.stat().st_size for f in files) / 1e6

            # bigger artifact: 512 MB (--quick: 64 MB) of incompressible wheel through the same registry
            big_dir = work / "big"
            big_dir.mkdir()
            big = big_dir / "big_ext-1.0.0-cp311-cp311-linux_x86_64.whl"
            import zipfile

            with zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as zf:
                zf.writestr("big_ext/__init__.py", "")
                for i in range(big_parts):
                    zf.writestr(f"big_ext/lib{i}.so", os.urandom(64 << 20))
                zf.writestr("big_ext-1.0.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: big-ext\nVersion: 1.0.0\n")
                zf.writestr("big_ext-1.0.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
                zf.writestr("big_ext-1.0.0.dist-info/RECORD", "")
            gb = big.stat().st_size / 1e9
            t = time.perf_counter()
            sha256_file(big)
            sha_per_gb = (time.perf_counter() - t) / gb
            from builder.cache import file_records

            bkey = "b" * 64
            meta = {"format": 2, "package": "big-ext", "version": "1.0.0", "key": bkey, "wheels": [big.name],
                    "files": file_records([big]), "compiled": False, "audit": {"ok": True, "archs": [80, 90]},
                    "key_inputs": {"cuda": "13.0.88"}}
            labelled = relabel(big, label_for(meta, bkey), meta, big_dir)
            t = time.perf_counter()
            verify_labelled(labelled, "big-ext", bkey, (80, 90))
            members_per_gb = (time.perf_counter() - t) / (labelled.stat().st_size / 1e9)
            pusher = cache_for(Wheelhouse(work / "wh-big"), [parse_spec(remote, "bench", "")])
            t = time.perf_counter()
            note = pusher.store("big-ext", bkey, [big], meta).notes[0]
            push_s = time.perf_counter() - t
            if not note.startswith("pushed"):
                logs = b"".join(reg.container.get_logs()).decode(errors="replace")
                sys.exit(f"{note}\nregistry log (tail):\n" + "\n".join(logs.splitlines()[-8:]))
            puller = cache_for(Wheelhouse(work / "wh-big2"), [parse_spec(remote, "bench", "")])
            t = time.perf_counter()
            bhit = puller.lookup("big-ext", bkey, (80, 90))
            puller.fetch(bhit, work / "big-out")
            pull_s = time.perf_counter() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def pct(x: float) -> str:  # step seconds come rounded to 0.1 s in --json
        return f"{'< 0.1' if x < 0.05 else f'{x:.1f}'} s, {'< ' if x < 0.05 else ''}{100 * max(x, 0.05) / compile_s:.1f} % of the cold compile"

    print(f"fixture cell cuda-ext 1.0.0 (sm_80 + sm_90), wheel {wheel_mb:.2f} MB, registry with basic auth on 127.0.0.1")
    print(f"  cold         build {cold_wall:6.1f} s   compile {compile_s:6.2f} s   cache+push {cold['cache']['seconds']:5.2f} s")
    print(f"  warm remote  build {remote_wall:6.1f} s   wheel step {pct(warm_remote['compile']['seconds'])}   "
          f"image {warm_remote['image']['seconds']:5.1f} s")
    print(f"  warm local   build {local_wall:6.1f} s   wheel step {pct(warm_local['compile']['seconds'])}   "
          f"image {warm_local['image']['seconds']:5.1f} s")
    print("  (image: the runtime stage; the first build records runtime pins, so the second one's pip layer is new)")
    print(f"  warm path overhead (in-process): lookup {t1 - t0:.3f} s + download/verify/store {t2 - t1:.3f} s = "
          f"{t2 - t0:.3f} s (goal < 3 s) = {100 * (t2 - t0) / compile_s:.2f} % of the cold compile (goal ≤ 5 %)")
    print(f"verify cost: sha256 of wheel files {sha_per_gb:.2f} s/GB; index form (every member vs manifest and RECORD) "
          f"{members_per_gb:.2f} s/GB")
    print(f"{64 * big_parts} MB-class artifact ({gb:.2f} GB): push {push_s:.1f} s, lookup + pull + verify + store {pull_s:.1f} s "
          f"({pull_s / gb:.1f} s/GB)")


if __name__ == "__main__":
    main()
