"""`builder doctor --host [IMAGE...]`: will these images run on this host's GPUs — before anyone pulls them.

Per GPU (nvidia-smi: name, driver, compute capability, product brand) and per image (its config and labels, read
from the local daemon, else from its registry without pulling, else from a saved JSON of them): *runs*, *runs
with the forward-compatibility package* (data-center GPUs only) or *refused*, each with the rule that decided it.
The facts are data (builder/data/host.toml); which device code loads where is archs.runs_on.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .. import archs as archs_mod
from .. import files, schema
from . import subject as subject_mod
from .runtime.gpus import Gpu
from .runtime import gpus as gpus_mod
from ..image import labels as labels_mod
from ..errors import EnvironmentProblem, UserError

RUNS, COMPAT, REFUSED, UNKNOWN = "runs", "runs with forward-compat", "refused", "unknown"
LABEL_CUDA = labels_mod.CUDA
LABEL_ARCHS = labels_mod.ARCHS


def rules() -> dict:
    return tomllib.loads(resources.files("builder").joinpath("data/host.toml").read_text())


def _v(text: str) -> Version:
    return Version(text)


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


# -- images ------------------------------------------------------------------------------------------------
@dataclass
class ImageFacts:
    ref: str
    source: str  # "local image", "registry (not pulled)", "file"
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cuda(self) -> str | None:
        return self.env.get("CUDA_VERSION") or self.labels.get(LABEL_CUDA) or None

    @property
    def require_cuda(self) -> str | None:
        return self.env.get("NVIDIA_REQUIRE_CUDA") or None

    def device_code(self) -> list[tuple[str, list[str] | None, archs_mod.ArchScope | None]]:
        """(unit, its code names ("sm_80", "sm_90a", "compute_90"), the arch scope of a binary) to judge. Per
        package: the code every binary with device code carries (its .sass/.ptx labels), then each binary whose
        coverage differs (its .binaries label), with the engine data's arch scope of that binary when the data
        knows the package's version (sglang-kernel's sm100/ copy is not loaded on 9.0). Codes None: a wheel taken
        from the index whose labels do not say. Without package labels: the image's io.builder.archs as SASS."""
        out: list[tuple[str, list[str] | None, archs_mod.ArchScope | None]] = []
        for name in labels_mod.packages(self.labels):
            facts = labels_mod.package_facts(self.labels, name)
            common = facts["ptx"] + facts["sass"]
            if "from-index" in common:
                out.append((name, None, None))
                continue
            if common:
                out.append((name, common, None))
            scopes = _arch_scopes(name, facts["version"]) if facts["binaries"] else ()
            for path, cov in sorted(facts["binaries"].items()):
                codes = list(cov.get("ptx", [])) + list(cov.get("sass", []))
                out.append((f"{name} {path}", codes, archs_mod.scope_for(path, scopes)))
        if not out and self.labels.get(LABEL_ARCHS):
            out.append(("image", [archs_mod.sm(a) for a in archs_mod.parse(self.labels[LABEL_ARCHS], LABEL_ARCHS)],
                        None))
        return out


def _arch_scopes(name: str, version: str) -> tuple[archs_mod.ArchScope, ...]:
    """The engine data's arch_scoped binaries of one package version; none when the data does not know it."""
    from ..engines import load_knowledge

    try:
        return load_knowledge().recipe(name, version).arch_scoped
    except UserError:
        return ()


def facts_from_json(ref: str, data, source: str) -> ImageFacts:
    """docker image inspect (a list of one, or one object), an OCI image config ({"config": {...}}), or skopeo
    inspect's summary ({"Labels": ..., "Env": ...}) as ImageFacts (subject.config_from_json checks the shape)."""
    return facts_of(subject_mod.Subject(ref, source, subject_mod.config_from_json(ref, data)))


def facts_of(found: subject_mod.Subject) -> ImageFacts:
    """What the rules judge of an image, its labels builder writes each checked here, named when malformed."""
    ref = found.ref
    facts = ImageFacts(ref, found.source, found.env, found.labels)
    for key, value in facts.labels.items():  # the labels judge() reads
        where = f"{ref}: label {key}"
        what = (labels_mod.package_key(key) or ("", ""))[1]
        if what == "binaries" and value:
            schema.check(where, files.load_json(where, "binaries label", text=value), schema.BINARIES)
        elif what in ("sass", "ptx"):
            schema.check(where, [c for c in value.split(",") if c], schema.ListOf(schema.DEVICE_CODE))
        elif key == LABEL_ARCHS:
            archs_mod.parse(value, where)
    return facts


