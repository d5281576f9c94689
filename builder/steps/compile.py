"""compile: one package's wheel — fetched from the wheel cache when its key is there, else compiled by
BuildKit (`--target wheels-<package>`) and exported to the cell's work dir; a package the profile takes from
the index (profiles.<name>.source) is downloaded instead, pinned by the sha256 matrix.lock records, and then
audited like a compiled one."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import time
from pathlib import Path

from .. import docker, pins
from ..cache import CacheCorrupt, file_records
from ..net import with_timeouts
from ..compile_cache import DIST_SECRET_ID, SECRET_ID, describe, read_stats, write_dist_config
from ..download import fetch_pinned
from ..estimate import threads
from ..progress import duration
from ..plan import WheelStep
from ..resources import Parallelism, choose
from ..route import keep_download
from . import CellContext, Status, StepResult, common_build_args


def compile_cache_secret(ctx: CellContext) -> Path:
    """Where the shared compile cache's settings and credentials are written for BuildKit (secret `sccache`)."""
    return ctx.dir / "sccache.secret"


def dist_config_secret(ctx: CellContext) -> Path:
    """Where the sccache-dist client configuration is written for BuildKit (secret `sccache-dist`)."""
    return ctx.dir / "sccache-dist.secret"


def wheel_call(ctx: CellContext, wheel: WheelStep) -> tuple[Parallelism, docker.BuildxCall]:
    opts = ctx.opts
    par = choose(wheel.package.recipe, ctx.host, opts.max_jobs, opts.nvcc_threads)
    common = common_build_args(ctx)
    common["build_args"] += (("MAX_JOBS", str(par.max_jobs)), ("NVCC_THREADS", str(par.nvcc_threads)))
    namespace = os.environ.get("BUILDER_SCCACHE_NAMESPACE")
    if namespace:  # a local object cache of its own on this build host (a cold one: a new name)
        common["build_args"] += (("SCCACHE_NAMESPACE", namespace),)
    if opts.compile_cache is not None:  # the compile RUN reaches the shared backend (builder/compile_cache.py)
        common["secrets"] += ((SECRET_ID, str(compile_cache_secret(ctx))),)
    if opts.compile_dist is not None:
        common["secrets"] += ((DIST_SECRET_ID, str(dist_config_secret(ctx))),)
    if opts.compile_reaches_out:
        common["extra"] += ("--allow", "network.host")
    out = ctx.out_dir(wheel.package.name)
    return par, docker.BuildxCall(target=f"wheels-{wheel.package.name}", output=docker.csv_options(type="local", dest=out), **common)


def _wheel_artifacts(records: dict[str, dict]) -> dict:
    return {"wheels": [{"file": name, **rec} for name, rec in records.items()]}


