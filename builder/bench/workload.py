"""Workloads: the data's (builder/data/bench.toml) or a file, turned into prompts of exact token lengths in the
tokenizer of the model being served (its tokenizer.json, read with the `tokenizers` library)."""

from __future__ import annotations

import json
import random
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UserError
from . import data


@dataclass(frozen=True)
class Workload:
    name: str
    concurrency: int
    requests: int
    output_tokens: int
    seed: int
    mix: tuple[tuple[float, int, int], ...] = ()  # (share, min input tokens, max input tokens)
    prompts_file: Path | None = None  # a JSONL of {"prompt": ...} given as it is

    def to_json(self) -> dict:
        return {"name": self.name, "concurrency": self.concurrency, "requests": self.requests,
                "output_tokens": self.output_tokens, "seed": self.seed,
                "mix": [{"share": s, "input_tokens": [lo, hi]} for s, lo, hi in self.mix],
                "prompts_file": str(self.prompts_file) if self.prompts_file else None}


def _from_table(name: str, t: dict, where: str) -> Workload:
    try:
        mix = tuple((float(m["share"]), int(m["input_tokens"][0]), int(m["input_tokens"][1])) for m in t.get("mix", []))
        w = Workload(name, int(t["concurrency"]), int(t["requests"]), int(t["output_tokens"]), int(t.get("seed", 0)), mix)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UserError(f"{where}: a workload needs concurrency, requests, output_tokens and a mix of "
                        f"{{share, input_tokens = [lo, hi]}} ({exc!r})") from None
    return check(w, where)


def check(w: Workload, where: str) -> Workload:
    if w.concurrency < 1 or w.requests < 1 or w.output_tokens < 1:
        raise UserError(f"{where}: concurrency, requests and output_tokens must be at least 1")
    if not w.prompts_file:
        if not w.mix or abs(sum(s for s, _, _ in w.mix) - 1.0) > 1e-6:
            raise UserError(f"{where}: the shares of the mix must add up to 1")
        if any(lo < 1 or hi < lo for _, lo, hi in w.mix):
            raise UserError(f"{where}: input_tokens must be [lo, hi] with 1 <= lo <= hi")
    return w


def load(spec: str, requests: int | None = None, concurrency: int | None = None, seed: int | None = None) -> Workload:
    """`article` (any name in the data), a TOML file with one workload's keys, or a JSONL of prompts."""
    named = data()["workloads"]
    if spec in named:
        w = _from_table(spec, named[spec], f"--workload {spec}")
    else:
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--workload {spec}: neither a workload of the data ({', '.join(named)}) nor a file")
        if path.suffix == ".jsonl":
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            try:
                rows = [json.loads(ln) for ln in lines]
            except ValueError as exc:
                raise UserError(f"--workload {spec}: not JSONL ({exc})") from None
            if not rows or not all(isinstance(r, dict) and isinstance(r.get("prompt"), str) for r in rows):
                raise UserError(f"--workload {spec}: every line must be an object with a \"prompt\" string")
            w = Workload(path.stem, 50, len(rows), 256, 0, (), path.resolve())
        else:
            try:
                t = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise UserError(f"--workload {spec}: {exc}") from None
            w = _from_table(path.stem, t, f"--workload {spec}")
    over = {k: v for k, v in (("requests", requests), ("concurrency", concurrency), ("seed", seed)) if v is not None}
    return check(replace(w, **over), f"--workload {spec}") if over else w


class PromptMaker:
    """Text whose encoding in `tokenizer_json` has exactly n tokens (no special tokens)."""

    def __init__(self, tokenizer_json: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("builder bench needs the `tokenizers` package: pip install 'builder[bench]'") from None
        if not tokenizer_json.is_file():
            raise UserError(f"{tokenizer_json}: the model has no tokenizer.json (needed for prompts of exact length)")
        self.tok = Tokenizer.from_file(str(tokenizer_json))
        special = set(self.tok.get_added_tokens_decoder())
        self.pool = [i for i in range(self.tok.get_vocab_size()) if i not in special]
        # " word" tokens that encode back to themselves: the pre-tokenizer splits at each space, so n of them
        # in a row are exactly n tokens
        self.words = []
        for i in self.pool:
            piece = self.tok.decode([i])
            if re.fullmatch(r" [A-Za-z]+", piece) and self.tok.encode(piece, add_special_tokens=False).ids == [i]:
                self.words.append(piece)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def make(self, n: int, rng: random.Random) -> tuple[str, int]:
        if len(self.words) >= 8:
            text = "".join(rng.choice(self.words) for _ in range(n))
            got = self.count(text)
            if got == n:
                return text, got
        ids = [rng.choice(self.pool) for _ in range(n)]
        best = ("", 0)
        for _ in range(64):
            text = self.tok.decode(ids)
            enc = self.tok.encode(text, add_special_tokens=False).ids
            best = (text, len(enc))
            if len(enc) == n:
                return best
            ids = enc[:n] if len(enc) > n else enc + [rng.choice(self.pool) for _ in range(n - len(enc))]
        return best


def input_lengths(w: Workload) -> list[int]:
    """The prompt length of every request: each bin's share of the requests, lengths uniform in the bin, shuffled,
    all from the workload's seed."""
    rng = random.Random(w.seed)
    counts = [round(share * w.requests) for share, _, _ in w.mix]
    counts[-1] = w.requests - sum(counts[:-1])
    lengths = [rng.randint(lo, hi) for (_, lo, hi), c in zip(w.mix, counts) for _ in range(c)]
    rng.shuffle(lengths)
    return lengths


def write_dataset(w: Workload, model_dir: Path, dest: Path) -> dict:
    """The JSONL the load generator reads ({"prompt", "output_tokens"} per line); returns what it holds."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if w.prompts_file:
        rows = [json.loads(ln) for ln in w.prompts_file.read_text().splitlines() if ln.strip()]
        rows = [{"prompt": r["prompt"], "output_tokens": int(r.get("output_tokens", w.output_tokens))} for r in rows]
        exact = None
    else:
        maker = PromptMaker(model_dir / "tokenizer.json")
        rng = random.Random(w.seed + 1)
        rows, exact = [], 0
        for n in input_lengths(w):
            text, got = maker.make(n, rng)
            exact += got == n
            rows.append({"prompt": text, "output_tokens": w.output_tokens, "input_tokens": got})
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lens = [r.get("input_tokens") for r in rows if r.get("input_tokens") is not None]
    return {"path": str(dest), "requests": len(rows), "exact_length": exact,
            "input_tokens_min": min(lens) if lens else None, "input_tokens_max": max(lens) if lens else None}
