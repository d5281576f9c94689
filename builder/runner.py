"""runner: the one loop that executes a plan. For each cell: render its Dockerfile, then run the steps in
order — package steps once per wheel, then cell steps — and collect one StepResult per step and subject.

The gates live here and only here (GATES): a step runs only when every step it names has passed — for a
package step, for the same package; for a cell step, for every package of the cell. So nothing is cached
unless its audit passed and nothing is tagged unless every wheel passed its audit (and, as those steps
arrive, nothing is published unless smoke passed).

Any exception inside a step becomes that cell's failure with its message (the traceback goes to the cell's
log). Without --keep-going the run stops at the first failed cell; with it, the failed cell's other wheels
are still compiled, audited and cached, and the next cells run.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import signal
import ssl
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import docker, fanout, files, grammar, pins, render
from .image import ledger
from .cache import WheelCache
from .errors import BuilderError, Interrupted, UserError, signal_name
from .plan import CellPlan, WheelStep
from .resolve import Cell
from .resources import Host
from .steps import BuildOptions, CellContext, Status, Step, StepResult
from .steps.audit import AuditStep
from .steps.cache import CacheStep
from .steps.compile import CompileStep
from .steps.image import ARCHIVE, ImageStep
from .steps.publish import PublishStep
from .steps.smoke import SmokeStep

STEPS: tuple[Step, ...] = (CompileStep(), AuditStep(), CacheStep(), ImageStep(), SmokeStep(), PublishStep())


def steps_for(opts: BuildOptions) -> tuple[Step, ...]:
    """Every step for `builder publish` (opts.publish set); for build, all but publish."""
    return STEPS if opts.publish is not None else tuple(s for s in STEPS if s.name != "publish")

# step → the steps that must have passed before it runs
GATES: dict[str, tuple[str, ...]] = {
    "audit": ("compile",),
    "cache": ("audit",),  # nothing is cached unless its audit passed
    "image": ("compile", "audit"),  # nothing is tagged unless every wheel passed
    "smoke": ("image",),
    "publish": ("smoke",),  # nothing is published unless smoke passed
}


@dataclass
class CellOutcome:
    cell: Cell
    results: list[StepResult] = field(default_factory=list)
    seconds: float = 0.0
    log: Path | None = None
    interrupted: bool = False
    plan: CellPlan | None = None  # the plan the cell ran: its `source = "auto"` packages on the routes build chose
    builder: str | None = None  # with --builder A,B,...: the builder the cell was built on (builder/fanout.py)

    @property
    def ok(self) -> bool:
        return bool(self.results) and not any(r.status is Status.FAILED for r in self.results)

    @property
    def error(self) -> str:
        failed = next((r for r in self.results if r.status is Status.FAILED), None)
        return failed.reason.splitlines()[0] if failed and failed.reason else ""

    def artifact(self, step: str, key: str) -> str:
        return next((r.artifacts.get(key, "") for r in self.results if r.step == step and r.passed), "")

    def packages(self, reused: bool) -> list[str]:
        by_name = {p.name: p for p in self.cell.packages}
        return [f"{r.subject}=={by_name[r.subject].version}" for r in self.results
                if r.step == "compile" and r.passed and r.artifacts.get("reused") is reused]


def check_options(opts: BuildOptions) -> None:
    """Refuse bad option values before anything runs (before git hosts are asked, before Docker)."""
    if opts.ca_bundle is not None:
        check_ca_bundle(opts.ca_bundle)
    for name, value in (("--max-jobs", opts.max_jobs), ("--nvcc-threads", opts.nvcc_threads)):
        if value is not None and value < 1:
            raise UserError(f"{name}: must be at least 1, got {value}")
        if value is not None and value > 4096:
            raise UserError(f"{name}: must be at most 4096, got {value}")
    if opts.source_date_epoch is not None:
        grammar.check(grammar.source_date_epoch, opts.source_date_epoch, "SOURCE_DATE_EPOCH")
    if opts.compile_dist is not None and not os.environ.get("BUILDER_SCCACHE_DIST_TOKEN"):
        raise UserError("[defaults.cache] dist names a scheduler but BUILDER_SCCACHE_DIST_TOKEN is not set "
                        "(the client token of its client_auth)")
    namespace = os.environ.get("BUILDER_SCCACHE_NAMESPACE")
    if namespace is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", namespace):
        raise UserError(f"BUILDER_SCCACHE_NAMESPACE: {namespace!r} is not a name (letters, digits, '_', '.', '-'; "
                        "at most 64)")
    for flag, path in (("--work-dir", opts.work_dir), ("--log-dir", opts.log_dir), ("--pins-dir", opts.pins_dir)):
        if path is not None:
            grammar.check(grammar.path_argument, str(path), flag)
    if opts.smoke and opts.smoke_model != "tiny":  # found now, not after the compile and the image
        from .deploy.smoke import shapemodel

        shapemodel.check(opts.smoke_model, "--smoke-model")
        if not shapemodel.is_shape(opts.smoke_model):
            grammar.check(grammar.path_argument, opts.smoke_model, "--smoke-model")
            if not (Path(opts.smoke_model) / "config.json").is_file():
                raise UserError(f"--smoke-model {opts.smoke_model}: not a model directory (no config.json); give a "
                                f"local checkpoint, 'tiny' or {' / '.join(shapemodel.known())}")


def check_ca_bundle(path: Path) -> None:
    """The CA bundle is a readable file of PEM certificates that OpenSSL loads — checked here, not found out
    after the apt stage as "No matching distribution found"."""
    grammar.check(grammar.path_argument, str(path), "--ca-bundle")
    if not path.is_file():
        why = "no such file" if not path.exists() else "a directory" if path.is_dir() else "a FIFO, socket or device"
        raise UserError(f"--ca-bundle: {path} is not a file ({why})")
    text = files.read_text(path, "CA bundle (--ca-bundle / BUILDER_CA_BUNDLE)")
    if not text.strip():
        raise UserError(f"--ca-bundle: {path} is empty; pass a PEM file of CA certificates")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UserError(f"--ca-bundle: {path} holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)")
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, ValueError, OSError) as exc:
        raise UserError(f"--ca-bundle: {path}: OpenSSL cannot load its certificates ({exc})") from None


def check_writable(plans: list[CellPlan], opts: BuildOptions, cache: WheelCache) -> None:
    """Every directory the build will write is writable, before anything runs: the work and log dirs, the
    wheelhouse when a wheel will be stored, the pins dir when a cell's runtime pins or a compile's build pins
    may be recorded; the image ledger's place is a directory (or none yet)."""
    files.writable_dir(opts.work_dir, "--work-dir")
    files.writable_dir(opts.log_dir, "--log-dir")
    root = getattr(cache, "root", None)
    if root is not None and any(not w.reuse for p in plans for w in p.wheels):
        files.writable_dir(Path(root), "--wheelhouse")
    if opts.image_ledger is not None:  # a file or a symlink where the ledger goes (a read-only one only warns)
        ledger.check_dir(opts.image_ledger)
    if opts.pins_dir is not None and any(opts.refresh_pins or not (opts.pins_dir / f"{p.cell.id}.txt").is_file()
                                         or any(not w.reuse and not w.package.from_index for w in p.wheels)
                                         for p in plans):  # runtime pins, or a compile's build pins
        files.writable_dir(opts.pins_dir, "--pins-dir")


