"""Bad inputs of `builder snapshot take|restore` (issue 52), in the shape of tests/hardening/cases.py: a missing or
corrupt snapshot, a key that is not one, an output directory in the way, an image the daemon does not hold, and a
CRIU that is missing or older than 4. An image the daemon does not hold is refused
(exit 2, nothing written) in tests/docker/deploy/test_snapshot.py, against the real daemon: here the table's
docker shim answers for no daemon (exit 3). Each: exit 2, one line naming the problem, nothing written.

The old CRIU is a TEST DOUBLE: a script that answers `--version` as bookworm's CRIU 3.17.1 does (the version line is
all the check reads; the real 3.17 fails `criu check` on this kernel, which is why it is refused)."""

from __future__ import annotations

import json

from tests.hardening.cases import Case, write

KEY = {"format": 1, "gpus": ["none"], "driver": "none", "subject": "sha256:" + "a" * 64, "model": "m",
       "model_config_sha256": "", "engine_args": ["python3", "-m", "stand_in_engine.server", "--port", "8000"],
       "tp": 1, "criu": "4.1.1"}
RECORD = {"subject": "img", "answer": "Paris", "served_model": "m"}
SNAP = {"s/key.json": json.dumps(KEY), "s/snapshot.json": json.dumps(RECORD), "s/images/inventory.img": "x"}
OLD_CRIU = "#!/bin/sh\necho 'Version: 3.17.1'\n"


def _exe(text: str):
    def make(path):
        path.write_text(text)
        path.chmod(0o755)
    return make