def image_facts(ref: str) -> ImageFacts:
    """The config of an image: a JSON file of it, the local daemon's, else its registry's (nothing pulled)."""
    return facts_of(subject_mod.read(ref))


# -- the rules ---------------------------------------------------------------------------------------------
def cuda_release(version: str) -> str:
    return ".".join(version.split(".")[:2])


def driver_cuda(driver: str, data: dict) -> str | None:
    """The newest CUDA release whose minimum driver this driver meets."""
    fits = [r for r, d in data["cuda"]["min_driver"].items() if _v(driver) >= _v(d)]
    return max(fits, key=_v) if fits else None


def require_satisfied(require: str, gpu: Gpu, data: dict) -> tuple[bool, str]:
    """NVIDIA_REQUIRE_CUDA as the container toolkit reads it: space-separated clauses are ORed, the
    comma-separated constraints of one clause ANDed (cuda>=X, brand=B, driver>=D, driver<D)."""
    have_cuda = driver_cuda(gpu.driver, data)
    for clause in require.split():
        ok = True
        for cons in clause.split(","):
            m = re.fullmatch(r"(cuda|driver|brand|arch)\s*(>=|<=|==|=|<|>)\s*(\S+)", cons.strip())
            if not m:
                ok = False
                break
            key, op, want = m.groups()
            if key != "brand" and not _is_version(want):
                ok = False
                break
            if key == "brand":
                ok = gpu.brand.replace(" ", "").lower() == want.lower()
            elif key == "arch":
                ok = _cmp(_v(archs_mod.dotted(gpu.compute_cap)), op, _v(want))
            else:
                have = have_cuda if key == "cuda" else gpu.driver
                ok = have is not None and _cmp(_v(have), op, _v(want))
            if not ok:
                break
        if ok:
            return True, clause
    return False, require.split()[0] if require.split() else require


def _cmp(a: Version, op: str, b: Version) -> bool:
    if op in ("<", ">"):  # driver<471 means a driver of branch 470: compare the major only when b has none
        if len(b.release) == 1:
            a = Version(str(a.release[0]))
    return {">=": a >= b, "<=": a <= b, "==": a == b, "=": a == b, "<": a < b, ">": a > b}[op]


def _code(name: str) -> tuple[str, int, str] | None:
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", name.strip())
    return ("sass" if m[1] == "sm" else "ptx", int(m[2]), m[3]) if m else None


@dataclass
class Verdict:
    gpu: Gpu
    image: str
    verdict: str
    rule: str
    details: list[str] = field(default_factory=list)
    fix: str | None = None

    def to_json(self) -> dict:
        return {"gpu": asdict(self.gpu), "image": self.image, "verdict": self.verdict, "rule": self.rule,
                "details": self.details, "fix": self.fix}


