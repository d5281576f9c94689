"""Every `io.builder.*` image label, written and read here and nowhere else.

Written: render puts them in the runtime stage (`written`). What the audit found in each compiled package
— the SASS and PTX every binary with device code carries, and the binaries whose coverage differs — is not known
when the Dockerfile is rendered: those labels read build arguments (`audit_arg`) that the image step fills from
the audit of the very wheels it installs (`audit_values`), so a label never says more than a binary holds.
Read: builder/deploy/subject.py (an image's config and labels, for smoke, bench, serve and doctor --host) and
the build's image step (`cell`, `engine`, `strategies`, `package`).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from .. import __version__
from .. import archs as archs_mod
from .. import redact

if TYPE_CHECKING:
    from ..audit import AuditReport

PREFIX = "io.builder."
PACKAGE_PREFIX = "io.builder.package."
OCI_TITLE = "org.opencontainers.image.title"
OCI_VERSION = "org.opencontainers.image.version"
CELL = "io.builder.cell"
ENGINE = "io.builder.engine"
ENGINE_VERSION = "io.builder.engine.version"
CUDA = "io.builder.cuda"
TORCH = "io.builder.torch"
PYTHON = "io.builder.python"
ARCHS = "io.builder.archs"
STRATEGIES = "io.builder.strategies"
BUILDER_VERSION = "io.builder.builder-version"
# the runtime image's content key (steps/image.py content_key): set by the image step on the build's command line
# (buildx --label), since the key covers the rendered Dockerfile itself
CONTENT_KEY = "io.builder.content-key"
AUDITED = ("sass", "ptx", "binaries")  # per compiled package, from the audit
# a smoke or bench container's owner: builder's pid on this boot (builder/owner.py), so that the next run removes the
# containers a killed run left
OWNER = "io.builder.owner"
# the image's measured boot: seconds from start to serving the model list, the longest boot measured of this image
# (read by `builder serve` to size its probes; no builder step writes it yet: an image without it gets the stated
# default budget)
BOOT_SECONDS = "io.builder.boot-seconds"
# the image's one cache root and every compile cache of its engine under it ("VAR=dir VAR=dir", engine data
# compile_caches): what `builder warm` captures, what smoke L3 and the process launcher boot with
CACHE_ROOT = "io.builder.cache-root"
CACHE_ENV = "io.builder.cache-env"
WARM_ALLOWANCE = "io.builder.warm-allowance"  # globs under the root a warm boot may still write (engine data)
CRIU = "io.builder.criu"  # the CRIU the image carries (profiles.<name>.criu): its version and patches
# a warm image (builder/deploy/warm/layer.py): the image plus one layer holding what a boot compiled, and what it was warmed
# for; WARM_OF names the cold image's digest
WARM = "io.builder.warm"
WARM_OF = "io.builder.warm.of"
WARM_KEY = "io.builder.warm.key"  # what its caches were keyed on (deploy/runtime/warmkey.py Record), JSON
WARM_FIELDS = ("strategy", "gpu", "gpu-arch", "driver", "engine", "model", "model-config-sha256", "engine-args",
               "files", "bytes", "cold-boot-s", "warm-boot-s", "captured-on", "key")


def package(name: str, what: str) -> str:
    return f"{PACKAGE_PREFIX}{name}.{what}"


def audit_arg(name: str, what: str) -> str:
    """The build argument that carries an audited label's value into the runtime stage."""
    return "BUILDER_AUDIT_" + re.sub(r"[^A-Z0-9]+", "_", f"{name}_{what}".upper())


