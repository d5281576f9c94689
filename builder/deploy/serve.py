"""`builder serve IMAGE --strategy S --model PATH`: the exact `docker run` that serves a published image —
its GPUs, the model mounted read-only, the port, and the strategy's real flags and environment from the engine
data (builder/data/engines.toml) for the engine version the image's labels name.

The image's ENTRYPOINT is the engine's launch line up to the model; the arguments here are the rest of that
line, then where it listens, then the strategy's flags: builder/image/launchline.py, the derivation render and smoke L3
use too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from .. import docker
from ..image import labels as labels_mod
from ..errors import UserError
from ..image import launchline

MODEL_ROOT = launchline.MODEL_ROOT
LABEL_ENGINE, LABEL_VERSION, LABEL_STRATEGIES = labels_mod.ENGINE, labels_mod.ENGINE_VERSION, labels_mod.STRATEGIES


@dataclass(frozen=True)
class ServeLine:
    argv: list[str]
    health: str  # URL that answers once the engine is ready ("" when the data has none)
    notes: list[str]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def serve_line(image: str, labels: dict[str, str], kn, strategy: str, model: Path, port: int = 8000,
               bind: str = "127.0.0.1", gpus: str = "all", drafter: str | None = None, name: str | None = None,
               extra_args: tuple[str, ...] = (), docker_cmd: str = "docker") -> ServeLine:
    engine, version = labels_mod.engine(labels)
    if not engine or not version:
        raise UserError(f"{image}: no {LABEL_ENGINE} / {LABEL_VERSION} labels: not an image builder made")
    recipe = kn.recipe(engine, version)
    built_for = labels_mod.strategies(labels)
    labels_mod.check_strategy(recipe, strategy, built_for, image)
    s = recipe.strategy(strategy)
    model = model.resolve()
    if not model.is_dir():
        raise UserError(f"--model: {model} is not a directory (a local checkpoint: config.json, weights, tokenizer)")
    mounts = [(model, f"{MODEL_ROOT}/{model.name}")]
    drafter_value = drafter or s.drafter
    if drafter and Path(drafter).is_dir():
        d = Path(drafter).resolve()
        mounts.append((d, f"{MODEL_ROOT}/{d.name}"))
        drafter_value = f"{MODEL_ROOT}/{d.name}"
    values = {"model": mounts[0][1], "drafter": drafter_value or "", "host": "0.0.0.0", "port": str(port)}
    args = list(launchline.launch_line(recipe, s, values, extra=tuple(extra_args)).args)
    argv = docker.run_argv(image, args, gpus=None if gpus == "none" else gpus if gpus == "all" else f"device={gpus}",
                           ipc="host", ports=(f"{bind}:{port}:{port}",), mounts=tuple((str(a), b) for a, b in mounts),
                           env=tuple(s.env), name=name, docker=docker_cmd)
    notes = []
    if drafter_value and not drafter and s.drafter:
        notes.append(f"{strategy} drafts with {s.drafter} (engine data); the engine downloads it unless you pass "
                     "--drafter DIR (mounted read-only)")
    health = f"http://{'127.0.0.1' if bind in ('0.0.0.0', '') else '[::1]' if bind == '[::]' else bind}:{port}{recipe.health}" if recipe.health else ""
    return ServeLine(argv, health, notes)
