"""The steps of a build, over one small protocol. The runner (builder/runner.py) drives them, in order, for
each cell; the gates between them live in the runner, not here.

A step has a `name`, a `scope` ("package": once per wheel of the cell; "cell": once per cell) and
`run(ctx, wheel) -> StepResult` (`wheel` is None for cell steps). A step reports
failure by returning a failed result or by raising: the runner turns any exception into that cell's
failure. `dry_run(ctx, wheel)` says what it would do without doing it.

Adding a step (smoke, publish) means one new module here and one entry in runner.STEPS.
"""

from __future__ import annotations

import contextlib
import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, TextIO

from .. import gitmirror
from ..progress import Display, Tracker

_QUIET = Display("quiet")

if TYPE_CHECKING:
    from ..audit import AuditReport
    from ..compile_cache import CompileCache
    from ..image.publish import Target
    from ..registry_api import RegistryPath
    from ..cache import CacheHit, WheelCache
    from ..plan import CellPlan, WheelStep
    from ..resources import Host


class Status(str, enum.Enum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class StepResult:
    step: str
    subject: str  # the package for package steps, the cell id for cell steps
    status: Status
    reason: str = ""
    seconds: float = 0.0
    artifacts: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status is Status.OK

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "subject": self.subject,
            "status": self.status.value,
            "reason": self.reason or None,
            "seconds": round(self.seconds, 1),
            "artifacts": self.artifacts,
        }


@dataclass(frozen=True)
class BuildOptions:
    work_dir: Path
    log_dir: Path
    index_url: str
    dry_run: bool = False
    keep_going: bool = False
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    ca_bundle: Path | None = None
    allow_unpinned: bool = False
    source_date_epoch: str | None = None
    pins_dir: Path | None = None  # runtime-pins/ next to the matrix (see builder/pins.py)
    refresh_pins: bool = False
    no_cache: bool = False  # ignore BuildKit's layer cache (the wheel cache still decides what is compiled)
    # how compiles report progress (builder/progress.py); the CLI makes one Display per run and says through it
    display: Display | None = field(default=None, compare=False)
    docker: str = "docker"
    smoke: bool = True  # run the smoke step (build --no-smoke: skipped, and nothing can be published)
    smoke_model: str = "tiny"  # what smoke serves: a local checkpoint directory or the generated tiny model
    builder: str | None = None  # the buildx builder (or docker context) that builds this cell; None: the current one
    # --builder A,B,...: the builders the cells are spread over (builder/fanout.py); () or one: `builder` builds all
    builders: tuple[str, ...] = ()
    layer_cache: str | None = None  # --layer-cache: a registry repository for BuildKit's layer cache
    attest: tuple[str, ...] = ()  # --provenance / --sbom: attestations of the runtime image (buildx --attest)
    layer_compression: str = "zstd"  # the runtime image's layers (builder/image/oci.py export_options)
    publish: Target | None = None  # `builder publish`: where the publish step pushes (steps/publish.py)
    # where an unchanged cell's image may be taken from instead of built (builder/image/reuse.py): --reuse-from, or
    # publish's own registry
    reuse_from: RegistryPath | None = None
    # [defaults] ledger_public_key: only a registry ledger record this key signed is adopted (builder/image/signing.py);
    # None: the registry's unsigned word. Its key id, and the file it came from, for messages.
    ledger_key: object | None = field(default=None, compare=False, repr=False)
    # BUILDER_LEDGER_SIGNING_KEY, for publish only: the signer of the records it pushes (never printed)
    ledger_signer: object | None = field(default=None, compare=False, repr=False)
    compile_cache: CompileCache | None = None  # [defaults.cache] compile: a shared sccache backend (compile_cache.py)
    compile_dist: str | None = None  # [defaults.cache] dist: an sccache-dist scheduler URL
    compile_dist_cores: int = 0  # [defaults.cache] dist_cores: its build servers' cores (recorded for estimates)
    # <wheelhouse>/.images: the digests builder built for each content key (builder/image/ledger.py); None records nothing
    # and reuses nothing
    image_ledger: Path | None = None

    @property
    def compile_reaches_out(self) -> bool:
        """Whether the compile RUN talks to a shared backend or a scheduler (and so has the host's network)."""
        return self.compile_cache is not None or self.compile_dist is not None


