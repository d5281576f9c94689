"""What starts an engine, as one typed value (`RunFlags`): the flags smoke and bench share (serve parses its --gpus,
--port and --engine-args with the same functions here, and has no --launcher, --python, --boot-timeout or --env),
converted once — the model and drafter, the launcher and its Python, the GPUs in one grammar (auto, all, none or
device ids 0,1) and tensor parallel (--tp N: N GPUs, the engine's own flag), the port, the boot timeout, the engine's extra arguments (split once) and its environment."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..errors import UserError

MAX_TP = 64  # the most GPUs --tp shards one engine over
MAX_BOOT_TIMEOUT = 86400.0  # the one bound of --boot-timeout (seconds), checked by its flag (cli/flags.py)


@dataclass(frozen=True)
class Gpus:
    """--gpus: auto (the GPUs when nvidia-smi finds some), all (every GPU, or refuse), none, or device ids."""

    mode: str = "auto"  # "auto" | "all" | "none" | "ids"
    ids: tuple[int, ...] = ()

    @classmethod
    def parse(cls, value: str, flag: str = "--gpus") -> "Gpus":
        text = (value or "").strip().lower()
        if text in ("auto", "all", "none"):
            return cls(text)
        parts = [p.strip() for p in text.split(",")]
        if not parts or not all(re.fullmatch(r"[0-9]{1,3}", p) for p in parts):
            raise UserError(f"{flag}: {value!r}: write auto, all, none or device ids like 0,1")
        ids = tuple(dict.fromkeys(int(p) for p in parts))
        return cls("ids", ids)

    def __str__(self) -> str:
        return ",".join(map(str, self.ids)) if self.mode == "ids" else self.mode

    @property
    def docker(self) -> str | None:
        """What `docker run --gpus` takes: None (no GPUs), "all", or "device=0,1"."""
        return None if self.mode == "none" else f"device={self}" if self.mode == "ids" else "all"

    def choose(self, host) -> tuple[bool, str]:
        """(start the engine with GPUs, why not) on a host whose GPUs are `host` (deploy.runtime.gpus.HostGpus)."""
        if self.mode == "none":
            return False, "--gpus none"
        if not host.present:
            if self.mode != "auto":
                raise UserError(f"--gpus {self}: {host.why_none}")
            return False, host.why_none
        missing = [i for i in self.ids if i not in {g.index for g in host.gpus}]
        if missing:
            raise UserError(f"--gpus {self}: this host has no GPU {', '.join(map(str, missing))} "
                            f"(nvidia-smi lists {', '.join(str(g.index) for g in host.gpus)})")
        return True, ""

    def for_tp(self, tp: int, host=None, flag: str = "--gpus") -> "Gpus":
        """The GPUs an engine sharded over `tp` GPUs (tensor parallel) gets: `tp` device ids. Ids given must be
        exactly `tp`; auto / all become the first `tp` GPUs of the host when its GPUs are known (`host`, a
        deploy.runtime.gpus.HostGpus), and a host with fewer is refused; unknown, they stay as they are (choose decides)."""
        if tp <= 1:
            return self
        if self.mode == "none":
            raise UserError(f"--tp {tp}: {flag} none gives the engine no GPU to shard over")
        if self.mode == "ids":
            if len(self.ids) != tp:
                raise UserError(f"--tp {tp}: {flag} {self} names {len(self.ids)} GPU{'s' * (len(self.ids) != 1)}; "
                                f"tensor parallel {tp} runs on {tp}")
            return self
        if host is None or not host.present:
            return self
        if len(host.gpus) < tp:
            raise UserError(f"--tp {tp}: this host has {len(host.gpus)} GPU{'s' * (len(host.gpus) != 1)} "
                            f"(nvidia-smi lists {', '.join(str(g.index) for g in host.gpus)})")
        return Gpus("ids", tuple(sorted(g.index for g in host.gpus))[:tp])


def tp(value: int) -> int:
    """--tp N: the GPUs one engine shards the model over (tensor parallel), 1..MAX_TP."""
    if not 1 <= value <= MAX_TP:
        raise UserError(f"--tp: {value}: write a number of GPUs from 1 to {MAX_TP}")
    return value


def engine_args(text: str) -> tuple[str, ...]:
    """--engine-args: one shell-quoted string → the arguments."""
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as exc:
        raise UserError(f"--engine-args: {exc}") from None


def env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    """--env NAME=VALUE (repeated) → {NAME: VALUE}."""
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise UserError(f"--env {v!r}: write NAME=VALUE")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"--env {v!r}: {key!r} is not a variable name (letters, digits, '_')")
        if "\0" in val:
            raise UserError(f"--env {key}: the value contains a NUL byte")
        out[key] = val
    return out


def port(value: int | None) -> int | None:
    if value is not None and not 0 < value < 65536:
        raise UserError(f"--port: {value} is not a TCP port")
    return value


@dataclass(frozen=True)
class RunFlags:
    model: str = "tiny"  # a local checkpoint directory, "tiny" or a generated shape (shape:27b)
    drafter: str | None = None
    launcher: str = "docker"  # "docker" | "process"
    python: str = "python3"  # the interpreter of the process launcher
    gpus: Gpus = field(default_factory=Gpus)
    port: int | None = None  # None: a free one
    boot_timeout: float = 900.0
    engine_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    tp: int = 1  # tensor parallel: the GPUs one engine shards the model over

    @classmethod
    def convert(cls, *, model: str = "tiny", drafter: str | None = None, launcher: str = "auto",
                python: str = "python3", gpus: str = "auto", port_: int | None = None, boot_timeout_: float = 900.0,
                engine_args_: str = "", env: tuple[str, ...] = (), tp_: int = 1) -> "RunFlags":
        """The flags as given on the command line, each checked (a UserError naming the flag; --model's generated
        shapes are checked by the verbs' flag reader, cli/flags.py run_flags: smoke/ stands above this module)."""
        chosen, shards = Gpus.parse(gpus), tp(tp_)
        chosen.for_tp(shards)  # --gpus none, or ids that are not --tp of them: refused now, before any image is read
        return cls(model=model, drafter=drafter, launcher="docker" if launcher == "auto" else launcher,
                   python=python, gpus=chosen, port=port(port_), boot_timeout=float(boot_timeout_),
                   engine_args=engine_args(engine_args_), env=env_pairs(env), tp=shards)
