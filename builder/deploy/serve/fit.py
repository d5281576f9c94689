"""What fits a serve plan to where it runs, beyond its launch line: which GPUs the image's device code runs on (the
compute capabilities a Kubernetes node must report, and a GPU product to ask for), and how the engine stops (its own
drain flag from the engine data, and the grace that the runtime gives it before SIGKILL).

The GPUs are read from the image's labels the way `builder doctor --host` reads them (deploy/host.py ImageFacts): per
package, the SASS and PTX its audit found (io.builder.package.<name>.sass / .ptx, each binary that differs in .binaries,
with the engine data's arch scopes), else io.builder.archs as SASS; whether code runs on a compute capability is
builder/archs.py runs_on (SASS sm_X.y on X.z for z >= y, `a` targets on their own GPU only, `f` targets within the
family, PTX on any later GPU, JIT-compiled at first load).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ... import archs as archs_mod
from ... import redact
from ...errors import UserError

# compute capability → its architecture family, for every NVIDIA GPU the node affinity may admit (7.0 V100, 7.2
# Xavier, 7.5 T4, 8.0 A100, 8.6 A10/RTX 30, 8.7 Orin, 8.9 L4/L40S/RTX 40, 9.0 H100/H200, 10.0 B200, 10.3 B300, 11.0 Thor,
# 12.0 RTX PRO 6000/RTX 50, 12.1 DGX Spark). A GPU not listed here is never admitted: its compute capability is unknown to
# the rules that say what runs on it.
FAMILIES = {70: "volta", 72: "volta", 75: "turing", 80: "ampere", 86: "ampere", 87: "ampere", 89: "ada-lovelace",
            90: "hopper", 100: "blackwell", 103: "blackwell", 110: "blackwell", 120: "blackwell", 121: "blackwell"}

# How the engine stops (Kubernetes' pod termination: preStop, then SIGTERM, then SIGKILL at the grace period's end).
DEFAULT_DRAIN_S = 30  # in-flight requests may finish this long after SIGTERM (KServe sets 45 s in a 60 s grace)
MAX_DRAIN_S = 3600
PRE_STOP_S = 15  # the preStop sleep: endpoints and load balancers stop routing to the pod before SIGTERM (KServe's)
STOP_MARGIN_S = 15  # after the drain: the engine's own exit (vLLM's engine core, SGLang's 5 s drain ticks)


def runs_on(image: str, labels: dict[str, str]) -> tuple[int, ...]:
    """The compute capabilities of FAMILIES on which every unit of the image's device code has code that loads (its
    labels checked as doctor --host checks them: a malformed one is a UserError naming it); () when the labels name
    no device code at all."""
    from .. import host, subject

    facts = host.facts_of(subject.Subject(image, subject.FILE, {"Labels": labels}))
    units = facts.device_code()
    if not units:
        return ()
    return tuple(cc for cc in sorted(FAMILIES) if all(_loads(codes, scope, cc) for _, codes, scope in units))


def _loads(codes: list[str] | None, scope: archs_mod.ArchScope | None, cc: int) -> bool:
    if codes is None or (scope is not None and not scope.covers(cc)):  # not judged (doctor --host: the same)
        return True
    for code in codes:
        m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", code.strip())
        if m and archs_mod.runs_on("sass" if m[1] == "sm" else "ptx", int(m[2]), m[3], cc):
            return True
    return False


def spelled(ccs: tuple[int, ...]) -> str:
    """(80, 86, 90) → 'ampere 8.0, 8.6; hopper 9.0'."""
    by: dict[str, list[str]] = {}
    for cc in ccs:
        by.setdefault(FAMILIES[cc], []).append(archs_mod.dotted(cc))
    return "; ".join(f"{family} {', '.join(v)}" for family, v in by.items()) or "no GPU builder knows"


def family_ccs(family: str, ccs: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(cc for cc in ccs if FAMILIES[cc] == family)


# GPU feature discovery's nvidia.com/gpu.product: the device name with its spaces turned into dashes (NVIDIA-H200,
# NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB), "-SHARED" or "-MIG-<profile>" appended; a label value (at most 63).
PRODUCT = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def check_product(name: str) -> str:
    """--gpu-product NAME as GPU feature discovery writes it on the node."""
    if " " in name.strip() and PRODUCT.fullmatch(name.strip().replace(" ", "-")):
        raise UserError(f"--gpu-product {redact.describe(name)}: GPU feature discovery writes the name with dashes: "
                        f"{name.strip().replace(' ', '-')}")
    if not PRODUCT.fullmatch(name):
        raise UserError(f"--gpu-product {redact.describe(name)}: not a GPU product as GPU feature discovery labels "
                        "it (nvidia.com/gpu.product: letters, digits, '-', '_', '.'; at most 63; e.g. NVIDIA-H200)")
    return name


@dataclass(frozen=True)
class Shutdown:
    """How the engine stops: `drain_s` for in-flight requests after SIGTERM, through the engine's own flag where it
    has one (`flag`; "" none: SGLang drains until its requests are done, vLLM before 0.18 aborts them at once), then
    the grace the runtime gives before SIGKILL — Kubernetes' terminationGracePeriodSeconds (`grace_s`: the preStop
    sleep, the drain and a margin) and docker's --stop-timeout (`stop_s`: the drain and the margin)."""

    drain_s: int
    flag: str
    pre_stop_s: int = PRE_STOP_S

    @classmethod
    def of(cls, recipe, drain_s: int, extra_args: tuple[str, ...] = ()) -> Shutdown:
        if not 0 <= drain_s <= MAX_DRAIN_S:
            raise UserError(f"--drain-timeout {drain_s}: from 0 to {MAX_DRAIN_S} seconds")
        flag = recipe.shutdown_flag
        if flag and any(a == flag or a.startswith(flag + "=") for a in extra_args):
            raise UserError(f"--engine-args sets {flag}: give --drain-timeout instead (it also sizes the grace the "
                            "runtime gives the engine before SIGKILL)")
        return cls(drain_s, flag)

    @property
    def args(self) -> tuple[str, ...]:
        """The engine's own flag for the drain (none without one)."""
        return (self.flag, str(self.drain_s)) if self.flag else ()

    @property
    def grace_s(self) -> int:
        return self.pre_stop_s + self.drain_s + STOP_MARGIN_S

    @property
    def stop_s(self) -> int:
        return self.drain_s + STOP_MARGIN_S
