"""The snapshot's key: everything that must be the same where it is restored. A restored process keeps its GPU
memory layout, its driver's state and the files it had open, so unlike a warm layer (runtime/warmkey.py, where a
part that differs only recompiles) any part that differs refuses the restore, named."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ...errors import UserError

KEY = "key.json"
FORMAT = 1


@dataclass(frozen=True)
class Key:
    gpus: tuple[str, ...]  # the GPUs the engine ran on, by name, in order ("none" counts none)
    driver: str  # the CUDA driver's version ("none" without a GPU)
    subject: str  # the image's digest (docker) or the process route's venv and bundle identity
    model: str  # the model as the engine was given it
    model_config_sha256: str  # sha256 of its config.json ("" when it has none)
    engine_args: tuple[str, ...]  # the launch line after the entrypoint
    tp: int
    criu: str  # CRIU's version: the image format one release reads

    def to_json(self) -> dict:
        return {"format": FORMAT, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}

    def write(self, directory: Path) -> None:
        (directory / KEY).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def differences(self, here: Key) -> list[str]:
        """Each part where `here` (this host, this restore) differs: 'part: snapshot's value, here value'."""
        out = []
        for f in fields(self):
            if f.name == "criu" and self.criu.split(".")[0] == here.criu.split(".")[0]:
                continue  # a CRIU of the same major reads the images
            mine, theirs = getattr(self, f.name), getattr(here, f.name)
            if mine != theirs:
                out.append(f"{f.name.replace('_', ' ')}: the snapshot's {_say(mine)}, here {_say(theirs)}")
        return out


def _say(value) -> str:
    return " ".join(value) if isinstance(value, tuple) and value else repr(value) if value != () else "none"


def read(directory: Path) -> Key:
    """The key of a snapshot directory; a missing, unreadable or altered key file is refused in one line."""
    path = Path(directory) / KEY
    if not Path(directory).is_dir():
        raise UserError(f"{directory}: no snapshot directory (builder snapshot take writes one)")
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {directory} is not a snapshot (builder snapshot take writes one)") from None
    except OSError as exc:
        raise UserError(f"{path}: not a snapshot key ({type(exc).__name__}); take the snapshot again") from None
    return parse(text, str(path))


def parse(text: bytes, path: str) -> Key:
    """A key from its JSON bytes (key.json, or a pushed snapshot's config blob); `path` names it in a refusal."""
    try:
        raw = json.loads(text.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not a snapshot key ({type(exc).__name__}); take the snapshot again") from None
    names = {f.name: f.type for f in fields(Key)}
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or set(raw) - {"format"} != set(names):
        raise UserError(f"{path}: not a snapshot key of format {FORMAT} (its parts: {', '.join(names)}); take the "
                        "snapshot again")
    for name in ("gpus", "engine_args"):
        if not isinstance(raw[name], list) or not all(isinstance(v, str) for v in raw[name]):
            raise UserError(f"{path}: {name} is not a list of strings; take the snapshot again")
    if not isinstance(raw["tp"], int) or isinstance(raw["tp"], bool) or raw["tp"] < 1:
        raise UserError(f"{path}: tp {raw['tp']!r} is no tensor-parallel size; take the snapshot again")
    for name in ("driver", "subject", "model", "model_config_sha256", "criu"):
        if not isinstance(raw[name], str):
            raise UserError(f"{path}: {name} is not a string; take the snapshot again")
    return Key(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k != "format"})


def gpu_part(host) -> tuple[tuple[str, ...], str]:
    """(GPU names, driver) of runtime.gpus.HostGpus; (("none",), "none") without a GPU."""
    if host is None or not host.present:
        return ("none",), "none"
    return tuple(g.name for g in host.gpus), host.gpus[0].driver
