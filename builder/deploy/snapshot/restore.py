"""`builder snapshot restore`: judge the snapshot's key against this host before anything starts (another GPU,
driver, image digest, model or launch line refuses it, named: exit 2, and the warm boot is what runs instead),
restore the tree with CRIU in a fresh PID namespace (a new container; on this host `unshare --pid --fork
--mount-proc`), restore and unlock its CUDA processes, wake it, then wait for /v1/models and check that a greedy
completion says what it said before the checkpoint. A restore that fails part-way ends everything it restored (the
container, or the namespace's init) and says to boot warm."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Callable

from ...errors import Failed, UserError
from ..runtime.engine import BootFailed
from . import criu as criu_mod
from . import cuda, key as key_mod, remaps
from .take import IMAGES, LOG, PROMPT, RECORD, TOKENS, boot, client

PIDFILE = "restore.pid"  # the restored tree's root, as CRIU writes it (O_EXCL)

FALLBACK = "boot it warm instead (builder serve IMAGE, or the warm image)"


def read_record(directory: Path) -> dict:
    path = directory / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise UserError(f"{path}: missing or not a snapshot record; take the snapshot again") from None
    if not isinstance(record, dict) or not isinstance(record.get("answer"), str) or \
            not isinstance(record.get("served_model"), str):
        raise UserError(f"{path}: not a snapshot record (no answer or served_model); take the snapshot again")
    if not (directory / IMAGES / "inventory.img").is_file():
        raise UserError(f"{directory / IMAGES}: no CRIU images (inventory.img); take the snapshot again")
    remaps.checked(directory, record)
    return record


def judge(snapshot: key_mod.Key, here: key_mod.Key) -> None:
    wrong = snapshot.differences(here)
    if wrong:
        raise UserError(f"the snapshot does not hold here: {'; '.join(wrong)}; {FALLBACK}")


def restore(directory: Path, snapshot: key_mod.Key, record: dict, place, say: Callable[[str], None],
            criu: str = "criu", ready_timeout: float = 600, here_of=None) -> dict:
    """Restore in `place` (started, not yet holding anything); `here_of(criu_version)` is this host's key."""
    try:
        version = criu_mod.version(place, criu)
        judge(snapshot, here_of(version))
        return _restore(directory, record, place, say, criu, ready_timeout)
    except BaseException:
        place.close()  # nothing half-restored stays
        raise


def rewind_log(directory: Path, record: dict) -> Path | None:
    """The engine's log back at the size it had when it was dumped. CRIU reopens every regular file a process had
    open and refuses one whose size changed ("File ... has bad size"), and a restored engine goes on writing its
    log: without this a snapshot restores once. What a restored engine wrote is kept beside it (engine.log.N)."""
    log, size = directory / LOG, record.get("log_bytes")
    if not isinstance(size, int) or not log.is_file() or log.stat().st_size == size:
        return None
    n = 1
    while (kept := directory / f"{LOG}.{n}").exists():
        n += 1
    shutil.copyfile(log, kept)
    os.truncate(log, size)
    return kept