def judge(gpu: Gpu, facts: ImageFacts, data: dict | None = None) -> Verdict:
    data = data or rules()
    cc = archs_mod.dotted(gpu.compute_cap)
    details: list[str] = []
    cuda = facts.cuda
    if not cuda:
        return Verdict(gpu, facts.ref, UNKNOWN, "the image names no CUDA release (no CUDA_VERSION, no io.builder.cuda)")
    release = cuda_release(cuda)
    need = data["cuda"]["min_driver"].get(release)
    if need is None:
        return Verdict(gpu, facts.ref, UNKNOWN, f"the host data has no minimum driver for CUDA {release} "
                       "(builder/data/host.toml [cuda.min_driver])")
    driver_ok = _v(gpu.driver) >= _v(need)
    driver_rule = f"CUDA {release} needs driver >= {need}; GPU {gpu.index} has {gpu.driver}"
    fc = data["forward_compat"]
    major = release.split(".")[0]
    compat_min = fc["min_driver"].get(major)
    data_center = gpu.brand in fc["brands"]
    compat_ok = not driver_ok and data_center and compat_min is not None and _v(gpu.driver) >= _v(compat_min)

    # device code, package by package
    for pkg, codes, scope in facts.device_code():
        if codes is None:
            details.append(f"{pkg}: from the index, its device code is not in the labels (the audit log has it): not judged")
            continue
        if scope is not None and not scope.covers(gpu.compute_cap):
            details.append(f"{pkg}: not loaded on {cc} ({scope.why}): not judged")
            continue
        parsed = [(c, _code(c)) for c in codes]
        sass = [c for c, p in parsed if p and p[0] == "sass" and archs_mod.runs_on("sass", p[1], p[2], gpu.compute_cap)]
        ptx = [c for c, p in parsed if p and p[0] == "ptx" and archs_mod.runs_on("ptx", p[1], p[2], gpu.compute_cap)]
        if sass:
            continue
        if ptx and (driver_ok or compat_ok):
            details.append(f"{pkg}: no SASS for {cc}; {ptx[0]} PTX is JIT-compiled at first load (slow start)")
            continue
        if ptx:
            return Verdict(gpu, facts.ref, REFUSED, f"{pkg}: only PTX ({', '.join(ptx)}) fits compute capability "
                           f"{cc}, and PTX JIT needs a driver at least as new as the PTX: {driver_rule}", details)
        why = _why_not(codes, gpu.compute_cap)
        return Verdict(gpu, facts.ref, REFUSED, f"{pkg} has no device code for compute capability {cc} "
                       f"({', '.join(codes)}): {why} — \"no kernel image is available for execution on the device\"",
                       details, fix=f"use an image built with --arch {gpu.compute_cap} (or an arch whose SASS runs on {cc})")

    if facts.require_cuda:
        ok, clause = require_satisfied(facts.require_cuda, gpu, data)
        if not ok:
            details.append(f"NVIDIA_REQUIRE_CUDA: no clause holds for this GPU (the container runtime refuses with "
                           f"'unsatisfied condition: {clause}' unless NVIDIA_DISABLE_REQUIRE=1)")
        elif not clause.startswith("cuda"):
            details.append(f"NVIDIA_REQUIRE_CUDA: the container runtime accepts it through {clause}")
    if driver_ok:
        return Verdict(gpu, facts.ref, RUNS, driver_rule, details)
    package = fc["package"].format(major=major, minor=release.split(".")[1])
    if compat_ok:
        return Verdict(gpu, facts.ref, COMPAT, f"{driver_rule}; forward compatibility: {gpu.brand} is a data-center "
                       f"brand and the driver is at least {compat_min}", details,
                       fix=f"install {package} in the image (its libraries first on LD_LIBRARY_PATH), or upgrade the "
                           f"driver to {need} or newer")
    if not data_center:
        why = f"forward compatibility is for data-center GPUs only ({gpu.brand or 'no brand'} is not one)"
    elif compat_min is None:
        why = f"the host data names no forward-compatibility floor for CUDA {major}"
    else:
        why = f"{package} supports drivers from {compat_min}"
    return Verdict(gpu, facts.ref, REFUSED, f"{driver_rule}; {why}", details,
                   fix=f"upgrade the driver to {need} or newer, or use an image of an older CUDA release")


def _why_not(codes: list[str], gpu: int) -> str:
    reasons = []
    for c in codes:
        p = _code(c)
        if p is None:
            continue
        kind, arch, variant = p
        if variant == "a":
            reasons.append(f"{c} runs only on {archs_mod.dotted(arch)}")
        elif kind == "sass" or variant == "f":
            reasons.append(f"{c} runs on {arch // 10}.{arch % 10}–{arch // 10}.9 only")
        else:
            reasons.append(f"{c} PTX needs {archs_mod.dotted(arch)} or newer")
    return "; ".join(reasons) + "; no PTX" if not any((_code(c) or ("",))[0] == "ptx" for c in codes) else "; ".join(reasons)