# (label, value, the value is a build argument's ${NAME}: it must expand) of a resolve.Cell, read by its attributes:
# labels.py imports nothing of resolve, so the runtime's cache setting (deploy/runtime/caches.py) that reads the
# labels, and the engine's boot loop on it, add no floor above the resolver (test_layers: the longest chain)
def written(cell, keys: dict[str, str]) -> list[tuple[str, str, bool]]:
    out = [
        (OCI_TITLE, f"{cell.engine} {cell.version}", False),
        (OCI_VERSION, cell.version, False),
        ("org.opencontainers.image.description",
         f"{cell.engine} {cell.version} compiled for {', '.join(map(archs_mod.sm, cell.archs))}", False),
        (CELL, cell.id, False), (ENGINE, cell.engine, False), (ENGINE_VERSION, cell.version, False),
        (CUDA, cell.cuda, False), (TORCH, cell.torch, False), (PYTHON, cell.python, False),
        (ARCHS, ",".join(str(a) for a in cell.archs), False), (STRATEGIES, ",".join(cell.strategies), False),
        (BUILDER_VERSION, __version__, False),
    ]
    if cell.criu:  # builder snapshot's container route runs it inside the image
        out.append((CRIU, f"{cell.criu['version']} (" + ", ".join(cell.criu["patches"]) + ")", False))
    if cell.cache_root:
        out += [(CACHE_ROOT, cell.cache_root, False),
                (CACHE_ENV, " ".join(f"{k}={v}" for k, v in cell.compile_caches), False),
                (WARM_ALLOWANCE, " ".join(cell.warm_globs), False)]
    for p in cell.packages:
        out.append((package(p.name, "version"), p.version, False))
        out.append((package(p.name, "source"), p.source.ref, False))
        if p.recipe.compiled:  # what its audit found, built here or taken from the index alike
            out += [(package(p.name, what), "${" + audit_arg(p.name, what) + "}", True) for what in AUDITED]
        out.append((package(p.name, "cache-key"), keys[p.name], False))
        route = getattr(p, "route", None)
        if route is not None:  # source = "auto": the route build took and why (a fact once build decided it)
            out.append((package(p.name, "route"), route.chosen, False))
            out.append((package(p.name, "route-reason"), route.summary, False))
        # what kind of binaries it holds and what they only load with (a pure-Python label would hide a torch binding)
        out.append((package(p.name, "binary-kinds"), p.recipe.describe_binaries(cell.torch, cell.cuda, cell.python), False))
    return out


def audit_args(cell) -> list[str]:
    return [audit_arg(p.name, what) for p in cell.packages if p.recipe.compiled for what in AUDITED]


def _coverage(b) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(sorted({e.name for e in b.entries if e.kind == "sass"})),
            tuple(sorted({e.name for e in b.entries if e.kind == "ptx"})))


def audit_values(name: str, report: AuditReport) -> dict[str, str]:
    """The audited labels of one package: SASS / PTX that every binary with device code carries, and (JSON) each
    binary whose coverage differs from that, by its path inside the wheel."""
    found = {b.path.split("!", 1)[-1]: _coverage(b) for b in report.binaries if b.has_device_code}
    sass = set.intersection(*(set(s) for s, _ in found.values())) if found else set()
    ptx = set.intersection(*(set(p) for _, p in found.values())) if found else set()
    differ = {path: {"sass": list(s), "ptx": list(p)} for path, (s, p) in sorted(found.items())
              if set(s) != sass or set(p) != ptx}
    return {audit_arg(name, "sass"): ",".join(sorted(sass, key=_arch_order)),
            audit_arg(name, "ptx"): ",".join(sorted(ptx, key=_arch_order)),
            audit_arg(name, "binaries"): json.dumps(differ, separators=(",", ":"), sort_keys=True) if differ else ""}


def found_sass(report: AuditReport) -> set[str]:
    """Every SASS name any binary of the package carries."""
    return {n for b in report.binaries for n in _coverage(b)[0]}


def _arch_order(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)([a-z]*)$", name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


# -- reading --------------------------------------------------------------------------------------------------
def cell(labels: dict[str, str]) -> str | None:
    return labels.get(CELL)


def jit_prebuilt(labels: dict[str, str]) -> bool:
    """The image is warm: its JIT modules were built into it (a profile with jit = "prebuilt", whose cell id has
    the part -jitprebuilt, last or before -criu). An image that does not say so is cold."""
    return "jitprebuilt" in (labels.get(CELL) or "").split("-")[1:]


def boot_label(labels: dict[str, str]) -> str:
    """The label that records how long this image takes to serve: a warm image's measured warm boot (`builder
    warm` boots it from its own layer), else BOOT_SECONDS."""
    return f"{WARM}.warm-boot-s" if labels.get(WARM) == "1" and labels.get(f"{WARM}.warm-boot-s") else BOOT_SECONDS


def boot_seconds(labels: dict[str, str]) -> float | None:
    """The boot the image's labels record (boot_label), None without one; a value that is no positive number is a
    UserError naming the label."""
    from ..errors import UserError

    name = boot_label(labels)
    raw = labels.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise UserError(f"label {name}={raw!r}: not a number of seconds (0 < s < 86400)")
    return value


def content_key(labels: dict[str, str]) -> str:
    return labels.get(CONTENT_KEY, "")


