"""A warm layer's key: everything a boot's compile caches are keyed on, recorded when the layer is captured
(label io.builder.warm.key) and read on the serve side from the host and the launch line, so that one judge
(judge.py) can say, cache by cache, what a boot will reuse and what it will compile.

What each cache's key holds is data (builder/data/warmkeys.toml, read in the engines' code with file and line):
- host parts: the GPU's name (vLLM's compile cache and Inductor, through torch's CacheBase.get_system), its SM
  count (DeepGEMM's kNumSMs), its arch, the driver;
- image parts: torch, Triton, the CUDA toolkit, the engine's code and the absolute paths. A warm image is FROM its
  cold image by digest, so these are the capture's by construction;
- serve parts: the model's path and config, the launch flags the engine hashes (max-model-len, max-num-seqs, TP,
  the speculative config, ...: the [[flags]] tables map each flag to its part), the engine's environment, and the
  tensor-parallel ranks the layer holds (vLLM's rank_<r>_<dp> directories).

A side (`Side`) is one boot: the capture's, read back from the label, or the serve's. Values are strings; None is
"not known here" (a GPU record without an SM count, a model config on a claim), which the judge never treats as
equal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ... import files
from ...image import labels as labels_mod

LABEL = labels_mod.WARM_KEY
FORMAT = 1
HOST_PARTS = ("gpu-name", "sm-count", "arch", "driver")
IMAGE_PARTS = ("torch", "triton", "cuda-toolkit", "engine-code", "paths")
# serve parts read from the launch line through the [[flags]] tables, and those read otherwise
FLAG_PARTS = ("model-path", "max-model-len", "max-num-seqs", "max-num-batched-tokens", "dtype", "quantization",
              "kv-cache-dtype", "speculative", "cuda-graphs", "compilation", "tp", "dp", "engine-args")
SERVE_PARTS = (*FLAG_PARTS, "model-config", "rank", "engine-env")
PARTS = (*HOST_PARTS, *IMAGE_PARTS, *SERVE_PARTS)
SINGLE = {"model-path", "max-model-len", "max-num-seqs", "max-num-batched-tokens", "dtype", "quantization",
          "kv-cache-dtype", "tp", "dp"}  # parts one flag (and its aliases) sets: the value alone counts
ONE = {"tp": "1", "dp": "1"}  # what an absent flag means where every engine agrees
RANK_DIR = re.compile(r"rank_([0-9]{1,4})_([0-9]{1,4})")


@dataclass(frozen=True)
class FlagMap:
    """An engine version's launch flags: which part each feeds, which reach no key (neutral)."""

    parts: dict[str, str]
    neutral: frozenset[str]
    read_in: str = ""

    def split(self, args: tuple[str, ...] | list[str]) -> dict[str, str]:
        """{part: value} of a launch line's arguments (what follows the image's ENTRYPOINT). A flag the data does
        not know counts under engine-args (it may reach the config hash); a bare word is the model (vLLM's
        positional `serve MODEL`). JSON values are compared as JSON, not as text."""
        got: dict[str, list[tuple[str, str]]] = {}
        args = list(args)
        i = 0
        while i < len(args):
            tok = args[i]
            if not tok.startswith("-") or _number(tok):
                got.setdefault("model-path", []).append(("", tok))
                i += 1
                continue
            flag, eq, value = tok.partition("=")
            if not eq:
                if i + 1 < len(args) and (not args[i + 1].startswith("-") or _number(args[i + 1])):
                    value = args[i + 1]
                    i += 1
                else:
                    value = ""
            i += 1
            if flag in self.neutral:
                continue
            part = self.parts.get(flag, "engine-args")
            got.setdefault(part, []).append((flag, _canonical(value)))
        out = {}
        for part, pairs in got.items():
            if part in SINGLE:
                out[part] = pairs[-1][1]  # the last one given wins, as argparse reads it
            else:
                out[part] = json.dumps(sorted(dict(pairs).items()), separators=(",", ":"))
        for part in FLAG_PARTS:  # a flag not given is the engine's default: a known value, the same on both sides
            out.setdefault(part, ONE.get(part, ""))
        return out