def _in_dirs(files: dict) -> dict:
    """The case's files, their folders made first (the table writes a file into an existing folder)."""
    def writer(content):
        def make(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            write(path, content)
        return make
    return {name: writer(content) for name, content in files.items()}


def _key(**edit) -> dict:
    return {**SNAP, "s/key.json": json.dumps({**KEY, **edit})}


RESTORE = ["snapshot", "restore", "{tmp}/s", "--launcher", "process"]
TAKE = ["snapshot", "take", "builder-test/no-such-image:never", "--model", "m"]

CASES = [case.__class__(**{**case.__dict__, "files": _in_dirs(case.files)}) for case in [
    Case("s1-restore-missing-dir", "snapshot", ["snapshot", "restore", "{tmp}/none"],
         expect=("no snapshot directory",)),
    Case("s1-restore-no-key", "snapshot", RESTORE, files={"s/snapshot.json": "{}"}, expect=("key.json", "missing")),
    Case("s1-restore-key-not-json", "snapshot", RESTORE, files={**SNAP, "s/key.json": "{not json"},
         expect=("not a snapshot key",)),
    Case("s1-restore-key-binary", "snapshot", RESTORE, files={**SNAP, "s/key.json": b"\xff\xfe\x00"},
         expect=("not a snapshot key",)),
    Case("s1-restore-key-other-format", "snapshot", RESTORE, files=_key(format=2), expect=("format 1",)),
    Case("s1-restore-key-gpus-not-list", "snapshot", RESTORE, files=_key(gpus="H200"),
         expect=("gpus", "not a list")),
    Case("s1-restore-key-tp-zero", "snapshot", RESTORE, files=_key(tp=0), expect=("tp 0",)),
    Case("s1-restore-key-tp-bool", "snapshot", RESTORE, files=_key(tp=True), expect=("tp True",)),
    Case("s1-restore-record-missing", "snapshot", RESTORE, files={"s/key.json": json.dumps(KEY)},
         expect=("snapshot.json", "not a snapshot record")),
    Case("s1-restore-no-images", "snapshot", RESTORE,
         files={"s/key.json": json.dumps(KEY), "s/snapshot.json": json.dumps(RECORD)}, expect=("inventory.img",)),
    # a record's link remaps are put back as root before the restore: only CRIU's link_remap.N at an absolute path,
    # with its copy under remaps/ (a pulled snapshot.json must not write anywhere else)
    Case("s1-restore-remap-elsewhere", "snapshot", RESTORE,
         files={**SNAP, "s/remaps/0-link_remap.7": "x", "s/snapshot.json": json.dumps(
             {**RECORD, "link_remaps": [{"path": "/etc/cron.d/x", "file": "remaps/0-link_remap.7"}]})},
         expect=("link remap", "take the snapshot again")),
    Case("s1-restore-remap-no-copy", "snapshot", RESTORE,
         files={**SNAP, "s/snapshot.json": json.dumps(
             {**RECORD, "link_remaps": [{"path": "/dev/shm/link_remap.7", "file": "remaps/0-link_remap.7"}]})},
         expect=("link remap", "take the snapshot again")),
    # snapshot criu: what the build is given, refused before the daemon is asked
    Case("s1-criu-base-empty", "snapshot", ["snapshot", "criu", "--base", "", "--out", "{tmp}/c"], expect=("--base",)),
    Case("s1-criu-base-not-a-ref", "snapshot", ["snapshot", "criu", "--base", "Ubuntu 24.04", "--out", "{tmp}/c"],
         expect=("--base",)),
    Case("s1-criu-base-shell", "snapshot", ["snapshot", "criu", "--base", "ubuntu;rm -rf /", "--out", "{tmp}/c"],
         expect=("--base",)),
    Case("s1-criu-out-not-empty", "snapshot", ["snapshot", "criu", "--base", "ubuntu:24.04", "--out", "{tmp}/c"],
         files={"c/x": "x"}, expect=("--out", "not an empty directory")),
    Case("s1-criu-out-a-file", "snapshot", ["snapshot", "criu", "--base", "ubuntu:24.04", "--out", "{tmp}/c"],
         files={"c": "x"}, expect=("--out",)),
    Case("s1-criu-ca-missing", "snapshot", ["snapshot", "criu", "--base", "ubuntu:24.04", "--out", "{tmp}/c",
                                            "--ca-bundle", "{tmp}/none.pem"], expect=("--ca-bundle",)),
    Case("s1-restore-other-gpu", "snapshot", RESTORE, files=_key(gpus=["NVIDIA H100 80GB HBM3"], driver="580.1"),
         expect=("gpus: the snapshot's NVIDIA H100", "boot it warm")),
    Case("s1-restore-other-model", "snapshot", [*RESTORE, "--model", "other"], files=SNAP,
         expect=("model: the snapshot's 'm', here 'other'",)),
    Case("s1-restore-or-boot-other-model", "snapshot", [*RESTORE, "--model", "other", "--or-boot"], files=SNAP,
         expect=("model: the snapshot's 'm', here 'other'",)),  # no fallback serves another model
    Case("s1-restore-criu-missing", "snapshot", [*RESTORE, "--criu", "{tmp}/no-criu"], files=SNAP,
         expect=("not found", "CRIU >= 4"), needs_programs=True),
    Case("s1-restore-criu-too-old", "snapshot", [*RESTORE, "--criu", "{tmp}/criu"],
         files={**SNAP, "criu": _exe(OLD_CRIU)}, expect=("3.17.1", "too old", "CRIU >= 4"), needs_programs=True),
    Case("s1-take-out-is-a-file", "snapshot", [*TAKE, "--out", "{tmp}/o"], files={"o": "x"},
         expect=("--out", "not an empty directory")),
    Case("s1-take-out-not-empty", "snapshot", [*TAKE, "--out", "{tmp}/o"], files={"o/a": "x"},
         expect=("--out", "not an empty directory")),
    Case("s1-take-out-empty-word", "snapshot", [*TAKE, "--out", " "], expect=("--out: empty",)),
    Case("s1-take-model-empty", "snapshot", ["snapshot", "take", "img", "--model", " ", "--out", "{tmp}/o"],
         expect=("--model: empty",)),
    # a generated model is written on this host: the docker route cannot see it
    Case("s1-take-generated-model-in-a-container", "snapshot",
         ["snapshot", "take", "img", "--model", "tiny", "--out", "{tmp}/o"], expect=("--model tiny", "--launcher process")),
    Case("s1-take-engine-args-unquoted", "snapshot", [*TAKE, "--out", "{tmp}/o", "--engine-args", "--x 'a"],
         expect=("--engine-args",)),
    Case("s1-take-env-not-name-value", "snapshot", [*TAKE, "--out", "{tmp}/o", "--env", "A"],
         expect=("--env 'A'", "NAME=VALUE")),
    # the process route's caches and image paths (a GPU host booting warm from a restored layer before the take)
    Case("s1-take-cache-root-in-a-container", "snapshot", [*TAKE, "--out", "{tmp}/o", "--cache-root", "{tmp}/c"],
         expect=("--cache-root", "only with --launcher process")),
    Case("s1-take-image-paths-in-a-container", "snapshot", [*TAKE, "--out", "{tmp}/o", "--image-paths"],
         expect=("--image-paths", "only with --launcher process")),
    Case("s1-take-cache-root-empty", "snapshot", [*TAKE, "--out", "{tmp}/o", "--cache-root", " "],
         expect=("--cache-root: empty",)),
    # push / pull (how a snapshot ships): refused before any request; the registry's own refusals are in
    # tests/docker/deploy/test_snapshot_ship.py against a real one
    Case("s1-push-missing-dir", "snapshot", ["snapshot", "push", "{tmp}/none", "127.0.0.1:9/x/y:t"],
         expect=("no snapshot directory",)),
    Case("s1-push-not-a-snapshot", "snapshot", ["snapshot", "push", "{tmp}/s", "127.0.0.1:9/x/y:t"],
         files={"s/snapshot.json": "{}"}, expect=("key.json", "missing")),
    Case("s1-push-no-images", "snapshot", ["snapshot", "push", "{tmp}/s", "127.0.0.1:9/x/y:t"],
         files={"s/key.json": json.dumps(KEY), "s/snapshot.json": json.dumps(RECORD)}, expect=("inventory.img",)),
    Case("s1-push-to-a-digest", "snapshot", ["snapshot", "push", "{tmp}/s", "127.0.0.1:9/x/y@sha256:" + "a" * 64],
         files=SNAP, expect=("name a tag",)),
    Case("s1-push-no-registry", "snapshot", ["snapshot", "push", "{tmp}/s", "snapshots:t"], files=SNAP,
         expect=("name the registry",)),
    Case("s1-push-ref-shell-text", "snapshot", ["snapshot", "push", "{tmp}/s", "127.0.0.1:9/x/y:t;rm -rf /"],
         files=SNAP, expect=("REF",)),
    Case("s1-pull-out-not-empty", "snapshot", ["snapshot", "pull", "127.0.0.1:9/x/y:t", "--out", "{tmp}/o"],
         files={"o/a": "x"}, expect=("not an empty directory",)),
    Case("s1-pull-out-is-a-file", "snapshot", ["snapshot", "pull", "127.0.0.1:9/x/y:t", "--out", "{tmp}/o"],
         files={"o": "x"}, expect=("not an empty directory",)),
    Case("s1-pull-out-parent-missing", "snapshot", ["snapshot", "pull", "127.0.0.1:9/x/y:t", "--out", "{tmp}/a/b/c"],
         expect=("is no directory",)),
    Case("s1-pull-ref-bad-digest", "snapshot", ["snapshot", "pull", "127.0.0.1:9/x/y@sha256:abc", "--out", "{tmp}/o"],
         expect=("64 lowercase hex",)),
    Case("s1-pull-no-registry", "snapshot", ["snapshot", "pull", "snapshots:t", "--out", "{tmp}/o"],
         expect=("name the registry",)),
]]
