"""The engine's launch line: one derivation for the image's ENTRYPOINT (render), the `docker run` that `builder
serve` prints, and what smoke L3 starts (a container of the image runs its own ENTRYPOINT with these arguments;
the process launcher runs the whole line).

The engine data's `launch` (e.g. `vllm serve {model}`, `python3 -m sglang.launch_server --model-path {model}`) is
split before the model: the part before becomes the ENTRYPOINT, the model (with its flag) starts the arguments,
then where it listens (`smoke.serve_args`), dummy weights and tiny-model flags when smoke asks for them, the
strategy's flags, the engine's own tensor-parallel flag (`tp_flag`) when it shards over N > 1 GPUs, and the user's
own.

The paths the image runs its engine at are part of the same contract (`ImagePaths`): the venv (interpreter prefix and
site-packages), CUDA_HOME of the engine's nvcc JIT, the compile caches' one root, and where a model is mounted. The
templates write them (dockerfiles/macros.j2 python_venv, stages/runtime.j2; tests/unit/deploy/test_warm_host.py holds the
rendered Dockerfile to these values). They matter beyond the image because the compile caches' keys hold absolute
paths (vLLM's compile-cache hash, DeepGEMM's include path, the model's path in vLLM's config hash: docs/warm.md): a
capture made on a GPU host without Docker is only the image's when the engine ran there at these very paths
(`--image-paths`: builder/deploy/runtime/imagepaths.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..engines import Recipe, Strategy

DEFAULT_SERVE_ARGS = ("--host", "{host}", "--port", "{port}")
MODEL_ROOT = "/models"  # where a container sees a model directory of the host (mounted read-only)
VENV = "/opt/venv"
CUDA_JIT_HOME = "/opt/cuda-jit"  # the nvcc wheels' toolkit, linked there (stages/runtime.j2)


@dataclass(frozen=True)
class ImagePaths:
    prefix: str  # sys.prefix of the engine's interpreter
    purelib: str  # its site-packages
    cuda_home: str  # "" when the image has no nvcc JIT
    cache_root: str  # "" when the engine data gives the release no compile caches
    model_root: str = MODEL_ROOT

    def to_json(self) -> dict:
        return asdict(self)


def image_paths(cell) -> ImagePaths:
    """The runtime image's paths for `cell` (a matrix Cell)."""
    return ImagePaths(prefix=VENV, purelib=f"{VENV}/lib/python{cell.python}/site-packages",
                      cuda_home=CUDA_JIT_HOME if cell.runtime_jit else "", cache_root=cell.cache_root or "")


@dataclass(frozen=True)
class LaunchLine:
    entrypoint: tuple[str, ...]  # the image's ENTRYPOINT
    args: tuple[str, ...]  # what follows it: the container's command

    @property
    def argv(self) -> list[str]:
        return [*self.entrypoint, *self.args]


def split(launch) -> tuple[list[str], list[str]]:
    """(the ENTRYPOINT, the rest): the launch line cut before the model argument (and its flag)."""
    launch = list(launch)
    idx = launch.index("{model}") if "{model}" in launch else len(launch)
    if idx > 0 and launch[idx - 1].startswith("--"):
        idx -= 1
    return launch[:idx], launch[idx:]


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with {model}, {drafter}, ... replaced by `values`. A flag value that is JSON (vLLM's
    --speculative-config) gets each value inside its strings and is encoded again, so a value is one JSON string
    whatever it holds: a drafter `org/a","method":"ngram` cannot add or change a key."""
    if text[:1] in "{[":
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None  # "{drafter}" itself, an expected value: not JSON
        if isinstance(parsed, (dict, list)):
            return json.dumps(_fill_json(parsed, values), separators=(",", ":"), ensure_ascii=False)
    return _plain(text, values)


def _fill_json(node, values: dict[str, str]):
    if isinstance(node, str):
        return _plain(node, values)
    if isinstance(node, list):
        return [_fill_json(v, values) for v in node]
    if isinstance(node, dict):
        return {_plain(k, values): _fill_json(v, values) for k, v in node.items()}
    return node


def _plain(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def tp_args(recipe: Recipe, tp: int) -> list[str]:
    """The engine's own tensor-parallel flag for `tp` GPUs (engine data `tp_flag`): none for 1; a UserError for an
    engine version whose data has no such flag."""
    from ..errors import UserError

    if tp < 1:
        raise UserError(f"--tp {tp}: tensor parallel needs at least 1 GPU")
    if tp == 1:
        return []
    if not recipe.tp_flag:
        raise UserError(f"--tp {tp}: the engine data names no tensor-parallel flag (tp_flag) for {recipe.name} "
                        f"{recipe.version}")
    return [recipe.tp_flag, str(tp)]


def launch_line(recipe: Recipe, strategy: Strategy | None, values: dict[str, str], *, dummy_weights: bool = False,
                tiny: bool = False, extra: tuple[str, ...] = (), tp: int = 1) -> LaunchLine:
    """`values`: model, drafter, host, port as the engine sees them (inside the container, or on this host); `tp`:
    the GPUs one engine shards the model over (tensor parallel)."""
    smoke = recipe.smoke
    entry, rest = split(recipe.launch)
    args = [*rest, *smoke.get("serve_args", DEFAULT_SERVE_ARGS)]
    if dummy_weights:
        args += smoke.get("dummy_load", [])
    if tiny:
        args += smoke.get("tiny_args", [])
    args += list(strategy.flags) if strategy is not None else []
    args += tp_args(recipe, tp)
    return LaunchLine(tuple(entry), tuple([fill(a, values) for a in args] + list(extra)))