@dataclass
class CellContext:
    """What the steps of one cell share: its plan, where its files go, and what earlier steps produced."""

    plan: CellPlan
    opts: BuildOptions
    cache: WheelCache
    host: Host
    say: Callable[[str], None]
    log: TextIO
    wheels: dict[str, list[Path]] = field(default_factory=dict)  # package → its wheel files, compiled or fetched
    reused: dict[str, CacheHit] = field(default_factory=dict)  # package → the cache entry its wheels came from
    records: dict[str, dict[str, dict]] = field(default_factory=dict)  # package → {wheel: {sha256, bytes}}
    compiles: dict[str, dict] = field(default_factory=dict)  # package → its compile's time, objects, parallelism
    audits: dict[str, AuditReport] = field(default_factory=dict)
    # package → the published wheel its `source = "auto"` decision downloaded and audited (builder/steps/route.py)
    prefetched: dict[str, Path] = field(default_factory=dict)
    # the image the image step built, under a name of this run only (<tag>-run-<random>) that no other build of
    # the cell retags: what smoke runs and publish checks ("" until the image step ran); dropped at the cell's end
    image_ref: str = ""
    # {"ref", "digest", "content_key", "index"} when the image step found this cell's image already where publish
    # pushes (builder/image/reuse.py): nothing was pulled, smoke is not run again, publish pushes nothing, aliases move
    in_registry: dict = field(default_factory=dict)
    locks: dict[str, contextlib.ExitStack] = field(default_factory=dict)  # package → its cache key's lock
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # UTC

    def hold(self, package: str, lock: contextlib.AbstractContextManager) -> None:
        """Keep `lock` until release(package): the runner releases it once the package's steps are done."""
        stack = self.locks.setdefault(package, contextlib.ExitStack())
        stack.enter_context(lock)

    def release(self, package: str | None = None) -> None:
        for name in [package] if package else list(self.locks):
            stack = self.locks.pop(name, None)
            if stack:
                stack.close()

    def drop_run_name(self) -> None:
        """Remove the run's own name for its image once the cell is done: the cell's tag keeps the image (an
        image whose tag another build moved meanwhile goes with it, as an untagged image would)."""
        from .. import docker
        from ..errors import BuilderError

        if self.image_ref:
            try:
                docker.untag_image(self.image_ref, self.opts.docker, missing_ok=True)  # never made: interrupted first
            except (BuilderError, OSError) as exc:
                self.note(f"WARNING: could not remove the run's name {self.image_ref}: {exc}")
            self.image_ref = ""

    @property
    def cell(self):
        return self.plan.cell

    @property
    def dir(self) -> Path:
        return self.opts.work_dir / self.cell.id

    @property
    def dockerfile(self) -> Path:
        return self.dir / "Dockerfile"

    @property
    def context_dir(self) -> Path:
        return self.dir / "context"

    def out_dir(self, package: str) -> Path:
        return self.dir / f"out-{package}"

    @property
    def display(self) -> Display:
        return self.opts.display or _QUIET

    def echo(self, tracker: Tracker | None = None) -> Callable[[str], None] | None:
        """Where live build output goes besides the log: to a progress tracker's counters, and to the terminal
        itself only in --progress raw."""
        raw = self.display.echoes_output
        if tracker is None and not raw:
            return None

        def echo(line: str) -> None:
            if tracker is not None:
                tracker.feed(line)
            if raw:
                self.say(f"[{self.cell.id}] {line}")

        return echo

    def note(self, text: str) -> None:
        """A step line: on the terminal and in the cell's log."""
        self.say(f"[{self.cell.id}] {text}")
        self.log.write(f"# {text}\n")
        self.log.flush()


class Step(Protocol):
    name: str
    scope: str  # "package" | "cell"

    def run(self, ctx: CellContext, wheel: WheelStep | None) -> StepResult: ...

    def dry_run(self, ctx: CellContext, wheel: WheelStep | None) -> list[str]: ...


def common_build_args(ctx: CellContext) -> dict:
    """The buildx arguments every stage of a cell shares (compile and image steps)."""
    opts, cell = ctx.opts, ctx.cell
    args = (("SOURCE_DATE_EPOCH", opts.source_date_epoch),) if opts.source_date_epoch else ()
    secrets = (("ca", str(opts.ca_bundle)),) if opts.ca_bundle else ()
    contexts = tuple((f"local-{p.name}", p.source.path) for p in cell.packages if p.source.kind == "local")
    extra = ("--no-cache",) if opts.no_cache else ()
    if gitmirror.on_loopback():
        # a mirror on this host's loopback (scripts/git-host) is reachable from the source and deps RUNs only in
        # the host's network namespace; the compile RUNs keep their own --network=none
        extra += ("--network", "host")
    # the git mirrors (builder/gitmirror.py) reach the fetches as a git config in secret "gitmirrors": the buildx
    # process's environment holds it, so it is in no argv, no file, no layer and no cache key
    secret_envs = ((gitmirror.SECRET_ID, gitmirror.SECRET_ENV),) if gitmirror.active() else ()
    return {"dockerfile": ctx.dockerfile, "context": ctx.context_dir, "build_args": args, "secrets": secrets,
            "secret_envs": secret_envs,
            "contexts": contexts, "extra": extra, "builder": opts.builder,
            "layer_cache": (opts.layer_cache, cell.id) if opts.layer_cache else None}