class CompileStep:
    name = "compile"
    scope = "package"

    def _cached(self, ctx: CellContext, wheel: WheelStep) -> list[Path] | None:
        """The package's wheels from the cache, verified, or None. A bad entry is reported, taken out of
        service (the local store quarantines it) and treated as a miss."""
        pkg = wheel.package
        hit = ctx.cache.lookup(pkg.name, wheel.key, pkg.cache_archs)
        if hit is None:
            return None
        if hit.usable:
            try:
                wheels = ctx.cache.fetch(hit, ctx.out_dir(pkg.name))
            except CacheCorrupt as exc:
                hit = dataclasses.replace(hit, problem=str(exc))
            else:
                ctx.reused[pkg.name] = hit
                return wheels
        where = ctx.cache.discard(hit, hit.problem)
        if not hit.remote and not where and Path(hit.location).exists():  # not provably builder's: never moved
            raise CacheCorrupt(f"{hit.location} holds no entry builder may replace ({hit.problem}); builder moves "
                               "only its own entries: move it away by hand, then build again (nothing was compiled)")
        ctx.note(f"cache entry of {pkg.name}=={pkg.version} (key {wheel.short_key}) is bad: {hit.problem}; "
                 f"{where if hit.remote else 'moved to ' + where if where else 'discarded'}; compiling again")
        return None

    def run(self, ctx: CellContext, wheel: WheelStep) -> StepResult:
        pkg = wheel.package
        label = f"{pkg.name}=={pkg.version}"
        out = ctx.out_dir(pkg.name)
        wheels = self._cached(ctx, wheel)
        if wheels is None:
            # One compile per key across concurrent builds: hold the key's lock until the wheel is stored
            # (the runner releases it after the package's steps), then look again — the build we waited for
            # may have stored it.
            ctx.hold(pkg.name, ctx.cache.lock(pkg.name, wheel.key, waiting=ctx.note))
            wheels = self._cached(ctx, wheel)
        if wheels is not None:
            hit = ctx.reused[pkg.name]
            ctx.note(f"reuse {label} (key {wheel.short_key}, {hit.store}; sha256 verified)")
            ctx.wheels[pkg.name] = wheels
            ctx.records[pkg.name] = {w.name: hit.manifest["files"][w.name] for w in wheels}  # verified by fetch
            return StepResult(self.name, pkg.name, Status.OK, f"cache hit in {hit.store}",
                              artifacts={"reused": True, "cached_in": hit.store, **_wheel_artifacts(ctx.records[pkg.name])})
        if out.exists():
            shutil.rmtree(out)
        if pkg.from_index:
            return self._download(ctx, wheel)
        par, call = wheel_call(ctx, wheel)
        ctx.note(f"build {label} (key {wheel.short_key}): {par.why}"
                 + (f"; estimate {duration(wheel.estimate.seconds)}" if wheel.estimate else ""))
        tracker = ctx.display.track(f"[{ctx.cell.id}] {label}", wheel.estimate.seconds if wheel.estimate else None)
        secrets = []
        try:
            if ctx.opts.compile_cache is not None:
                secrets.append(ctx.opts.compile_cache.write_secret(compile_cache_secret(ctx)))
            if ctx.opts.compile_dist is not None:
                secrets.append(write_dist_config(ctx.opts.compile_dist, dist_config_secret(ctx)))
            locked = self._build_pins_in_context(ctx, wheel)
            seconds = docker.stream(call.argv(ctx.opts.docker), ctx.log, ctx.echo(tracker))
        finally:
            ctx.display.finish(tracker)
            for secret in secrets:
                secret.unlink(missing_ok=True)  # credentials stay on disk no longer than the build
            shutil.rmtree(ctx.context_dir / pins.BUILD_PINS_IN_CONTEXT, ignore_errors=True)  # this compile's only
        self._record_build_pins(ctx, wheel, locked)
        sccache = read_stats(out)
        ctx.compiles[pkg.name] = {
            "seconds": round(seconds, 1),
            "objects": tracker.objects,
            "max_jobs": par.max_jobs,
            "nvcc_threads": par.nvcc_threads,
            "threads": threads(par.max_jobs, par.nvcc_threads, pkg.recipe.parallelism == "total-threads"),
            "archs": max(1, len(pkg.built_archs)),
            "cores": ctx.host.cores,
            "free_gb": ctx.host.free_gb,
            "peak_memory_gb": None,  # BuildKit's docker driver reports no per-step memory
            "estimate_s": round(wheel.estimate.seconds, 1) if wheel.estimate else None,
            # the object cache under the compile: hits, misses, compiler seconds (builder/compile_cache.py)
            "sccache": sccache,
            "compile_cache": ctx.opts.compile_cache.url if ctx.opts.compile_cache is not None else "local",
            "compile_dist": ctx.opts.compile_dist,
            "dist_cores": ctx.opts.compile_dist_cores if ctx.opts.compile_dist else 0,
        }
        if sccache:
            ctx.note(f"{label}: {describe(sccache)}, compilers ran {duration(sccache['compiler_seconds'])}")
        wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
        if not wheels:
            return StepResult(self.name, pkg.name, Status.FAILED,
                              f"the wheels-{pkg.name} stage exported no .whl into {out}")
        ctx.wheels[pkg.name] = wheels
        ctx.records[pkg.name] = file_records(wheels)  # hashed before the audit reads them: what is audited is stored
        return StepResult(self.name, pkg.name, Status.OK, par.why,
                          artifacts={"reused": False, "compile": ctx.compiles[pkg.name],
                                     **_wheel_artifacts(ctx.records[pkg.name])})

    @staticmethod
    def _build_pins_in_context(ctx: CellContext, wheel: WheelStep) -> Path | None:
        """The package's recorded build pins, put where its build-requirements RUN finds them (the build
        context's build-pins/<package>.txt); None when there are none (or --refresh-pins): that RUN resolves."""
        opts, pkg = ctx.opts, wheel.package
        if opts.pins_dir is None or opts.refresh_pins:
            return None
        recorded = pins.build_pins_file(opts.pins_dir, ctx.cell.id, pkg.name)
        if not recorded.is_file():
            return None
        pins.read(recorded, need_hashes=True)  # checked line by line (runner.check_pins did before the build)
        where = ctx.context_dir / pins.BUILD_PINS_IN_CONTEXT
        where.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(recorded, where / f"{pkg.name}.txt")
        ctx.note(f"build requirements of {pkg.name} hash-locked by {recorded}")
        return recorded

    @staticmethod
    def _record_build_pins(ctx: CellContext, wheel: WheelStep, locked: Path | None) -> None:
        """After a compile that resolved its build requirements: record them, hash-locked, for the next ones."""
        report = ctx.out_dir(wheel.package.name) / pins.BUILD_REPORT
        if not report.is_file():
            return
        if locked is not None or ctx.opts.pins_dir is None:
            report.unlink()
            return
        dest = pins.build_pins_file(ctx.opts.pins_dir, ctx.cell.id, wheel.package.name)
        count, why = pins.record_build(report, dest, ctx.cell, wheel.package.name)
        ctx.note(f"recorded the {count} build requirements pip installed for {wheel.package.name} in {dest}, each "
                 "with its sha256" if count else f"no build pins recorded for {wheel.package.name}: {why}")

    def _download(self, ctx: CellContext, wheel: WheelStep) -> StepResult:
        pkg, src = wheel.package, wheel.package.source
        start = time.monotonic()
        if pkg.name in ctx.prefetched:  # downloaded (sha256 checked) and audited when its auto route was decided
            ctx.note(f"take {pkg.name}=={pkg.version} from the index: {src.filename}, downloaded when its route was "
                     "decided (sha256 verified)")
            path = keep_download(ctx.prefetched[pkg.name], ctx.out_dir(pkg.name) / src.filename)
        else:
            ctx.note(f"download {pkg.name}=={pkg.version} from the index: {src.url} (sha256 {src.sha256[:16]}…)")
            import requests  # here: a build refused before its first download does not pay for importing it

            with with_timeouts(requests.Session()) as session:
                path = fetch_pinned(session, src.url, ctx.out_dir(pkg.name) / src.filename, src.sha256)
        ctx.wheels[pkg.name] = [path]
        ctx.records[pkg.name] = file_records([path])
        seconds = time.monotonic() - start
        return StepResult(self.name, pkg.name, Status.OK,
                          f"from the index ({src.filename}, {path.stat().st_size / 1e6:.0f} MB in {duration(seconds)})",
                          artifacts={"reused": False, "from_index": src.url, **_wheel_artifacts(ctx.records[pkg.name])})

    def dry_run(self, ctx: CellContext, wheel: WheelStep) -> list[str]:
        pkg = wheel.package
        if wheel.reuse:
            return [f"# reuse {pkg.name}=={pkg.version} from {wheel.hit.store}: {wheel.hit.location}"]
        if pkg.from_index:
            return [f"# download {pkg.name}=={pkg.version} from the index, sha256 {pkg.source.sha256}: {pkg.source.url}"]
        par, call = wheel_call(ctx, wheel)
        return [f"# {pkg.name}: {par.why}", shlex.join(call.argv(ctx.opts.docker))]