def check_compilers(plans: list[CellPlan]) -> None:
    """Refuse to compile a package whose build needs a newer GCC than the devel base's OS has (engine data
    min_gcc / base_os): the configure would stop after minutes of setup, e.g. vLLM 0.33 on Debian 12's 12.2."""
    old = [f"{p.cell.id}: {problem}" for p in plans for w in p.wheels if not w.reuse
           for problem in [w.package.gcc_problem()] if problem]
    if old:
        raise UserError("the devel base's compiler is too old:\n  " + "\n  ".join(old))


def check_pins(plans: list[CellPlan], opts: BuildOptions) -> None:
    """Refuse a recorded pins file that is cut short or carries pip options (pins.read), and refuse to compile a
    source known only by a movable name (a tag), unless allowed."""
    if opts.pins_dir is not None and not opts.refresh_pins:
        for p in plans:
            runtime = opts.pins_dir / f"{p.cell.id}.txt"
            if runtime.exists() or runtime.is_symlink():  # a FIFO or a directory in its place is refused too
                pins.read(runtime)
            for w in p.wheels:
                recorded = pins.build_pins_file(opts.pins_dir, p.cell.id, w.package.name)
                if recorded.exists() or recorded.is_symlink():
                    pins.read(recorded, need_hashes=True)
    if not opts.allow_unpinned:
        unpinned = [
            f"{p.cell.id}: {w.package.name} {w.package.version}: {what}"
            for p in plans
            for w in p.wheels
            if not w.reuse
            for what in w.package.unpinned()
        ]
        if unpinned:
            raise UserError(
                "sources not pinned to a commit (run `builder lock` where the git host is reachable, "
                "or pass --allow-unpinned to build from the tag):\n  " + "\n  ".join(unpinned)
            )