def engine(labels: dict[str, str]) -> tuple[str | None, str | None]:
    return labels.get(ENGINE), labels.get(ENGINE_VERSION)


def strategies(labels: dict[str, str]) -> list[str]:
    return [s for s in labels.get(STRATEGIES, "").split(",") if s]


def cache_root(labels: dict[str, str]) -> str:
    return labels.get(CACHE_ROOT, "")


def cache_env(labels: dict[str, str]) -> dict[str, str]:
    """{variable: directory} of every compile cache the image points at its cache root."""
    return dict(pair.split("=", 1) for pair in labels.get(CACHE_ENV, "").split() if "=" in pair)


def warm_allowance(labels: dict[str, str]) -> list[str]:
    return labels.get(WARM_ALLOWANCE, "").split()


def warm(labels: dict[str, str]) -> dict[str, str]:
    """What a warm image was warmed for ({field: value} of io.builder.warm.*), {} for an image without a warm layer."""
    if labels.get(WARM) != "1":
        return {}
    return {f: labels.get(f"{WARM}.{f}", "") for f in ("of", *WARM_FIELDS)}


WARM_NUMBERS = ("files", "bytes", "cold-boot-s", "warm-boot-s")


def warm_problem(labels: dict[str, str]) -> str | None:
    """Why an image's io.builder.warm.* labels are not the ones `builder warm` writes (warm_written), or None (they
    are, or the image has none): a cold digest that is no digest (`../../x`), a GPU arch that is no sm number, a
    figure that is no number. Such labels say nothing about the layer; a deployer is told so, not given them."""
    w = warm(labels)
    if not w:
        return None
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", w["of"]):
        return f"{WARM_OF} {redact.describe(w['of'])} is not the cold image's digest (sha256:<64 hex>)"
    if w["gpu-arch"] and not re.fullmatch(r"sm[0-9]{2,3}[af]?|none", w["gpu-arch"]):
        return f"{WARM}.gpu-arch {redact.describe(w['gpu-arch'])} is not a GPU arch (sm90, none)"
    for f in WARM_NUMBERS:
        if w[f] not in ("", "None") and not re.fullmatch(r"[0-9]{1,15}(\.[0-9]{1,6})?", w[f]):
            return f"{WARM}.{f} {redact.describe(w[f])} is not a number"
    return None


def warm_written(facts: dict[str, str], of: str) -> list[tuple[str, str]]:
    """The labels of a warm image: its marker, the cold image's digest and each of WARM_FIELDS in `facts`."""
    return [(WARM, "1"), (WARM_OF, of)] + [(f"{WARM}.{f}", str(facts[f])) for f in WARM_FIELDS if f in facts]


def package_key(key: str) -> tuple[str, str] | None:
    """(package, what) of a label io.builder.package.<name>.<what>, else None."""
    if not key.startswith(PACKAGE_PREFIX) or "." not in key[len(PACKAGE_PREFIX):]:
        return None
    name, what = key[len(PACKAGE_PREFIX):].rsplit(".", 1)
    return name, what


def image_wide(labels: dict[str, str]) -> dict[str, str]:
    """Every io.builder.* label that is not a package's, sorted: what the image says of itself (the SBOM's image)."""
    return {k: v for k, v in sorted(labels.items()) if k.startswith(PREFIX) and not k.startswith(PACKAGE_PREFIX)}


def packages(labels: dict[str, str]) -> list[str]:
    """The packages the labels describe (io.builder.package.<name>.<what>), sorted."""
    return sorted({got[0] for key in labels if (got := package_key(key))})


def package_facts(labels: dict[str, str], name: str) -> dict:
    """What the image says about one package: version, source, cache key and what its audit found."""
    out = {what: labels.get(package(name, what), "")
           for what in ("version", "source", "cache-key", "sass", "ptx", "route", "route-reason")}
    out["sass"] = [s for s in out["sass"].split(",") if s]
    out["ptx"] = [s for s in out["ptx"].split(",") if s]
    raw = labels.get(package(name, "binaries"), "")
    out["binaries"] = json.loads(raw) if raw else {}
    return out


# the labels smoke L0 holds against the plan: (label, the Cell attribute it names)
PLAN_FIELDS = ((CELL, "id"), (ENGINE, "engine"), (ENGINE_VERSION, "version"), (CUDA, "cuda"), (TORCH, "torch"),
               (PYTHON, "python"))
