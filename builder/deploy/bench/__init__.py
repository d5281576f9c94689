"""builder bench: which strategy serves fastest from this image on this host.

For each strategy (none, MTP2, MTP7, DFlash2) the engine is started once as smoke L3 starts it
(builder/deploy/runtime/engine.py: a container of the image, or a process on a GPU host without Docker; the smoke
launch line), waited for, warmed up by one discarded pass of the workload, and driven `repeats` times (3 by
default) by a real load generator — vLLM's own `vllm bench serve`, the same client for every engine of a
comparison (client.py says why) — with a workload from data (builder/data/bench.toml: `article` is the
article's 50 users, 70 % 32–128 / 30 % 512–2048 prompt tokens, 256 output tokens). Each row holds the client's
figures, the engine's own speculative-decoding counters (/metrics deltas, SGLang's server info), peak GPU memory,
boot time, the first request's TTFT and the greedy-output match rate against no speculation.

workload.py  workloads (data) → prompts of exact token lengths in the served model's tokenizer
client.py    the load generator: its command line and its result file
run.py       one engine boot per strategy: readiness, one discarded warm-up pass, repeats, counters, memory,
             losslessness
results.py   rows → table, JSON, CSV, PNG; `bench diff`
(the verbs are builder/cli/bench.py)
"""

import tomllib
from importlib import resources


def data() -> dict:
    return tomllib.loads(resources.files("builder").joinpath("data/bench.toml").read_text())