def os_error(exc: OSError) -> str:
    """An OSError as one line: the path(s) and the OS's own words."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    why = exc.strerror or str(exc)
    return f"{paths}: {why}" if paths else why


def _try_write(log, text: str) -> None:
    """Write to the cell's log unless the log itself is what failed (a full disk)."""
    try:
        log.write(text)
    except (OSError, ValueError):
        pass


def gate(step: Step, wheel: WheelStep | None, results: list[StepResult]) -> str | None:
    """Why `step` may not run (for `wheel`, or for the cell when None), or None when it may."""
    for need in GATES.get(step.name, ()):
        prior = [r for r in results if r.step == need and (wheel is None or r.subject == wheel.package.name)]
        if not prior:
            return f"{need} did not run"
        failed = [r.subject for r in prior if not r.passed]
        if failed:
            return f"{need} did not pass for {', '.join(failed)}"
    return None


def _work(plan: CellPlan, opts: BuildOptions, cache: WheelCache, host: Host, say, log) -> CellContext:
    return CellContext(plan=plan, opts=opts, cache=cache, host=host, say=say, log=log)


def run_cells(plans: list[CellPlan], cache: WheelCache, opts: BuildOptions, say: Callable[[str], None],
              host: Host | None = None, steps: tuple[Step, ...] | None = None) -> list[CellOutcome]:
    """Run every planned cell (stopping after the first failed one unless keep_going)."""
    steps = steps or steps_for(opts)
    check_options(opts)
    check_pins(plans, opts)
    check_compilers(plans)
    check_writable(plans, opts, cache)
    host = host or Host.detect()
    if len(opts.builders) > 1:
        return _fan_out(plans, cache, opts, say, host, steps)
    resolve_local_bases(plans, opts, say)
    return _in_order(plans, cache, opts, say, host, steps)


def _in_order(plans: list[CellPlan], cache: WheelCache, opts: BuildOptions, say: Callable[[str], None], host: Host,
              steps: tuple[Step, ...]) -> list[CellOutcome]:
    """The cells one after another on one builder, stopping after the first failed one unless keep_going."""
    outcomes: list[CellOutcome] = []
    for plan in plans:
        outcome = run_cell(plan, cache, opts, say, host, steps)
        outcomes.append(outcome)
        if outcome.interrupted or (not outcome.ok and not opts.keep_going):
            break
    return outcomes


def lanes(plans: list[CellPlan], builders: tuple[str, ...]) -> dict[str, list[CellPlan]]:
    """builder → the cells it builds, in plan order (builder/fanout.py assigns them); builders with no cell left out."""
    where = fanout.assign([p.cell.id for p in plans], builders)
    return {b: mine for b in builders if (mine := [p for p in plans if where[p.cell.id] == b])}


def lane_options(opts: BuildOptions, builder: str) -> BuildOptions:
    """The options of one builder's cells: that builder, and the display's lines prefixed with its name."""
    display = opts.display.lane(f"[builder {builder}] ") if opts.display is not None else None
    return dataclasses.replace(opts, builder=builder, display=display)


