"""The one judge of a warm layer before a boot: for each compile cache the layer holds files of, whether this boot
reuses them (every part of that cache's key, builder/data/warmkeys.toml, is the capture's), compiles (a part
differs: which, this boot's value and the layer's, and the upstream line that puts it in the key) or cannot be
judged (a part this side does not know: a GPU whose SM count was not read, a model config on a claim). `doctor
--host IMAGE`, `builder serve` (docker and Kubernetes) and `smoke` (a warm image; --expect-warm with --warm-key) all
ask `judge`; serve sizes the boot budget and the compile-cache volume from the answer (a layer that does not hold
gets the cold budget measured where it was made, never a restart loop).

The judge predicts; the boot measures. Smoke L3 boots and reports which caches it really wrote (layers.py
cache_verdict), and a judged hit that compiled is named as what it is: a part the key data lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...image import labels as labels_mod
from . import warmkey as key_mod
from .warmkey import Record, Side

HIT, COMPILE, UNKNOWN = "hit", "compile", "unknown"


@dataclass(frozen=True)
class Differs:
    part: str
    have: str | None  # this boot's
    want: str | None  # the layer's
    at: str  # the upstream line that puts the part in the cache's key

    def text(self) -> str:
        if self.have is None or self.want is None:
            side = "this boot" if self.have is None else "the capture"
            return f"{self.part}: not known for {side} ({self.at})"
        return f"{self.part} {_short(self.have)} (the layer: {_short(self.want)}) — {self.at}"


def _short(value: str) -> str:
    return value if len(value) <= 80 else value[:77] + "..."


@dataclass(frozen=True)
class CacheVerdict:
    cache: str
    files: int
    verdict: str  # hit | compile | unknown
    differs: tuple[Differs, ...] = ()
    why: str = ""  # a verdict without a part (no key data for this version)

    def text(self) -> str:
        head = f"{self.cache} ({self.files} files): {self.verdict}"
        if self.why:
            return f"{head}: {self.why}"
        if self.differs:
            return f"{head}: " + "; ".join(d.text() for d in self.differs)
        return head

    def to_json(self) -> dict:
        return {"cache": self.cache, "files": self.files, "verdict": self.verdict, "why": self.why,
                "differs": [{"part": d.part, "have": d.have, "want": d.want, "at": d.at} for d in self.differs]}


@dataclass(frozen=True)
class Judgement:
    """Per cache what a boot will do with a warm layer, and what follows for its budget."""

    caches: tuple[CacheVerdict, ...]
    made_for: str  # one line: what the layer was made for
    cold_s: float | None  # the cold boot measured where the layer was made
    warm_s: float | None  # the warm boot measured there
    problem: str = ""  # the layer cannot be judged at all (no key recorded, labels builder did not write)

    @property
    def holds(self) -> bool:
        return not self.problem and all(c.verdict == HIT for c in self.caches)

    @property
    def compiles(self) -> tuple[str, ...]:
        return tuple(c.cache for c in self.caches if c.verdict != HIT)

    def summary(self) -> str:
        if self.problem:
            return f"{self.made_for}: {self.problem}: judged as a miss (cold boot {_s(self.cold_s)} measured)"
        if self.holds:
            return f"{self.made_for}: every cache's key matches; the first boot reuses it (warm boot {_s(self.warm_s)})"
        return (f"{self.made_for}: {', '.join(self.compiles)} will compile or cannot be judged: the first boot is a "
                f"cold one (cold boot {_s(self.cold_s)} measured where the layer was made)")

    def lines(self) -> list[str]:
        return [self.summary(), *(f"  {c.text()}" for c in self.caches)]

    def to_json(self) -> dict:
        return {"holds": self.holds, "made_for": self.made_for, "cold_s": self.cold_s, "warm_s": self.warm_s,
                "problem": self.problem, "caches": [c.to_json() for c in self.caches]}


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:g} s"


def judge(engine: str, version: str, record: Record | None, serve: Side, *, made_for: str = "the warm layer",
          cold_s: float | None = None, warm_s: float | None = None,
          data: key_mod.KeyData | None = None) -> Judgement:
    """What a boot whose side is `serve` does with the layer `record` describes, cache by cache."""
    data = data or key_mod.data()
    if record is None:
        return Judgement((), made_for, cold_s, warm_s, problem="the image records no warm key "
                         f"({key_mod.LABEL}: made before builder recorded one, or not builder's)")
    captured = record.side(data.flags_of(engine, version))
    out = []
    for cache, n in sorted(record.caches.items()):
        if n <= 0:
            continue
        ck = data.key_of(cache, engine, version)
        if ck is None:
            out.append(CacheVerdict(cache, n, UNKNOWN, why=f"the key data (warmkeys.toml) has no entry for {cache} of "
                                    f"{engine} {version}"))
            continue
        differs, unknown = [], []
        for kp in ck.parts:
            if kp.part in key_mod.IMAGE_PARTS:
                continue  # the warm image is FROM its cold image by digest: the same torch, toolkit, code, paths
            if kp.part == "rank":  # the capture's rank directories (vLLM's), else those its TP x DP made
                need = serve.ranks
                have = captured.ranks or key_mod.needed_ranks(captured.value("tp"), captured.value("dp"))
                if need and not need <= have:
                    differs.append(Differs("rank", ",".join(sorted(need)), ",".join(sorted(have)) or "none", kp.at))
                continue
            have, want = serve.value(kp.part), captured.value(kp.part)
            if have is None or want is None:
                unknown.append(Differs(kp.part, have, want, kp.at))
            elif have != want:
                differs.append(Differs(kp.part, have, want, kp.at))
        verdict = COMPILE if differs else UNKNOWN if unknown else HIT
        out.append(CacheVerdict(cache, n, verdict, tuple(differs + unknown)))
    return Judgement(tuple(out), made_for, cold_s, warm_s)


def side(gpu, flags: key_mod.FlagMap | None, args, env: dict[str, str], cache_vars: set[str],
         model_config: str | None, ranks: frozenset[str] | None = None) -> Side:
    """A boot's side: `gpu` (gpus.Gpu, or None when the GPU is not known here), the launch line's arguments read
    through the engine version's flag map (None: no flag data, every flag part unknown), its environment, the
    model's config.json sha256 (None: not readable here), and the rank directories (a capture: those it holds;
    None: those TP x DP needs)."""
    parts = key_mod.serve_parts(flags, args, env, cache_vars, model_config)
    if ranks is None:
        ranks = key_mod.needed_ranks(parts.get("tp"), parts.get("dp"))
    if gpu is None:
        return Side(None, None, None, None, parts, ranks)
    return Side(gpu.name, gpu.sm_count, f"sm{gpu.compute_cap}" if gpu.compute_cap else None, gpu.driver or None,
                parts, ranks)


def of_image(labels: dict[str, str], serve: Side, data: key_mod.KeyData | None = None) -> Judgement | None:
    """The judgement of serving an image (its labels) as `serve`; None for an image without a warm layer."""
    w = labels_mod.warm(labels)
    if not w:
        return None
    engine, version = labels_mod.engine(labels)
    if problem := labels_mod.warm_problem(labels):
        return Judgement((), _made_for(w), _float(w.get("cold-boot-s")), _float(w.get("warm-boot-s")),
                         problem=f"warm labels that builder warm did not write: {problem}")
    return of_facts(w, engine or "", version or "", serve, data)


def of_facts(facts: dict, engine: str, version: str, serve: Side, data: key_mod.KeyData | None = None) -> Judgement:
    """The judgement of a capture's facts (warm.json, or an image's io.builder.warm.* labels read as a dict) for a
    boot whose side is `serve`."""
    made_for, cold_s, warm_s = _made_for(facts), _float(facts.get("cold-boot-s")), _float(facts.get("warm-boot-s"))
    raw = facts.get("key")
    record = Record.from_label(raw) if isinstance(raw, str) and raw else None
    if raw and record is None:
        return Judgement((), made_for, cold_s, warm_s, problem=f"{key_mod.LABEL} is not a key builder warm wrote")
    return judge(engine, version, record, serve, made_for=made_for, cold_s=cold_s, warm_s=warm_s, data=data)


def _made_for(w: dict) -> str:
    return (f"warm layer for {w.get('strategy') or '?'} made on {w.get('gpu') or '?'} ({w.get('gpu-arch') or '?'}), "
            f"driver {w.get('driver') or '?'}")


def _float(value) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f > 0 else None
