"""Workloads: the data's (builder/data/bench.toml) or a file, turned into prompts of exact token lengths in the
tokenizer of the model being served (its tokenizer.json, read with the `tokenizers` library)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ... import files, schema
from ...errors import UserError
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
    """A workload table (the data's, or a TOML file's) checked by its shape (schema.WORKLOAD)."""
    schema.check(where, t, schema.WORKLOAD)
    mix = tuple((float(m["share"]), m["input_tokens"][0], m["input_tokens"][1]) for m in t["mix"])
    return check(Workload(name, t["concurrency"], t["requests"], t["output_tokens"], t.get("seed", 0), mix), where)


def check(w: Workload, where: str) -> Workload:
    """What the shape cannot say: the mix's shares add up to 1."""
    if not w.prompts_file and abs(sum(s for s, _, _ in w.mix) - 1.0) > 1e-6:
        raise UserError(f"{where}: mix: the shares must add up to 1, they add up to {sum(s for s, _, _ in w.mix):g}")
    return w


def _prompts(path: Path, where: str) -> list[dict]:
    """The lines of a JSONL workload, each {"prompt": ..., "output_tokens": n?} (schema.PROMPT_LINE)."""
    rows = []
    for n, line in enumerate(files.read_text(path, "workload file").splitlines(), 1):
        if line.strip():
            row = files.load_json(f"{where}: line {n}", "JSONL workload line", text=line)
            schema.check(f"{where}: line {n}", row, schema.PROMPT_LINE)
            rows.append(row)
    if not rows:
        raise UserError(f"{where}: no prompt in it (a JSONL workload holds one {{\"prompt\": ...}} per line)")
    if len(rows) > 1_000_000:
        raise UserError(f"{where}: {len(rows)} prompts; at most 1000000")
    return rows


def load(spec: str, requests: int | None = None, concurrency: int | None = None, seed: int | None = None) -> Workload:
    """`article` (any name in the data), a TOML file with one workload's keys, or a JSONL of prompts. The flags
    that override it are checked by their own callbacks (cli/flags.py)."""
    named = data()["workloads"]
    where = f"--workload {spec}"
    if spec in named:
        w = _from_table(spec, named[spec], f"builder/data/bench.toml: workloads.{spec}")
    else:
        path = Path(spec)
        if not path.exists() and not path.is_symlink():
            raise UserError(f"{where}: neither a workload of the data ({', '.join(named)}) nor a file")
        if path.suffix == ".jsonl":
            rows = _prompts(path, where)
            w = Workload(path.stem, 50, len(rows), 256, 0, (), path.resolve())
        else:
            w = _from_table(path.stem, files.load_toml(path, "workload file"), where)
    over = {k: v for k, v in (("requests", requests), ("concurrency", concurrency), ("seed", seed)) if v is not None}
    return replace(w, **over) if over else w


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
        rows = _prompts(w.prompts_file, str(w.prompts_file))
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