def _fan_out(plans: list[CellPlan], cache: WheelCache, opts: BuildOptions, say: Callable[[str], None], host: Host,
             steps: tuple[Step, ...]) -> list[CellOutcome]:
    """--builder A,B,...: one worker thread per builder, its cells in plan order (keep_going holds per builder: a
    failed cell stops the rest of its builder's cells only); the outcomes come back in plan order, each naming its
    builder. A cell that failed while its builder no longer answers says so."""
    done: dict[str, list[CellOutcome]] = {}
    crashed: list[BaseException] = []
    _FORWARDED.clear()

    def work(builder: str, mine: list[CellPlan]) -> None:
        lane_opts = lane_options(opts, builder)
        lane_say = lane_opts.display.say if lane_opts.display is not None else (lambda text: say(f"[builder {builder}] {text}"))
        outcomes: list[CellOutcome] = []
        done[builder] = outcomes
        try:
            resolve_local_bases(mine, lane_opts, lane_say)
            for plan in mine:
                outcome = run_cell(plan, cache, lane_opts, lane_say, host, steps)
                outcome.builder = builder
                outcomes.append(outcome)
                if not outcome.ok and not outcome.interrupted:
                    _blame_builder(outcome, builder, opts.docker, lane_say)
                if outcome.interrupted or (not outcome.ok and not opts.keep_going):
                    break
        except BaseException as exc:  # noqa: BLE001 — handed to the main thread, which raises it after the others end
            crashed.append(exc)

    workers = [threading.Thread(target=work, args=(b, mine), name=f"builder-{b}", daemon=True)
               for b, mine in lanes(plans, opts.builders).items()]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt as exc:  # signals reach the main thread only: stop every builder's running cell
        _interrupt(workers, exc)
        for worker in workers:
            worker.join()
    if crashed:
        raise crashed[0]
    order = {p.cell.id: i for i, p in enumerate(plans)}
    return sorted((o for outcomes in done.values() for o in outcomes), key=lambda o: order[o.cell.id])


def _blame_builder(outcome: CellOutcome, builder: str, docker_cli: str, say: Callable[[str], None]) -> None:
    """A failed cell whose builder no longer answers (its engine died mid-build) says so in its failure's reason."""
    why = fanout.not_answering(builder, docker_cli)
    failed = next((r for r in outcome.results if r.status is Status.FAILED), None)
    if why and failed is not None:
        failed.reason = f"builder {builder} does not answer ({why}): {failed.reason}"
        say(f"[{outcome.cell.id}] FAILED on builder {builder}, which does not answer: {why}")


# the interrupt _interrupt forwarded to the lanes of a fan-out (empty until then): a step that fails after it was
# stopped by it (runner.run_cell's attempt reports it as interrupted)
_FORWARDED: list[Interrupted] = []


def _interrupted(step: str, subject: str, exc: BaseException) -> StepResult:
    """The result of a step an interrupt stopped, naming the signal (and the command it stopped, when it says)."""
    stopped = getattr(exc, "stopped", "")
    return StepResult(step, subject, Status.FAILED, f"interrupted by {signal_name(exc)} during {step} of {subject}"
                      + (f": stopped {stopped}" if stopped else ""))


