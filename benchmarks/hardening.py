"""Hardening figures (issue 8): how builder answers bad input, real faults, and whether a secret reaches an image.

    .venv/bin/python benchmarks/hardening.py            # everything (needs Docker and the local bases)
    .venv/bin/python benchmarks/hardening.py --inputs   # only the bad-input table (no Docker)
    .venv/bin/python benchmarks/hardening.py --quick    # the bad-input table on every 20th case (the suite's mode;
                                                        # tests/hardening/test_hardening.py runs every case)
    .venv/bin/python benchmarks/hardening.py --inputs --only w6-   # the cases whose id starts so (one round)

- inputs: every case of tests/hardening/cases.py through the real CLI on a copy of the fixture: clear (the
  expected exit code, a message naming the problem, no traceback, nothing written), tracebacks, silently
  accepted (exit 0), other (a wrong code or message, or something written);
- faults: real ones during real commands — a read-only and a full wheelhouse, a work dir under a file, no
  daemon, no docker, SIGTERM and SIGINT while BuildKit compiles, a corrupt wheel, 22 brace groups — and
  whether builder survived them (the right exit code, a clear message, no traceback, no tag, nothing left);
- secrets: a fresh build with a CA bundle and token-like environment variables carrying unique markers; the
  image (every layer, config and manifest of `docker save`), its history, the logs, the work dir, the wheels
  and their manifests and builder's own output are searched for the markers. Must be 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hardening import cases as hc  # noqa: E402

PY = [sys.executable, "-m", "builder.cli"]


def _tempdir(world: bool = False) -> Path:
    path = Path(tempfile.mkdtemp(prefix="builder-hardening-bench-", dir="/tmp"))
    if world:
        path.chmod(0o777)
    return path


def _rm(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=False)


# -- inputs -----------------------------------------------------------------------------------------------------

HANG_S = 120.0  # a case still running after this long is killed: a hang


def run_input(case: hc.Case) -> tuple[hc.Case, hc.Verdict, float]:
    tmp = _tempdir(world=case.as_nobody)
    try:
        hc.make_fixture(tmp, case)
        before = hc.snapshot(tmp)
        res = hc.run(case, tmp, timeout=HANG_S)
        after = hc.snapshot(tmp)
        hc.remeasure_cpu(case, res, lambda: hc.run(case, tmp))
        return case, hc.judge(case, res, before, after), (res.wall, res.cpu, len(res.calls))
    finally:
        _rm(tmp)


def inputs(every: int = 1, only: tuple[str, ...] = ()) -> bool:
    chosen = [c for c in hc.CASES if not only or c.id.startswith(only)][::every]
    if not chosen:
        print(f"no case of the table has an id starting with {' or '.join(only)}")
        return False
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run_input, chosen))
    tried = len(results)
    clear = sum(v.clear for _, v, _ in results)
    fine = sum(v.clear and c.cls == "fine" for c, v, _ in results)
    tracebacks = sum(v.traceback for _, v, _ in results)
    accepted = sum(v.accepted for _, v, _ in results)
    misleading = sum(v.misleading for _, v, _ in results)
    verbs: Counter = Counter()
    for case, _, _ in results:
        words = [a for a in case.args if not a.startswith("-") and "{" not in a][:2]
        verbs[" ".join(words[:2]) if words[:1] == ["wheels"] else words[0] if words else "?"] += 1
    per_class: Counter = Counter()
    per_class_clear: Counter = Counter()
    for case, v, _ in results:
        per_class[case.cls] += 1
        per_class_clear[case.cls] += v.clear
    print("bad inputs (tests/hardening/cases.py, each through the real CLI)")
    print(f"  inputs tried        {tried}")
    print(f"  clear               {clear} (of which fine: {fine}, inputs that are acceptable and ran as they should)")
    print(f"  misleading          {misleading}")
    print(f"  tracebacks          {tracebacks}")
    print(f"  silently accepted   {accepted}")
    print(f"  hangs               {sum(t[0] >= HANG_S for _, _, t in results)} (killed after {HANG_S:.0f} s)")
    print("  by verb             " + ", ".join(f"{v} {n}" for v, n in sorted(verbs.items())))
    print("  by class            " + ", ".join(f"{c} {per_class_clear[c]}/{n}" for c, n in per_class.items()))
    refused = [t for c, _, t in results if c.code == 2]
    watched = [t for c, _, t in results if hc._watched(c)]
    print(f"  slowest refusal     {max(t[0] for t in refused):.2f} s wall (4 cases at a time on this host), "
          f"{max(t[1] for t in refused):.2f} s CPU")
    cpu = sorted((t[1], c.id) for c, _, t in results if c.code == 2)
    print(f"  CPU of a refusal    median {cpu[len(cpu) // 2][0]:.2f} s; slowest "
          + ", ".join(f"{case} {sec:.2f} s" for sec, case in cpu[:-4:-1]))
    print(f"  docker/skopeo calls before a refusal: {sum(t[2] for t in watched)} in {len(watched)} watched refusals")
    for case, v, _ in results:
        if not v.clear:
            print(f"  NOT CLEAR {case.id}: {v.why.splitlines()[0]}")
    return clear == tried


# -- faults -----------------------------------------------------------------------------------------------------

def _fixture(tmp: Path) -> Path:
    hc.make_fixture(tmp)
    return tmp / "fx" / "matrix.toml"


def _build_argv(matrix: Path, tmp: Path, **paths) -> list[str]:
    p = {"wheelhouse": tmp / "wh", "work-dir": tmp / "w", "log-dir": tmp / "l", "pins-dir": tmp / "p", **paths}
    return [*PY, "build", "--matrix", str(matrix), *[x for k, v in p.items() for x in (f"--{k}", str(v))],
            "--ca-bundle", str(hc.HOST_CA), "--quiet"]


def _clean(res: subprocess.CompletedProcess) -> bool:
    return "Traceback (most recent call last)" not in res.stdout + res.stderr


class Mount:
    def __init__(self, size: str = "1m"):
        self.dir = _tempdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.dir)], check=True)

    def __enter__(self) -> Path:
        return self.dir

    def __exit__(self, *exc):
        subprocess.run(["umount", "-l", str(self.dir)], check=False)
        _rm(self.dir)


def fault_read_only_wheelhouse(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    with Mount() as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        res = subprocess.run(_build_argv(matrix, tmp, wheelhouse=mnt / "wh"), capture_output=True, text=True, cwd=tmp)
    ok = res.returncode == 2 and "Read-only file system" in res.stderr and _clean(res) and not (tmp / "w").exists()
    return ok, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"


def fault_full_wheelhouse(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    with Mount() as mnt:
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=64k"], capture_output=True)
        res = subprocess.run(_build_argv(matrix, tmp, wheelhouse=mnt / "wh"), capture_output=True, text=True, cwd=tmp)
        left = list((mnt / "wh").rglob("*.whl")) if (mnt / "wh").exists() else []
    tagged = subprocess.run(["docker", "image", "inspect", f"{hc.REGISTRY}/cuda-ext:1.0.0-cu130-py311-sm80.90"],
                            capture_output=True).returncode == 0
    ok = res.returncode == 1 and "No space left on device" in res.stdout and "(not tagged)" in res.stdout
    ok = ok and _clean(res) and not tagged and not left
    return ok, next((line for line in res.stdout.splitlines() if "No space" in line), f"exit {res.returncode}").strip()


def fault_dir_under_a_file(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    (tmp / "afile").write_text("x")
    res = subprocess.run(_build_argv(matrix, tmp, **{"log-dir": tmp / "afile" / "logs"}), capture_output=True, text=True, cwd=tmp)
    return res.returncode == 2 and "is a file" in res.stderr and _clean(res) and not (tmp / "w").exists(), res.stderr.strip()


def fault_no_daemon(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp}/no.sock"}
    res = subprocess.run(_build_argv(matrix, tmp), capture_output=True, text=True, cwd=tmp, env=env)
    return res.returncode == 3 and "not reachable" in res.stderr and _clean(res), res.stderr.strip().splitlines()[0]


def fault_no_docker(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    env = {**os.environ, "PATH": str(tmp)}
    res = subprocess.run(_build_argv(matrix, tmp), capture_output=True, text=True, cwd=tmp, env=env)
    return res.returncode == 3 and "docker" in res.stderr and _clean(res), res.stderr.strip().splitlines()[0]


def _interrupt(tmp: Path, sig: int) -> tuple[bool, str]:
    from tests.hardening.test_hardening import SLOW_KNOWLEDGE, SLOW_SETUP, _processes, _wait_for

    marker = f"{9000 + uuid.uuid4().int % 999}.{uuid.uuid4().int % 10**6:06d}"
    (tmp / "src").mkdir()
    (tmp / "src" / "setup.py").write_text(SLOW_SETUP.replace("{marker}", marker))
    (tmp / "engines.toml").write_text(SLOW_KNOWLEDGE)
    (tmp / "matrix.toml").write_text((hc.FIXTURE / "matrix.toml").read_text().replace("cuda-ext", "sleeper")
                                     .replace("builder-test", f"hardening-{hc.RUN_ID}"))
    proc = subprocess.Popen(_build_argv(tmp / "matrix.toml", tmp, **{"work-dir": tmp / "work"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp)
    try:
        _wait_for(lambda: [p for p, c in _processes() if c.startswith(f"sleep {marker}")], 600, "the compile")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = [(p, c) for p, c in _processes() if "buildx" in c and str(tmp / "work") in c]
    try:
        _wait_for(lambda: not [p for p, c in _processes() if c.startswith(f"sleep {marker}")], 60, "the compile to stop")
        stopped = True
    except AssertionError:
        stopped = False
    ok = proc.returncode == 128 + sig and "interrupted by" in err and "(not tagged)" in out and not left and stopped
    line = next((x for x in err.splitlines() if x.startswith("error: interrupted")), f"exit {proc.returncode}")
    return ok and "Traceback" not in out + err, f"exit {proc.returncode}; {line}; buildx left: {len(left)}; compile stopped: {stopped}"


def fault_sigterm(tmp: Path) -> tuple[bool, str]:
    return _interrupt(tmp, signal.SIGTERM)


def fault_sigint(tmp: Path) -> tuple[bool, str]:
    return _interrupt(tmp, signal.SIGINT)


def fault_corrupt_wheel(tmp: Path) -> tuple[bool, str]:
    whl = tmp / "bad-1.0-py3-none-any.whl"
    hc.wheel({"bad/_C.so": hc.HOST_ELF * 4}, corrupt=True)(whl)
    res = subprocess.run([*PY, "audit", str(whl), "--arch", "80"], capture_output=True, text=True, cwd=tmp)
    return res.returncode == 2 and "could not be read" in res.stderr and "OK:" not in res.stdout and _clean(res), \
        res.stderr.strip().splitlines()[-1]


def fault_brace_bomb(tmp: Path) -> tuple[bool, str]:
    matrix = _fixture(tmp)
    t0 = time.perf_counter()
    res = subprocess.run([*PY, "plan", "--matrix", str(matrix), "--only", "cuda-ext-" + "{0,1}" * 22 + "*"],
                         capture_output=True, text=True, cwd=tmp, timeout=60)
    took = time.perf_counter() - t0
    return res.returncode == 2 and took < 5 and _clean(res), f"22 brace groups answered in {took:.2f}s"


PEAK_RSS: list[int] = []  # MB, every verb against the 2 GB remote


def _hostile(mode: str):
    def fault(tmp: Path) -> tuple[bool, str]:
        from tests import hostile
        from tests.unit.net.test_hostile_remotes import RSS_LIMIT_MB, run, verbs

        hc.make_fixture(tmp)
        (tmp / "real.toml").write_text((REPO / "matrix.toml").read_text())
        (tmp / "real.lock").write_text((REPO / "matrix.lock").read_text())
        bad, rss, slowest = [], [], 0.0
        with hostile.serve(mode) as (host, _):
            for name, argv in verbs(tmp, host).items():
                env = {"BUILDER_REGISTRY_USER": "u", "BUILDER_REGISTRY_PASSWORD": "p"} if mode == "401" else {}
                code, err, took, peak = run(argv, tmp, env)
                rss.append(peak)
                slowest = max(slowest, took)
                errors = [line for line in err.splitlines() if line.startswith("error: ")]
                if code != 3 or "Traceback" in err or len(errors) != 1 or host not in errors[0] or peak >= RSS_LIMIT_MB:
                    bad.append(f"{name}: exit {code}, {peak} MB")
        if mode.startswith("huge"):
            PEAK_RSS.extend(rss)
        return not bad, (f"{len(rss)} verbs: exit 3 naming the remote, slowest {slowest:.1f} s, peak RSS {max(rss)} MB"
                         + (f"; FAILED {bad}" if bad else ""))

    fault.__name__ = f"fault_remote_{mode.replace('-', '_')}"
    return fault


def fault_foreign_wheelhouse(tmp: Path) -> tuple[bool, str]:
    """prune (every flag) and verify --quarantine against a wheelhouse full of foreign files and directories."""
    from builder.cache.local import Wheelhouse
    from tests.support.wheelhouse_ownership import OWN_GOOD, own_entry
    from tests.docker.cache.test_wheelhouse_ownership import fingerprint, foreign_tree

    root, outside = tmp / "wh", tmp / "outside"
    own = own_entry(Wheelhouse(root), OWN_GOOD, tmp)
    foreign_tree(root, outside)
    before = fingerprint(root, skip=(own,))
    for argv in (["wheels", "verify", "--wheelhouse", str(root), "--quarantine"],
                 ["wheels", "prune", "--matrix", str(hc.FIXTURE / "matrix.toml"), "--wheelhouse", str(root), "--unused",
                  "--older-than", "0", "--leftovers"]):
        subprocess.run([*PY, *argv], capture_output=True, text=True, cwd=tmp)
    after = fingerprint(root)
    touched = [k for k, v in before.items() if after.get(k) != v]
    ok = not touched and not own.exists()
    return ok, f"{len(before)} foreign paths, {len(touched)} touched; builder's own entry removed: {not own.exists()}"


def fault_push_to_a_registry_that_keeps_nothing(tmp: Path) -> tuple[bool, str]:
    from builder.cache.local import MANIFEST, Wheelhouse
    from tests import hostile
    from tests.unit.net.test_hostile_remotes import run
    from tests.support.wheelhouse_ownership import OWN_GOOD, own_entry

    wh = Wheelhouse(tmp / "wh")
    entry = own_entry(wh, OWN_GOOD, tmp)
    before = (entry / MANIFEST).read_bytes()
    with hostile.serve("liar") as (host, _):
        code, err, _, _ = run(["wheels", "push", "--matrix", str(hc.FIXTURE / "matrix.toml"), "--wheelhouse", str(wh.root),
                               "--cache-remote", f"registry:{host}/w", "--key", f"demo:{OWN_GOOD}"], tmp)
    ok = code == 3 and "reading it back" in err and (entry / MANIFEST).read_bytes() == before and "Traceback" not in err
    return ok, f"exit {code}; manifest unchanged: {(entry / MANIFEST).read_bytes() == before}"


FAULTS = [fault_read_only_wheelhouse, fault_full_wheelhouse, fault_dir_under_a_file, fault_no_daemon, fault_no_docker,
          fault_sigterm, fault_sigint, fault_corrupt_wheel, fault_brace_bomb, fault_foreign_wheelhouse,
          *[_hostile(mode) for mode in ("500", "garbage", "hang", "redirect", "401", "huge", "huge-declared", "drip",
                                       "drip-v2", "drip-headers")],
          fault_push_to_a_registry_that_keeps_nothing]


def faults() -> bool:
    survived = 0
    print("faults (real: tmpfs mounts, a missing daemon, signals to a running build)")
    for fault in FAULTS:
        tmp = _tempdir()
        try:
            ok, detail = fault(tmp)
        except Exception as exc:  # a fault the harness itself could not stage counts as not survived
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        finally:
            _rm(tmp)
        survived += ok
        print(f"  {'survived' if ok else 'FAILED  '}  {fault.__name__.removeprefix('fault_'):<22} {detail}")
    print(f"  faults tried        {len(FAULTS)}")
    print(f"  survived            {survived}")
    if PEAK_RSS:
        print(f"  peak RSS against the 2 GB remote: {max(PEAK_RSS)} MB (limit 300 MB; {len(PEAK_RSS)} runs)")
    return survived == len(FAULTS)


# -- secrets ----------------------------------------------------------------------------------------------------

def secrets() -> bool:
    tmp = _tempdir()
    try:
        matrix = _fixture(tmp)
        markers = {name: f"builder-secret-{name.lower()}-{uuid.uuid4().hex}" for name in
                   ("CA", "HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "NPM_TOKEN")}
        ca = tmp / "ca.pem"
        ca.write_text(f"# {markers['CA']}\n" + hc.HOST_CA.read_text())
        env = {**os.environ, **{k: v for k, v in markers.items() if k != "CA"},
               "SOURCE_DATE_EPOCH": str(1_600_000_000 + uuid.uuid4().int % 10**6)}  # the compile and runtime really run
        argv = _build_argv(matrix, tmp)
        argv[argv.index("--ca-bundle") + 1] = str(ca)
        res = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=tmp, env=env)
        if res.returncode != 0:
            print(f"secrets: the build failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
            return False
        ref = json.loads(res.stdout)[0]["image"]
        searched: dict[str, bytes] = {"builder output": (res.stdout + res.stderr).encode()}
        tar = tmp / "image.tar"
        subprocess.run(["docker", "save", "-o", str(tar), ref], check=True)
        searched["image (docker save: layers, config, manifest)"] = tar.read_bytes()
        from tests.docker.net.test_secret_probe import _blobs  # every blob, gzip layers decompressed (their bytes hide a marker)

        searched.update({f"image blob {name}": data for name, data in _blobs(tar).items()})
        searched["image history"] = subprocess.run(["docker", "history", "--no-trunc", ref], capture_output=True,
                                                   check=True).stdout
        searched["image inspect"] = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=True).stdout
        for d in ("l", "w", "wh", "p"):
            for f in (tmp / d).rglob("*"):
                if f.is_file():
                    searched[f"{d}/{f.relative_to(tmp / d)}"] = f.read_bytes()
        found = [(where, name) for where, data in searched.items() for name, m in markers.items() if m.encode() in data]
        subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)
        print("secrets (a CA bundle and token variables with unique markers, one fresh build)")
        print(f"  places searched     {len(searched)} (image tar {len(searched['image (docker save: layers, config, manifest)']) >> 20} MiB, "
              f"history, inspect, logs, work dir, wheels, manifests, output)")
        print(f"  secrets found in layers: {len(found)}" + (f" {found}" if found else ""))
        return not found
    finally:
        _rm(tmp)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", action="store_true", help="only the bad-input table (no Docker needed)")
    ap.add_argument("--remotes", action="store_true", help="only the hostile remotes and the foreign wheelhouse")
    ap.add_argument("--quick", action="store_true", help="only the bad-input table, on every 20th case")
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX",
                    help="with --inputs or --quick: only the cases whose id starts with PREFIX (repeatable), e.g. w6-")
    args = ap.parse_args()
    if args.only and not (args.inputs or args.quick):
        ap.error("--only chooses bad-input cases: give it with --inputs or --quick")
    if args.quick:
        return 0 if inputs(every=20, only=tuple(args.only)) else 1
    if args.remotes:
        FAULTS[:] = [f for f in FAULTS if f.__name__.startswith(("fault_remote_", "fault_foreign", "fault_push"))]
        return 0 if faults() else 1
    ok = inputs(only=tuple(args.only))
    if not args.inputs:
        print()
        ok = faults() and ok
        print()
        ok = secrets() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