def _restore(directory, record, place, say, criu, ready_timeout) -> dict:
    inside = place.inside(directory)
    images = f"{inside}/{IMAGES}"
    (directory / PIDFILE).unlink(missing_ok=True)  # CRIU writes it with O_EXCL: an earlier restore's stops it
    kept = rewind_log(directory, record)
    if kept is not None:
        say(f"the engine's log set back to its size at the dump (CRIU checks it); what was written since: {kept}")
    entries = record.get("link_remaps") or []  # checked by read_record
    with remaps.held(place, {str(PurePosixPath(e["path"]).parent) for e in entries}, say):
        placed = remaps.put_back(place, directory, entries)
        t0 = time.monotonic()
        above = record.get("max_tid")
        rc, text = place.restore(criu_mod.restore_argv(criu, images, f"{inside}/{PIDFILE}"),
                                 above if isinstance(above, int) and 0 < above < 1 << 22 else 0)
        criu_s = round(time.monotonic() - t0, 2)
        # CRIU removes each remap it linked back, maybe after the tree runs: not another restore's copy after it
        remaps.remove(place, placed if rc != 0 else remaps.wait_consumed(place, placed))
    if rc != 0:
        rc_log, log = place.run(["tail", "-n", "15", f"{images}/restore.log"], timeout=30)
        said = (log if rc_log == 0 else "").strip() or text.strip()  # no log: criu did not start (what stopped it)
        raise Failed(f"criu restore failed (exit {rc}) {place.where}: {said}\nnothing restored is left running; "
                     f"{FALLBACK}")
    _, pid_text = place.run(["cat", f"{inside}/{PIDFILE}"], timeout=30)
    pid = int(pid_text.strip())
    procs = criu_mod.tree(place, pid)
    # the processes the take checkpointed hold no device mapping now (the checkpoint released it): the record names
    # them (CRIU gives each its pid back), the maps name any other
    on_gpu = sorted(set(record.get("cuda_pids") or []) | set(cuda.cuda_pids(place, procs)))
    t1 = time.monotonic()
    gpu_done: dict = {}
    if on_gpu:
        gpu_done = cuda.act(place, cuda.tool(place, directory / "tool"), "restore", on_gpu)
    gpu_s = round(time.monotonic() - t1, 2)
    http = client(place.host_port, _Recipe(record), directory / "engine.log")
    t_wake = time.monotonic()
    if record.get("slept"):
        code = http.call(record["wake"], timeout=600, body=record.get("sleep_body", ""))
        if code != 200:
            raise Failed(f"restored, but POST {record['wake']} answered {code}, not 200: the engine did not wake; "
                         f"{FALLBACK}")
    wake_s = round(time.monotonic() - t_wake, 2)
    deadline = time.monotonic() + ready_timeout
    while http.models() is None:
        if time.monotonic() > deadline:
            raise Failed(f"restored, but /v1/models did not answer in {ready_timeout:g} s; {FALLBACK}")
        time.sleep(0.2)
    ready_s = round(time.monotonic() - t0, 2)
    got = http.post(http.completions, {"model": record["served_model"], "prompt": PROMPT, "max_tokens": TOKENS,
                                       "temperature": 0.0}, timeout=120)["choices"][0]["text"]
    if got != record["answer"]:
        raise Failed(f"restored, but the greedy completion says {got!r}, not {record['answer']!r} as before the "
                     f"checkpoint; {FALLBACK}")
    _, metrics = http.metrics()
    say(f"restored {len(procs)} process(es) in {criu_s} s (CRIU), GPU {gpu_s} s; ready in {ready_s} s; the same "
        f"answer {got!r}")
    return {"restored": True, "pid": pid, "processes": len(procs), "cuda_pids": on_gpu, "gpu_restore": gpu_done,
            "criu_restore_s": criu_s, "gpu_restore_s": gpu_s, "wake_s": wake_s, "ready_s": ready_s, "answer": got, "metrics": metrics, "port": place.host_port}


class _Recipe:
    """The client's view of a recipe, from the snapshot's record (the restore reads no engine data)."""

    def __init__(self, record: dict):
        self.health = record.get("health", "/health")
        self.smoke = {"completions": record.get("completions", "/v1/completions")}


def boot_instead(directory: Path, snapshot: key_mod.Key, record: dict, place, say: Callable[[str], None],
                 ready_timeout: float, why: str) -> dict:
    """The fallback of a snapshot that does not hold here or failed to restore: the engine booted with the
    snapshot's own launch line and environment (a warm boot where the image carries its warm layer), ready when
    /v1/models answers. Its log goes beside the snapshot's (engine.boot.log)."""
    try:
        try:
            pid, _, boot_s = boot(place, snapshot.engine_args, dict(record.get("env") or {}), directory,
                                  "engine.boot.log", _Recipe(record), ready_timeout)
        except BootFailed as exc:
            raise Failed(f"not restored ({why}), and the boot instead failed too: {exc.why}; the end of its log:\n"
                         f"{exc.tail}") from None
    except BaseException:
        place.close()
        raise
    say(f"booted instead in {boot_s} s (pid {pid})")
    return {"restored": False, "why": why, "pid": pid, "ready_s": boot_s, "port": place.host_port}
