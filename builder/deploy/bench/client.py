"""The load generator: vLLM's own benchmark client, `vllm bench serve`, for every engine.

Why this one: one client for every engine of a comparison, so vLLM and SGLang rows mean the same thing — its
`openai` backend speaks the OpenAI completions API both engines serve (streamed, usage included), and it defines
TTFT (first non-empty chunk), ITL (every gap between chunks), TPOT ((E2E − TTFT) / (output tokens − 1)) and
goodput (`--goodput ttft:MS`) one way for both. It ships in the vLLM wheel the GPU host already carries, so it
costs nothing to bring. GuideLLM 0.8.1 requires torch, datasets and transformers (its default data loader is
torch's), and AIPerf 0.13.0 about fifty packages (dash, kubernetes, scipy, plotly, ...): neither fits the GPU
host's carry. SGLang's `bench_serving` imports torch through sglang.srt. vLLM's client needs torch too, so it runs
where vLLM is installed: a GPU host, or any environment named with --client-python.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ... import files, schema
from ...errors import UserError

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")
NAME = "vllm bench serve"


@dataclass(frozen=True)
class ClientRun:
    argv: list[str]
    result: dict  # the client's own result file
    seconds: float
    output: str


def argv(python: str, base_url: str, model_name: str, tokenizer: str, dataset: Path, requests: int,
         concurrency: int, output_tokens: int, seed: int, result_dir: Path, result_file: str,
         slo_ttft_ms: float | None) -> list[str]:
    out = [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
           "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
           "--model", model_name, "--tokenizer", tokenizer,
           "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(output_tokens),
           "--skip-chat-template", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
           "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--seed", str(seed),
           "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES)),
           "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file, "--disable-tqdm"]
    if slo_ttft_ms is not None:
        out += ["--goodput", f"ttft:{slo_ttft_ms:g}"]
    return out


def run(args: list[str], env: dict[str, str], timeout: float) -> ClientRun:
    result_path = Path(args[args.index("--result-dir") + 1]) / args[args.index("--result-filename") + 1]
    result_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"--client-python {args[0]}: not found") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        raise ClientFailed(f"{NAME} did not finish in {timeout:g}s", out) from None
    seconds = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 or not result_path.is_file():
        raise ClientFailed(f"{NAME} exited {proc.returncode}" + ("" if result_path.is_file() else ", no result file"),
                           output)
    try:  # another program's file: its shape is checked before a figure of it is read
        result = files.load_json(result_path, f"{NAME} result file")
        schema.check(f"{result_path}: {NAME}'s result", result, schema.CLIENT_RESULT)
    except UserError as exc:
        raise ClientFailed(str(exc), output) from None
    why = no_figure(result)
    if why:
        raise ClientFailed(f"{NAME}: {why} ({result_path}): no figure of this run means anything", output)
    return ClientRun(args, result, seconds, output)


def no_figure(result: dict) -> str:
    """Why a well-formed result is still no measurement (a failed row, never a figure), else "": a request
    failed (its `failed` count, or an error in its `errors`), none completed, or it lasted no time."""
    completed, failed, duration = result.get("completed"), result.get("failed"), result.get("duration")
    errors = [e for e in result.get("errors") or [] if e]
    failed = max(failed if isinstance(failed, (int, float)) else 0, len(errors))
    if not completed or completed <= 0:
        return f"no request completed ({failed:g} failed)"
    if failed:
        first = f"; the first error: {errors[0].splitlines()[0][:200]}" if errors else ""
        return f"{failed:g} of {completed + failed:g} requests failed{first}"
    if not duration or duration <= 0:
        return f"a duration of {duration if duration is not None else 'null'} s for {completed:g} requests"
    return ""


class ClientFailed(Exception):
    def __init__(self, why: str, output: str):
        super().__init__(why)
        self.output = output

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.output.strip().splitlines()[-n:])


def figures(result: dict) -> dict:
    """The row's figures from the client's result file (its own percentiles; nothing recomputed here)."""
    out = {k: result.get(k) for k in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                                      "request_throughput", "output_throughput", "request_goodput")}
    for m in METRICS:
        for p in PERCENTILES:
            out[f"{m}_ms_p{p}"] = result.get(f"p{p}_{m}_ms")
    errors = [e for e in result.get("errors") or [] if e]
    out["errors"] = len(errors)
    if errors:
        out["first_error"] = errors[0][:300]
    client_spec = {k: result[k] for k in ("spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                                           "spec_decode_num_drafts", "spec_decode_draft_tokens",
                                           "spec_decode_accepted_tokens") if k in result}
    if client_spec:
        out["client_spec_decode"] = client_spec
    return out