def _number(tok: str) -> bool:
    return bool(re.fullmatch(r"-[0-9][0-9.e+-]*", tok))


def _canonical(value: str) -> str:
    if value[:1] in "{[":
        try:
            return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
        except ValueError:
            pass
    return value


@dataclass(frozen=True)
class Side:
    """One boot's side of the key. `parts` holds the flag parts (FlagMap.split), model-config and engine-env;
    `ranks`: the rank directories a capture holds, or those a serve needs."""

    gpu_name: str | None
    sm_count: int | None
    arch: str | None  # sm90
    driver: str | None
    parts: dict[str, str | None]
    ranks: frozenset[str] = frozenset()

    def value(self, part: str):
        if part == "gpu-name":
            return self.gpu_name
        if part == "sm-count":
            return None if self.sm_count is None else str(self.sm_count)
        if part == "arch":
            return self.arch
        if part == "driver":
            return self.driver
        if part == "rank":
            return ",".join(sorted(self.ranks)) if self.ranks else None
        return self.parts.get(part)


def needed_ranks(tp: str | None, dp: str | None) -> frozenset[str]:
    """vLLM's compile-cache directories a boot of TP x DP ranks reads (rank_<tp rank>_<dp rank>)."""
    try:
        t, d = int(tp or 1), int(dp or 1)
    except ValueError:
        return frozenset()
    return frozenset(f"rank_{r}_{p}" for r in range(max(t, 1)) for p in range(max(d, 1)))


def serve_parts(flags: FlagMap | None, args, env: dict[str, str], cache_vars: set[str],
                model_config: str | None) -> dict[str, str | None]:
    """A boot's serve parts: its launch line read through the engine version's flag map (None: no flag data, every
    flag part unknown), the model's config.json sha256 (None: not readable here) and its environment."""
    parts: dict[str, str | None] = flags.split(tuple(args)) if flags is not None else {}
    parts["model-config"] = model_config
    parts["engine-env"] = env_part(env, cache_vars)
    return parts


def env_part(env: dict[str, str], cache_vars: set[str]) -> str:
    """The engine's environment as one value: the strategy's and the user's variables, not the cache variables the
    image sets (those are the paths)."""
    return json.dumps(sorted((k, v) for k, v in env.items() if k not in cache_vars and k != "HOME"),
                      separators=(",", ":"))


def model_config_sha(model_dir: Path | str | None) -> str | None:
    """sha256 of a model directory's config.json; None when it cannot be read here."""
    import hashlib

    if model_dir is None:
        return None
    config = Path(model_dir) / "config.json"
    try:
        return hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        return None


def ranks_in(tree: Path) -> frozenset[str]:
    """The rank directories of vLLM's compile cache a captured tree holds (vllm/torch_compile_cache/<hash>/rank_*)."""
    found = set()
    for hashdir in (Path(tree) / "vllm" / "torch_compile_cache").glob("*"):
        found.update(p.name for p in hashdir.glob("rank_*") if RANK_DIR.fullmatch(p.name))
    return frozenset(found)


def cache_subdirs() -> dict[str, str]:
    """{compile cache name: its subdirectory under the cache root} (engines.toml compile_caches)."""
    return {name: c["subdir"] for name, c in files.package_data("engines.toml")["compile_caches"].items()}