def warm_match(gpu: Gpu, labels: dict[str, str]) -> list[str]:
    """What the image's warm layer does on this GPU (deploy/runtime/warmjudge.py, the one judge): per cache, whether its key's
    host parts (GPU name, SM count, arch, driver where a key holds it) are this GPU's; the serve parts (model, flags,
    TP) are judged by `builder serve`, which knows them: here they are said as the layer needs them. [] without a
    warm layer."""
    from .runtime import warmjudge as judge_mod
    from .runtime.warmkey import LABEL, Record
    from .runtime.warmkey import data as key_data

    raw = labels.get(LABEL)
    record = Record.from_label(raw) if raw else None
    engine, version = labels_mod.engine(labels)
    flags = key_data().flags_of(engine or "", version or "")
    # this GPU with the capture's own launch line, environment and model: only the host can differ here
    serve = (judge_mod.side(gpu, flags, record.args, record.env, set(), record.model_config, record.ranks)
             if record is not None else judge_mod.side(gpu, None, (), {}, set(), None))
    parts = serve.parts
    verdict = judge_mod.of_image(labels, serve)
    if verdict is None:
        return []
    lines = verdict.lines()
    if record is not None and not verdict.problem:
        lines.append(f"  served as captured only: model {parts.get('model-path') or '?'} (config sha256 "
                     f"{(parts.get('model-config') or '?')[:12]}), TP {parts.get('tp') or '?'}: `builder serve` judges "
                     "another model, flags or TP before the boot")
    return lines


def report(images: list[str], gpus: list[Gpu]) -> list[Verdict]:
    data = rules()
    facts = [image_facts(i) for i in images]
    out = []
    for f in facts:
        for g in gpus:
            v = judge(g, f, data)
            v.details += warm_match(g, f.labels)
            out.append(v)
    return out


def table(gpus: list[Gpu], verdicts: list[Verdict]) -> str:
    lines = [f"GPU {g.index}: {g.name}, compute capability {archs_mod.dotted(g.compute_cap)}, driver {g.driver}, "
             f"brand {g.brand or '?'} (driver's newest CUDA: {driver_cuda(g.driver, rules()) or 'older than the data'})"
             for g in gpus]
    for v in verdicts:
        lines.append(f"{v.image} on GPU {v.gpu.index}: {v.verdict.upper()} — {v.rule}")
        lines += [f"    {d}" for d in v.details]
        if v.fix and v.verdict != RUNS:
            lines.append(f"    fix: {v.fix}")
    return "\n".join(lines)


def gpus_from_file(path: str) -> list[Gpu]:
    """A JSON list of GPU records ({"name", "driver", "compute_cap", "brand"}), or `doctor --host --json`'s own
    output (its "gpus"): judge a host you are not on."""
    data = files.load_json(Path(path), "GPU list (JSON)")
    where = f"--gpus-file {path}"
    if isinstance(data, dict):  # `builder doctor --host --json` of that host
        schema.check(where, data, schema.HOST_REPORT)
        data = data["gpus"]
    if not isinstance(data, list) or not data:
        raise UserError(f"{where}: expected a non-empty JSON list of GPU records (or `doctor --host --json` output)")
    gpus = [Gpu.from_json(d, i, f"{where}: [{i}]") for i, d in enumerate(data)]
    if len({g.index for g in gpus}) != len(gpus):
        raise UserError(f"{where}: a GPU index appears twice ({', '.join(str(g.index) for g in gpus)})")
    return gpus


def command(images: tuple[str, ...], gpus_file: str | None, as_json: bool, echo) -> int:
    """The body of `builder doctor --host`: 0 when every image runs on every GPU (compat included), 1 when one
    is refused or cannot be judged, 3 when there is no GPU to judge against."""
    from ..errors import EXIT_ENVIRONMENT, EXIT_FAILED

    if gpus_file:
        gpus, why = gpus_from_file(gpus_file), ""
    else:
        found = gpus_mod.read()
        gpus, why = list(found.gpus), found.why_none
    verdicts = report(list(images), gpus) if gpus else []
    if as_json:
        echo(json.dumps({"gpus": [asdict(g) for g in gpus], "no_gpu": why or None,
                         "verdicts": [v.to_json() for v in verdicts]}, indent=2))
    elif gpus:
        echo(table(gpus, verdicts) if images else table(gpus, []) + "\n(no image named: give IMAGE... to judge)")
    if not gpus:
        if not as_json:  # the one error line, exit 3
            raise EnvironmentProblem(f"no GPU to judge against: {why} (--gpus-file FILE judges another host's)")
        return EXIT_ENVIRONMENT
    return EXIT_FAILED if any(v.verdict in (REFUSED, UNKNOWN) for v in verdicts) else 0