def _interrupt(workers: list[threading.Thread], exc: KeyboardInterrupt) -> None:
    """Raise the main thread's interrupt in every worker too (at its next Python instruction), then send SIGINT to
    this process's children (each streamed docker command leads a process group of its own: builder/docker.py
    stream), so a worker waiting on a silent build wakes up, and its step is recorded as interrupted, as one
    builder's cell would be."""
    import ctypes

    signum = getattr(exc, "signum", signal.SIGINT)
    _FORWARDED.append(Interrupted(signum))
    kind = type("Interrupted", (Interrupted,), {"__init__": lambda self: Interrupted.__init__(self, signum)})
    for worker in workers:
        if worker.is_alive() and worker.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(kind))
    for pid in docker.children(os.getpid()):
        try:
            os.killpg(pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            pass


def digest_pinned_bases(plans: list[CellPlan]) -> list[str]:
    """The base images the cells build FROM by digest, each once."""
    return sorted({ref for p in plans for ref in (p.cell.base_devel, p.cell.base_runtime) if "@sha256:" in ref})


def resolve_local_bases(plans: list[CellPlan], opts: BuildOptions, say: Callable[[str], None]) -> None:
    """Every base the cells build FROM by digest (matrix.lock pins it) that only the local daemon holds is
    resolved once by name before the builds, so BuildKit takes it from the local store instead of asking a
    registry that has never seen it (docker.make_local_digest_resolvable)."""
    import tempfile

    for ref in digest_pinned_bases(plans):
        tag = docker.local_tag_for_digest(ref, opts.docker)
        if not tag:
            continue  # not held here: BuildKit pulls it from its registry by digest
        with tempfile.TemporaryDirectory(prefix="builder-base-") as scratch:
            code, out = docker.make_local_digest_resolvable(ref, tag, Path(scratch), opts.builder, opts.docker)
        if code != 0:
            last = out.splitlines()[-1] if out else f"exit {code}"
            say(f"base {ref}: resolving it by name ({tag}) failed, BuildKit may ask its registry: {last}")


def run_cell(plan: CellPlan, cache: WheelCache, opts: BuildOptions, say: Callable[[str], None], host: Host,
             steps: tuple[Step, ...] = STEPS) -> CellOutcome:
    cell = plan.cell
    outcome = CellOutcome(cell, plan=plan)
    t0 = time.monotonic()
    cell_dir = opts.work_dir / cell.id
    auto = any(w.package.route is not None for w in plan.wheels)  # rendered once its routes are settled
    try:  # a filesystem fault here (work or log dir under a file, disk full) fails the cell, naming the path
        # the cell's work dir is made anew, but for the OCI archive of its last image: publish pushes it when the
        # image step finds that image is still this cell's (steps/image.py), instead of building it again
        kept = opts.work_dir / f".{cell.id}.{os.getpid()}.oci.tar"
        archive = cell_dir / ARCHIVE
        if archive.is_file() and not archive.is_symlink():
            os.replace(archive, kept)
        if cell_dir.exists():
            shutil.rmtree(cell_dir)
        (cell_dir / "context").mkdir(parents=True)
        if cell.criu:  # the patches the criu stage applies (dockerfiles/stages/criu.j2 copies them from the context)
            (cell_dir / "context" / "criu").mkdir()
            for patch in cell.criu["patch_paths"]:
                shutil.copyfile(patch, cell_dir / "context" / "criu" / patch.name)
        if kept.exists():
            os.replace(kept, archive)
        if not auto:
            (cell_dir / "Dockerfile").write_text(render.render(plan, opts.index_url, opts.compile_reaches_out))
        opts.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = (opts.log_dir / f"{cell.id}.log").open("w")
    except OSError as exc:
        outcome.results.append(StepResult("prepare", cell.id, Status.FAILED, f"cannot prepare the cell: {os_error(exc)}"))
        say(f"[{cell.id}] FAILED: {outcome.results[-1].reason}")
        outcome.seconds = time.monotonic() - t0
        return outcome
    outcome.log = opts.log_dir / f"{cell.id}.log"
    with log_file as log:
        ctx = _work(plan, opts, cache, host, say, log)
        stop = ""  # once set, the remaining steps of the cell are skipped with this reason
        if auto:
            stop = _settle(ctx, outcome, log)

        def attempt(step: Step, wheel: WheelStep | None) -> None:
            nonlocal stop
            subject = wheel.package.name if wheel else cell.id
            blocked = stop or gate(step, wheel, outcome.results)
            if blocked:
                outcome.results.append(StepResult(step.name, subject, Status.SKIPPED, f"not run: {blocked}"))
                return
            started = time.monotonic()
            try:
                result = step.run(ctx, wheel)
            except KeyboardInterrupt as exc:
                result = _interrupted(step.name, subject, exc)
                outcome.interrupted = True
            except BuilderError as exc:
                result = StepResult(step.name, subject, Status.FAILED, str(exc))
            except OSError as exc:  # a filesystem fault (read-only or full disk): the path and the OS's words
                _try_write(log, traceback.format_exc())
                why = os_error(exc) if exc.filename else f"{type(exc).__name__}: {exc}"
                result = StepResult(step.name, subject, Status.FAILED, f"{step.name} of {subject}: {why}"
                                    if exc.filename else why)
            except Exception as exc:  # a step's bug or an unexpected fault: the cell fails, the run goes on
                _try_write(log, traceback.format_exc())
                result = StepResult(step.name, subject, Status.FAILED, f"{type(exc).__name__}: {exc}")
            if result.status is Status.FAILED and not outcome.interrupted and _FORWARDED:
                # fanned out: the signal reached this lane's docker command before the worker's own interrupt, so
                # the command ended ("context canceled") and the step says it failed; it was interrupted
                _try_write(log, f"{step.name} of {subject} ended after {signal_name(_FORWARDED[0])} was forwarded: "
                                f"{result.reason}\n")
                result = _interrupted(step.name, subject, _FORWARDED[0])
                outcome.interrupted = True
            result.seconds = time.monotonic() - started
            outcome.results.append(result)
            if result.status is Status.FAILED:
                _try_write(log, f"FAILED {step.name} {subject}: {result.reason}\n")
                say(f"[{cell.id}] FAILED: {result.reason}")
                if outcome.interrupted:
                    stop = "interrupted"
                elif not opts.keep_going:
                    stop = f"{step.name} failed for {subject}"

        try:
            for wheel in ctx.plan.wheels:
                for step in steps:
                    if step.scope == "package":
                        attempt(step, wheel)
                ctx.release(wheel.package.name)  # the cache key's lock, held from compile to store
            for step in steps:
                if step.scope == "cell":
                    attempt(step, None)
        finally:
            ctx.release()
            ctx.drop_run_name()
    outcome.seconds = time.monotonic() - t0
    return outcome


def _settle(ctx: CellContext, outcome: CellOutcome, log) -> str:
    """Decide the cell's `source = "auto"` routes (builder/steps/route.py), then render its Dockerfile for them;
    why the cell stops here ("" when it goes on)."""
    from .steps.route import NAME, settle_routes

    cell = ctx.cell
    try:
        results = settle_routes(ctx)
    except KeyboardInterrupt as exc:
        outcome.interrupted = True
        results = [StepResult(NAME, cell.id, Status.FAILED, f"interrupted by {signal_name(exc)} while deciding routes")]
    except (BuilderError, OSError) as exc:
        _try_write(log, traceback.format_exc())
        results = [StepResult(NAME, cell.id, Status.FAILED, f"deciding the auto routes: "
                              f"{os_error(exc) if isinstance(exc, OSError) else exc}")]
    outcome.results += results
    outcome.cell, outcome.plan = ctx.cell, ctx.plan
    failed = next((r for r in results if r.status is Status.FAILED), None)
    if failed is None:
        try:
            ctx.dockerfile.write_text(render.render(ctx.plan, ctx.opts.index_url, ctx.opts.compile_reaches_out))
        except OSError as exc:
            failed = StepResult("prepare", cell.id, Status.FAILED, f"cannot prepare the cell: {os_error(exc)}")
            outcome.results.append(failed)
    if failed is not None:
        _try_write(log, f"FAILED {failed.step} {failed.subject}: {failed.reason}\n")
        ctx.say(f"[{cell.id}] FAILED: {failed.reason}")
        return "interrupted" if outcome.interrupted else f"{failed.step} failed for {failed.subject}"
    return ""


def dry_run(plans: list[CellPlan], cache: WheelCache, opts: BuildOptions, say: Callable[[str], None],
            host: Host | None = None, steps: tuple[Step, ...] | None = None) -> None:
    """Print what run_cells would do — the exact buildx command lines — and run nothing."""
    steps = steps or steps_for(opts)
    check_options(opts)
    check_pins(plans, opts)
    check_compilers(plans)
    host = host or Host.detect()
    for ref in digest_pinned_bases(plans):
        say(f"# base {ref}: where only the local daemon holds it, resolved by name first (a cache-only build of "
            f"FROM {ref.split('@', 1)[0]}), so BuildKit takes it from the local store")
    where = fanout.assign([p.cell.id for p in plans], opts.builders) if len(opts.builders) > 1 else {}
    for plan in plans:
        cell_opts = lane_options(opts, where[plan.cell.id]) if where else opts
        ctx = _work(plan, cell_opts, cache, host, say, io.StringIO())
        if where:
            say(f"# {plan.cell.id}: on builder {where[plan.cell.id]}")
        say(f"# {plan.cell.id}: `builder render --only {plan.cell.id}` writes {ctx.dockerfile}")
        for wheel in plan.wheels:
            if wheel.package.route is not None:
                say(f"# route {wheel.package.name}=={wheel.package.version}: auto → {wheel.package.route.summary}"
                    + ("" if wheel.package.route.fact else "; build downloads the pinned wheel and audits it to decide"))
        for wheel in plan.wheels:
            for step in steps:
                if step.scope == "package":
                    for line in step.dry_run(ctx, wheel):
                        say(line)
        for step in steps:
            if step.scope == "cell":
                for line in step.dry_run(ctx, None):
                    say(line)