def files_per_cache(listing: dict[str, int], subdirs: dict[str, str]) -> dict[str, int]:
    """{cache name: files} of a capture's file list (paths relative to the cache root), by each cache's subdir."""
    by_dir = {d: name for name, d in subdirs.items()}
    out: dict[str, int] = {}
    for path in listing:
        top = path.split("/", 1)[0]
        if top in by_dir:
            out[by_dir[top]] = out.get(by_dir[top], 0) + 1
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Record:
    """What io.builder.warm.key holds: the facts of the capture's boot as they were, not yet read into parts (the
    key data may learn a flag later: the same record is then read with it) — the GPU, the launch line's arguments
    and environment, the model's config, the rank directories the tree holds and its files per cache."""

    gpu_name: str | None
    sm_count: int | None
    arch: str | None
    driver: str | None
    args: tuple[str, ...]
    env: dict[str, str]
    model_config: str | None
    ranks: frozenset[str] = frozenset()
    caches: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, gpu, args, env: dict[str, str], model_config: str | None, ranks: frozenset[str],
           caches: dict[str, int]) -> Record:
        """The record of a capture's boot on `gpu` (runtime/gpus.Gpu, None without one)."""
        return cls(gpu.name if gpu else None, gpu.sm_count if gpu else None, f"sm{gpu.compute_cap}" if gpu else None,
                   gpu.driver if gpu else None, tuple(args), dict(env), model_config, frozenset(ranks), dict(caches))

    def side(self, flags: FlagMap | None) -> Side:
        """The capture's side of the key, its launch line read through the engine version's flag map."""
        return Side(self.gpu_name, self.sm_count, self.arch, self.driver,
                    serve_parts(flags, self.args, self.env, set(), self.model_config), self.ranks)

    def to_label(self) -> str:
        return json.dumps({"format": FORMAT, "gpu-name": self.gpu_name, "sm-count": self.sm_count, "arch": self.arch,
                           "driver": self.driver, "args": list(self.args), "env": self.env,
                           "model-config": self.model_config, "ranks": sorted(self.ranks), "caches": self.caches},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_label(cls, text: str) -> Record | None:
        """The record of a label; None when it is no record of this format (the judge then says so)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        args, env, caches, ranks = data.get("args"), data.get("env"), data.get("caches"), data.get("ranks", [])
        strs = [data.get(k) for k in ("gpu-name", "arch", "driver", "model-config")]
        sm = data.get("sm-count")
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)
                and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                and isinstance(caches, dict)
                and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in caches.items())
                and isinstance(ranks, list) and all(isinstance(r, str) and RANK_DIR.fullmatch(r) for r in ranks)
                and all(v is None or isinstance(v, str) for v in strs)
                and (sm is None or (isinstance(sm, int) and not isinstance(sm, bool)))):
            return None
        return cls(strs[0], sm, strs[1], strs[2], tuple(args), env, strs[3], frozenset(ranks), caches)


def product_gpu(product: str, labels: dict[str, str]):
    """The GPU a Kubernetes pod gets where --gpu-product pins nvidia.com/gpu.product (GPU feature discovery writes the
    CUDA name with dashes: "NVIDIA H200" -> NVIDIA-H200): the layer's own GPU when the product is the layer's (one
    product is one SKU: its SM count and arch; the node's driver stays unknown), else a GPU known by name only."""
    from .gpus import Gpu

    raw = labels.get(LABEL)
    record = Record.from_label(raw) if raw else None
    if record is not None and record.gpu_name and record.gpu_name.replace(" ", "-") == product:
        cc = int(record.arch[2:]) if record.arch and record.arch[2:].isdigit() else None
        return Gpu(0, record.gpu_name, "", cc, "", record.sm_count)
    return Gpu(0, product, "", None, "", None)


# -- the data: what each cache's key holds, per engine version ----------------------------------------------------
@dataclass(frozen=True)
class KeyPart:
    part: str
    at: str  # upstream file:line
    how: str


@dataclass(frozen=True)
class CacheKey:
    cache: str
    engine: str
    versions: str
    read_in: str
    parts: tuple[KeyPart, ...]
    not_in_key: tuple[KeyPart, ...]


@dataclass(frozen=True)
class KeyData:
    keys: tuple[CacheKey, ...]
    flags: tuple[tuple[str, str, FlagMap], ...]  # (engine, versions, map)
    what: dict[str, str]  # part -> what it is

    def key_of(self, cache: str, engine: str, version: str) -> CacheKey | None:
        for k in self.keys:
            if k.cache == cache and k.engine == engine and _in(version, k.versions):
                return k
        return None

    def flags_of(self, engine: str, version: str) -> FlagMap | None:
        for e, versions, m in self.flags:
            if e == engine and _in(version, versions):
                return m
        return None


def _in(version: str, spec: str) -> bool:
    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidVersion, InvalidSpecifier):
        return False


_DATA: KeyData | None = None


def data(extra: dict | None = None) -> KeyData:
    """builder/data/warmkeys.toml, read once and checked: every part a known one, every cache one engines.toml
    names, every range a PEP 440 specifier (a fault in the shipped data is a bug: ValueError). `extra`: the
    [[keys]] and [[flags]] of an extra engine file (Knowledge.warm_keys), read after the built-in ones."""
    global _DATA
    if _DATA is None:
        _DATA = parse(files.package_data("warmkeys.toml"), _cache_names())
    if not extra:
        return _DATA
    more = parse({"parts": {p: {"what": w} for p, w in _DATA.what.items()}, **extra}, _cache_names())
    return KeyData(_DATA.keys + more.keys, _DATA.flags + more.flags, _DATA.what)


def of_knowledge(kn) -> KeyData:
    """The key data a Knowledge (builder/engines.py) holds: the built-in file's, and the warm_keys of its extra
    engine files (a matrix's private engine, a test double), read once per Knowledge."""
    extra = (kn.data.get("warm_keys") or {}) if kn is not None else {}
    if not any(extra.values()):
        return data()
    if getattr(kn, "_warm_keys", None) is None:
        kn._warm_keys = data(extra)
    return kn._warm_keys


def _cache_names() -> set[str]:
    return set(files.package_data("engines.toml")["compile_caches"])


def parse(raw: dict, caches: set[str]) -> KeyData:
    what = {p: str(t.get("what", "")) for p, t in raw.get("parts", {}).items()}
    unknown = set(what) - set(PARTS)
    if unknown or set(PARTS) - set(what):
        raise ValueError(f"warmkeys.toml [parts]: {sorted(unknown)} unknown, {sorted(set(PARTS) - set(what))} missing")

    def parts_of(items, where) -> tuple[KeyPart, ...]:
        out = []
        for it in items:
            if it.get("part") not in PARTS:
                raise ValueError(f"warmkeys.toml {where}: part {it.get('part')!r} is not one of [parts]")
            out.append(KeyPart(it["part"], str(it.get("at", "")), str(it.get("how", ""))))
        return tuple(out)

    keys = []
    for i, k in enumerate(raw.get("keys", [])):
        where = f"keys[{i}] ({k.get('cache')}, {k.get('engine')} {k.get('versions')})"
        if k.get("cache") not in caches:
            raise ValueError(f"warmkeys.toml {where}: cache is not an engines.toml compile cache")
        SpecifierSet(k["versions"])
        keys.append(CacheKey(k["cache"], k["engine"], k["versions"], k.get("read_in", ""),
                             parts_of(k.get("parts", []), where), parts_of(k.get("not_in_key", []), where)))
    flag_maps = []
    for i, f in enumerate(raw.get("flags", [])):
        SpecifierSet(f["versions"])
        bad = {p for p in f.get("parts", {}).values() if p not in FLAG_PARTS}
        if bad:
            raise ValueError(f"warmkeys.toml flags[{i}]: {sorted(bad)} are not flag parts ({', '.join(FLAG_PARTS)})")
        flag_maps.append((f["engine"], f["versions"], FlagMap(dict(f.get("parts", {})),
                                                              frozenset(f.get("neutral", [])), f.get("read_in", ""))))
    return KeyData(tuple(keys), tuple(flag_maps), what)
