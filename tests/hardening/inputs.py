"""Bad numbers and paths for every flag of every verb, and bad inputs of the helper scripts (issue 34, items 6 and 7).

1. `CASES` (plugged into tests/hardening/cases.py's table like every tests/hardening/*.py module) are generated
   from click's command tree of builder.cli, not written by hand: every option or argument whose type is a number
   gets inf, -inf, nan, 1e400 and 1e20 (an integer one also 10**20 written out); every one whose type is a path
   (click.Path and builder's own path type) gets a FIFO, a symlink loop, a socket and a device, plus a directory
   where a file is expected or a file where a directory is. A flag added tomorrow is in the table by its type.
   Each case gives the flag alone: the refusal must come while click reads it (exit 2, a message naming the flag),
   before a missing argument, a matrix or anything else is looked at, and a FIFO is never opened.
2. `SCRIPT_CASES` are the inputs of scripts/gpu-host-run, scripts/gpu-host-bundle and scripts/gen-reference: spec
   files missing / empty / not TOML / of the wrong types, parts missing / corrupt / against a wrong SHA256SUMS, tar
   members the extraction filter refuses, pip failing, destinations that cannot be written, names with path
   characters, interrupted runs. Each runs the script in-process (runpy, in a private copy of the scripts, its
   store in the case's temp dir) under a 20 s alarm: a hang is a verdict, not a stuck suite. Judged by
   `judge_script`: the exit code, one `error: ` line naming the problem, no traceback, nothing half-done left.

`python -m tests.hardening.inputs` prints the verdicts of both tables by verb (what issue 34 reports).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import traceback
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from tests.hardening.cases import REPO, Case, directory, fifo, loop, write

NUMBER_VALUES = {"inf": "inf", "neg-inf": "-inf", "nan": "nan", "1e400": "1e400", "1e20": "1e20"}
INT_ONLY = {"10pow20": str(10**20)}
TEXT_NUMBERS = {("rehearse", "--memory")}  # number flags whose click type is text (a size with a unit)


def sock(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
    finally:
        s.close()


def walk(cmd: click.Command | None = None, path: tuple[str, ...] = ()):
    """(verb path, command) for every command of builder.cli, groups walked."""
    if cmd is None:
        from builder.cli import main as cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in sorted(cmd.list_commands(ctx)):  # the top group loads its verbs' modules on this call
            yield from walk(cmd.get_command(ctx, name), (*path, name))
    else:
        yield path, cmd


def is_number(path: tuple[str, ...], param: click.Parameter) -> bool:
    t = param.type
    return (isinstance(t, (click.types.IntParamType, click.types.FloatParamType)) or getattr(t, "is_number", False)
            or (" ".join(path), param.opts[0]) in TEXT_NUMBERS)


def is_path(param: click.Parameter) -> bool:
    return isinstance(param.type, click.Path)


def flag_name(param: click.Parameter) -> str:
    """What a refusal must name: the option (its first long name), or the argument's metavar."""
    if isinstance(param, click.Option):
        return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return param.human_readable_name


def _given(param: click.Parameter, value: str) -> list[str]:
    return [flag_name(param), value] if isinstance(param, click.Option) else ["--", value]


def _generated() -> list[Case]:
    out: list[Case] = []
    for path, cmd in walk():
        verb = "-".join(path)
        for param in cmd.params:
            if getattr(param, "hidden", False) and not is_path(param) and not is_number(path, param):
                continue
            name = flag_name(param)
            slug = name.lstrip("-").lower()
            if is_number(path, param):
                values = dict(NUMBER_VALUES)
                if isinstance(param.type, click.types.IntParamType) or getattr(param.type, "integer", False):
                    values.update(INT_ONLY)
                for key, value in values.items():
                    out.append(Case(f"i4-num-{verb}-{slug}-{key}", "numbers", [*path, *_given(param, value)],
                                    expect=(name, "at most")))
            elif is_path(param):
                kinds: dict[str, tuple[Callable | str, str]] = {
                    "fifo": (fifo, "FIFO"), "loop": (loop, "symlink loop"), "socket": (sock, "socket"),
                    "device": ("/dev/null", "device")}
                if not param.type.dir_okay:
                    kinds["dir"] = (directory, "is a directory")
                if not param.type.file_okay:
                    kinds["file"] = (lambda p: p.write_text("a file\n"), "is a file")
                for key, (make, word) in kinds.items():
                    files = {} if isinstance(make, str) else {"bad": make}
                    value = make if isinstance(make, str) else "{tmp}/bad"
                    out.append(Case(f"i4-path-{verb}-{slug}-{key}", "paths", [*path, *_given(param, value)],
                                    expect=(name, word), files=files))
    return out


CASES: list[Case] = _generated()


def generated_params() -> list[tuple[tuple[str, ...], str, str]]:
    """(verb path, flag, number|path) of every parameter the generator covers: what the coverage test compares."""
    return [(path, flag_name(p), "number" if is_number(path, p) else "path")
            for path, cmd in walk() for p in cmd.params if is_number(path, p) or is_path(p)]


# -- the scripts -----------------------------------------------------------------------------------------------
NAME = "t-bundle"  # the bundle / spec name the script cases use
SCRIPTS = ("gpu-host-run", "gpu-host-bundle", "gen-reference", "git-host", "farm", "stargz-snapshotter")
GOOD_SPEC = ('python = "3.11"\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\n'
             '[serve]\ncell = "stand-in-engine-1.0.0-cu130-py311-sm80.90"\nengine_args = ""\n')


@dataclass
class ScriptCase:
    id: str
    script: str  # one of SCRIPTS
    args: list[str]  # "{tmp}" is the case's temp dir, "{root}" the scripts' copy
    code: int = 2
    expect: tuple[str, ...] = ()
    setup: Callable[[Path, Path, Path], None] | None = None  # (tmp, root, store)
    env: dict = field(default_factory=dict)
    interrupt: tuple[object, str] | None = None  # (owner, attribute): calling it raises KeyboardInterrupt
    keeps: tuple[str, ...] = ()  # paths (relative to tmp) that must be exactly as the setup left them

    @property
    def cls(self) -> str:
        return self.script


def purewheel(dest: Path, name: str = "purepkg", version: str = "1.0", files: dict | None = None,
              requires: tuple[str, ...] = ()) -> Path:
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {**(files or {f"{name}/__init__.py": "VALUE = 1\n"}), f"{info}/METADATA": meta,
               f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in members) + f"{info}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in {**members, f"{info}/RECORD": record}.items():
            z.writestr(k, v)
    return path


def tar_of(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"x", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info, data if kind == tarfile.REGTYPE else None


def stored(blob: bytes, nparts: int = 2, sums: Callable[[list[str]], list[str]] | None = None,
           parts: Callable[[Path, list[Path]], None] | None = None):
    """A setup: the store holds `blob` in parts with its SHA256SUMS (as stash leaves it), edited by `sums` /
    `parts`."""

    def setup(tmp: Path, root: Path, store: Path) -> None:
        d = store / NAME
        d.mkdir(parents=True, exist_ok=True)
        size = max(1, -(-len(blob) // nparts))
        lines, made = [f"{hashlib.sha256(blob).hexdigest()}  bundle.tar"], []
        for i in range(0, max(len(blob), 1), size):
            p = d / f"part-{i // size:02d}"
            p.write_bytes(blob[i:i + size])
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}")
            made.append(p)
        (d / "SHA256SUMS").write_text("\n".join(sums(lines) if sums else lines) + "\n")
        if parts:
            parts(d, made)

    return setup


def good_tar(tmp: Path) -> bytes:
    w = purewheel(tmp / "wh-src")
    return tar_of([(tarfile.TarInfo(f"wheels/{w.name}"), w.read_bytes())])


def sums_file(make: Callable[[Path], None] | str | bytes):
    def setup(tmp: Path, root: Path, store: Path) -> None:
        _write(store / NAME / "SHA256SUMS", make)

    return setup


def _write(p: Path, text: str | bytes | Callable[[Path], None]) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    write(p, text)


def spec_file(text: str | bytes | Callable[[Path], None], at: str = f"scripts/gpu-host/{NAME}.toml"):
    def setup(tmp: Path, root: Path, store: Path) -> None:
        _write(root / at, text)

    return setup


def both(*setups):
    def setup(tmp: Path, root: Path, store: Path) -> None:
        for s in setups:
            s(tmp, root, store)

    return setup


def at(rel: str, make: Callable[[Path], None] | str):
    """A setup: `make` the path tmp/rel (parents made)."""

    def setup(tmp: Path, root: Path, store: Path) -> None:
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        make(p) if callable(make) else p.write_text(make)

    return setup


def links(tmp: Path, root: Path, store: Path) -> None:
    """Local wheels pip finds offline (PIP_FIND_LINKS={tmp}/links): purepkg 1.0 and an engine wheel."""
    purewheel(tmp / "links")
    purewheel(tmp / "links", "eng", "1.0", {"eng/__init__.py": "", "eng/_C.so": "x" * 100})


def old_bundle(tmp: Path, root: Path, store: Path) -> None:
    """.carry/<name>/ as an earlier gpu-host-bundle left it: what a failed or interrupted run must leave alone."""
    d = root / ".carry" / NAME
    d.mkdir(parents=True)
    (d / "part-00").write_bytes(b"old bundle")
    (d / "SHA256SUMS").write_text(f"{hashlib.sha256(b'old bundle').hexdigest()}  part-00\n")


OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "{tmp}/links", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
RUN, BUNDLE, GEN = "gpu-host-run", "gpu-host-bundle", "gen-reference"
B = [NAME, "--cache", "{tmp}/cache"]
SPEC = f"scripts/gpu-host/{NAME}.toml"


def _spec_cases() -> list[ScriptCase]:
    """A spec file the bundle reads (scripts/gpu-host/<name>.toml) and the one the runner reads (its copy in the
    store): missing, empty, garbage, not TOML, not UTF-8, not a file, wrong keys and types."""
    bad = {
        "empty": ("", "python"),
        "garbage": ("this is not toml at all\x7f", "not TOML"),
        "bad-toml": ('python = "3.11\nwheels = [\n', "not TOML"),
        "not-utf8": (b"python = \"\xff\xfe\"\n", "UTF-8"),
        "no-python": ('platforms = ["any"]\nwheels = ["purepkg==1.0"]\n', "python"),
        "python-a-number": ('python = 3.11\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\n', "python"),
        "python-garbage": ('python = "three"\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\n', "python"),
        "no-wheels": ('python = "3.11"\nplatforms = ["any"]\n', "wheels"),
        "wheels-a-string": ('python = "3.11"\nplatforms = ["any"]\nwheels = "purepkg==1.0"\n', "wheels"),
        "wheels-of-numbers": ('python = "3.11"\nplatforms = ["any"]\nwheels = [1, 2]\n', "wheels"),
        "wheel-not-a-requirement": ('python = "3.11"\nplatforms = ["any"]\nwheels = ["pure pkg ==="]\n', "wheels"),
        "wheel-an-option": ('python = "3.11"\nplatforms = ["any"]\nwheels = ["--index-url=http://127.0.0.1:9"]\n', "wheels"),
        "no-platforms": ('python = "3.11"\nwheels = ["purepkg==1.0"]\n', "platforms"),
        "platforms-a-string": ('python = "3.11"\nplatforms = "any"\nwheels = ["purepkg==1.0"]\n', "platforms"),
        "engine-a-list": ('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = ["eng"]\n', "engine"),
        "strip-a-string": ('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = "eng==1.0"\nstrip = "*"\n', "strip"),
        "strip-of-numbers": ('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = "eng==1.0"\nstrip = [1]\n', "strip"),
        "repack-a-list": ('python = "3.11"\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\nrepack = ["x"]\n', "repack"),
        "repack-bad-requirement": ('python = "3.11"\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\n'
                                   '[repack]\n"not a req ===" = ["x"]\n', "repack"),
    }
    out = []
    for key, (text, word) in bad.items():
        out.append(ScriptCase(f"i4-bundle-spec-{key}", BUNDLE, B, expect=(SPEC, word), setup=spec_file(text)))
    for key, make in {"dir": directory, "fifo": fifo, "loop": loop, "socket": sock}.items():
        out.append(ScriptCase(f"i4-bundle-spec-is-a-{key}", BUNDLE, B, expect=(SPEC,), setup=spec_file(make)))
    serve_bad = {
        "no-serve": ('python = "3.12"\n', "serve"),
        "serve-a-string": ('serve = "x"\n', "serve"),
        "serve-a-list": ('serve = [1]\n', "serve"),
        "cell-a-number": ('[serve]\ncell = 1\nengine_args = ""\n', "cell"),
        "cell-a-path": ('[serve]\ncell = "../x"\nengine_args = ""\n', "cell"),
        "engine-args-missing": ('[serve]\ncell = "c-1"\n', "engine_args"),
        "env-a-string": ('[serve]\ncell = "c-1"\nengine_args = ""\nenv = "A=1"\n', "env"),
        "env-not-name-value": ('[serve]\ncell = "c-1"\nengine_args = ""\nenv = ["A"]\n', "env"),
        "engine-args-unquoted": ('[serve]\ncell = "c-1"\nengine_args = "--x \'a"\n', "engine_args"),
        "not-toml": ("[serve\n", "TOML"),
        "not-utf8": (b"[serve]\ncell = \"\xff\"\n", "TOML"),
        "empty": ("", "serve"),
    }
    for key, (text, word) in serve_bad.items():  # the runner reads the spec before it installs anything
        out.append(ScriptCase(f"i4-run-spec-{key}", RUN, ["bench", NAME], expect=("spec", word),
                              setup=_store_spec(text)))
    for key, make in {"dir": directory, "fifo": fifo, "loop": loop}.items():
        out.append(ScriptCase(f"i4-run-spec-is-a-{key}", RUN, ["smoke", NAME], expect=("spec",),
                              setup=_store_spec(make)))
    out.append(ScriptCase("i4-run-spec-none", RUN, ["smoke", NAME], expect=("no spec", NAME)))
    # snapshot's action (take or restore) is read before the spec or any install
    out.append(ScriptCase("i4-run-snapshot-no-action", RUN, ["snapshot", NAME], expect=("take or restore", "nothing")))
    out.append(ScriptCase("i4-run-snapshot-bad-action", RUN, ["snapshot", NAME, "peek"],
                          expect=("take or restore", "'peek'")))
    return out


def _store_spec(text):
    def setup(tmp: Path, root: Path, store: Path) -> None:
        _write(store / NAME / "spec.toml", text)

    return setup


def _run_cases() -> list[ScriptCase]:
    """gpu-host-run install: SHA256SUMS, the parts, the joined tar and its members, pip, the store."""
    out = []
    blob_parts = lambda **kw: stored(b"x" * 3000, **kw)  # noqa: E731
    sums_bad = {
        "missing": (None, "SHA256SUMS"),
        "empty": ("", "SHA256SUMS"),
        "garbage": ("hello world\n", "SHA256SUMS"),
        "not-utf8": (b"\xff\xfe\x00garbage\n", "SHA256SUMS"),
        "dir": (directory, "SHA256SUMS"),
        "fifo": (fifo, "SHA256SUMS"),
        "loop": (loop, "SHA256SUMS"),
        "socket": (sock, "SHA256SUMS"),
        "huge": (lambda p: p.write_bytes(b"0" * (2 << 20)), "SHA256SUMS"),
        "no-bundle-line": (f"{'a' * 64}  part-00\n", "bundle.tar"),
        "a-gap": (f"{'a' * 64}  bundle.tar\n{'b' * 64}  part-00\n{'c' * 64}  part-02\n", "gap"),
        "path-in-name": (f"{'a' * 64}  bundle.tar\n{'b' * 64}  ../part-00\n", "line 2"),
        "upper-case-hex": (f"{'A' * 64}  bundle.tar\n{'b' * 64}  part-00\n", "line 1"),
    }
    for key, (make, word) in sums_bad.items():
        setup = (lambda t, r, s: (s / NAME).mkdir(parents=True)) if make is None else sums_file(make)
        out.append(ScriptCase(f"i4-run-sums-{key}", RUN, ["install", NAME], code=1, expect=(word,), setup=setup))
    parts_bad = {
        "missing": (lambda d, ps: ps[1].unlink(), "have not arrived"),
        "truncated": (lambda d, ps: ps[0].write_bytes(ps[0].read_bytes()[:-1]), "sha256 differs"),
        "flipped": (lambda d, ps: ps[1].write_bytes(b"y" + ps[1].read_bytes()[1:]), "sha256 differs"),
        "empty": (lambda d, ps: ps[0].write_bytes(b""), "sha256 differs"),
        "a-dir": (lambda d, ps: (ps[1].unlink(), ps[1].mkdir()), "part-01"),
        "a-fifo": (lambda d, ps: (ps[1].unlink(), os.mkfifo(ps[1])), "part-01"),
        "a-loop": (lambda d, ps: (ps[1].unlink(), os.symlink(ps[1].name, ps[1])), "part-01"),
        "a-socket": (lambda d, ps: (ps[1].unlink(), sock(ps[1])), "part-01"),
    }
    for key, (edit, word) in parts_bad.items():
        out.append(ScriptCase(f"i4-run-part-{key}", RUN, ["install", NAME], code=1, expect=(word,),
                              setup=blob_parts(nparts=2, parts=edit)))
    out.append(ScriptCase("i4-run-wrong-whole-sum", RUN, ["install", NAME], code=1, expect=("joined bundle",),
                          setup=blob_parts(sums=lambda ls: [f"{'0' * 64}  bundle.tar", *ls[1:]])))
    out.append(ScriptCase("i4-run-sums-of-another-bundle", RUN, ["install", NAME], code=1, expect=("sha256 differs",),
                          setup=blob_parts(sums=lambda ls: [ls[0], *(f"{'1' * 64}  {l.split()[1]}" for l in ls[1:])])))
    tars = {  # the joined bundle checks out against SHA256SUMS, but is not a bundle the runner installs
        "not-a-tar": (b"x" * 3000, "not a tar"),
        "empty-tar": (tar_of([]), "no wheel"),
        "member-escapes": (tar_of([member("../evil.whl")]), "../evil.whl"),
        "member-deep-escape": (tar_of([member("wheels/../../evil")]), "evil"),
        "symlink-out": (tar_of([member("wheels/x.whl", tarfile.SYMTYPE, link="/etc/passwd")]), "wheels/x.whl"),
        "symlink-up": (tar_of([member("wheels/x.whl", tarfile.SYMTYPE, link="../../x")]), "wheels/x.whl"),
        "hardlink-out": (tar_of([member("wheels/x.whl", tarfile.LNKTYPE, link="/etc/passwd")]), "wheels/x.whl"),
        "device": (tar_of([member("wheels/null", tarfile.CHRTYPE)]), "wheels/null"),
        "fifo": (tar_of([member("wheels/p", tarfile.FIFOTYPE)]), "wheels/p"),
        "no-wheels-dir": (tar_of([member("spec.toml", data=b"x = 1\n")]), "no wheel"),
        "garbage-wheel": (tar_of([member("wheels/purepkg-1.0-py3-none-any.whl", data=b"not a zip")]), "pip"),
        "truncated-tar": (b"", "not a tar"),
    }
    for key, (blob, word) in tars.items():
        if key == "truncated-tar":
            setup = _lazy_tar(lambda tmp: good_tar(tmp)[:700])
        else:
            setup = stored(blob, nparts=1)
        out.append(ScriptCase(f"i4-run-tar-{key}", RUN, ["install", NAME], code=1, expect=(word,), setup=setup,
                              env={"PIP_NO_INDEX": "1"}))
    # the store: BUILDER_CARRY_STORE where nothing can be made
    stores = {
        "under-a-file": ("{tmp}/afile/store", at("afile", "x"), "afile"),
        "a-file": ("{tmp}/afile", at("afile", "x"), "afile"),
        "a-fifo": ("{tmp}/afifo", at("afifo", fifo), "afifo"),
        "a-loop": ("{tmp}/aloop", at("aloop", loop), "aloop"),
        "in-proc": ("/proc/builder-carry-store", None, "/proc/builder-carry-store"),
        "empty": ("", None, "BUILDER_CARRY_STORE"),
        "name-a-file": ("{tmp}/store", at(f"store/{NAME}", "x"), NAME),
    }
    for key, (value, setup, word) in stores.items():
        for verb in ("stash", "install"):
            out.append(ScriptCase(f"i4-run-store-{key}-{verb}", RUN, [verb, NAME], code=2, expect=(word,), setup=setup,
                                  env={"BUILDER_CARRY_STORE": value}))
    # verbs and names
    for key, argv in {"no-args": [], "unknown-verb": ["frobnicate", NAME], "verb-only": ["stash"],
                      "name-dotdot": ["install", ".."], "name-slash": ["stash", "a/b"], "name-abs": ["install", "/etc"],
                      "name-nul-ish": ["install", "a\x01b"], "name-dash": ["stash", "-rf"],
                      "client-path": ["bench", NAME, "--client", "../x"], "with-missing": ["smoke", NAME, "--with"]}.items():
        out.append(ScriptCase(f"i4-run-args-{key}", RUN, argv, expect=("error",)))
    # --slim slims the venv at the image's paths: refused, before any spec is read, without --image-paths
    out.append(ScriptCase("i4-run-args-slim-without-image-paths", RUN, ["smoke", NAME, "--slim", "--layers", "L3"],
                          expect=("--slim", "--image-paths")))
    # interrupted: a stash or install stopped half-way leaves nothing half-done and says so in one line
    out.append(ScriptCase("i4-run-interrupted-install", RUN, ["install", NAME], code=130, expect=("interrupted",),
                          setup=_lazy_tar(good_tar), interrupt=(subprocess, "run"), env={"PIP_NO_INDEX": "1"}))
    out.append(ScriptCase("i4-run-interrupted-extract", RUN, ["install", NAME], code=130, expect=("interrupted",),
                          setup=_lazy_tar(good_tar), interrupt=(tarfile.TarFile, "extractall")))
    out.append(ScriptCase("i4-run-interrupted-stash", RUN, ["stash", NAME], code=130, expect=("interrupted",),
                          setup=at(f"root/.carry/{NAME}/part-00", "carried"), interrupt=(shutil, "copy2")))
    return out


def _lazy_tar(make: Callable[[Path], bytes]):
    def setup(tmp: Path, root: Path, store: Path) -> None:
        stored(make(tmp), nparts=1)(tmp, root, store)

    return setup


def _bundle_cases() -> list[ScriptCase]:
    """gpu-host-bundle: its flags, its destinations, pip failing, a strip list that leaves nothing."""
    out = []
    good = spec_file(GOOD_SPEC)
    for key, value in {"inf": "inf", "nan": "nan", "1e400": "1e400", "huge": str(10**20), "neg": "-1"}.items():
        out.append(ScriptCase(f"i4-bundle-part-mib-{key}", BUNDLE, [*B, "--part-mib", value], expect=("--part-mib",),
                              setup=good))
    caches = {
        "under-a-file": ("{tmp}/afile/cache", at("afile", "x"), "--cache"),
        "a-file": ("{tmp}/afile", at("afile", "x"), "--cache"),
        "a-fifo": ("{tmp}/afifo", at("afifo", fifo), "--cache"),
        "a-loop": ("{tmp}/aloop", at("aloop", loop), "--cache"),
        "in-proc": ("/proc/builder-cache", None, "--cache"),
        "empty": ("", None, "--cache"),
    }
    for key, (value, setup, word) in caches.items():
        out.append(ScriptCase(f"i4-bundle-cache-{key}", BUNDLE, [NAME, "--cache", value], expect=(word,),
                              setup=both(good, setup) if setup else good))
    freezes = {"missing": None, "dir": directory, "fifo": fifo, "loop": loop, "socket": sock,
               "not-utf8": lambda p: p.write_bytes(b"\xff\xfe"), "huge": lambda p: p.write_bytes(b"a" * (33 << 20))}
    for key, make in freezes.items():
        setup = both(good, at("freeze", make)) if make else good
        out.append(ScriptCase(f"i4-bundle-host-freeze-{key}", BUNDLE, [*B, "--host-freeze", "{tmp}/freeze"],
                              expect=("--host-freeze",), setup=setup))
    carries = {"carry-a-file": at("root/.carry", "x"), "carry-name-a-file": at(f"root/.carry/{NAME}", "x"),
               "carry-a-loop": at("root/.carry", loop), "carry-a-fifo": at("root/.carry", fifo)}
    for key, setup in carries.items():
        out.append(ScriptCase(f"i4-bundle-{key}", BUNDLE, B, expect=(".carry",), setup=both(good, setup)))
    for key, name in {"dotdot": "..", "slash": "a/b", "abs": "/etc/passwd", "space": "a b", "dollar": "$(id)"}.items():
        out.append(ScriptCase(f"i4-bundle-name-{key}", BUNDLE, [name], expect=("name",)))
    # pip fails: nothing to download (offline, no such wheel) / a wheel pip cannot find: one line, the old bundle kept
    out.append(ScriptCase("i4-bundle-pip-fails", BUNDLE, B, code=1, expect=("pip download", "purepkg==1.0"),
                          setup=both(good, old_bundle), env={"PIP_NO_INDEX": "1"}, keeps=("root/.carry",)))
    out.append(ScriptCase("i4-bundle-pip-fails-engine", BUNDLE, B, code=1, expect=("pip download", "eng==2.0"),
                          setup=both(spec_file('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = "eng==2.0"\n'),
                                     links, old_bundle), env=OFFLINE, keeps=("root/.carry",)))
    out.append(ScriptCase("i4-bundle-strip-everything", BUNDLE, B, code=2, expect=("strip", "eng-1.0"),
                          setup=both(spec_file('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = "eng==1.0"\n'
                                               'strip = ["*"]\n'), links, old_bundle), env=OFFLINE, keeps=("root/.carry",)))
    out.append(ScriptCase("i4-bundle-strip-metadata", BUNDLE, B, code=2, expect=("strip", "METADATA"),
                          setup=both(spec_file('python = "3.11"\nplatforms = ["any"]\nwheels = []\nengine = "eng==1.0"\n'
                                               'strip = ["*.dist-info/*"]\n'), links), env=OFFLINE))
    out.append(ScriptCase("i4-bundle-repack-everything", BUNDLE, B, code=2, expect=("repack", "purepkg"),
                          setup=both(spec_file(GOOD_SPEC.replace("[serve]", '[repack]\n"purepkg" = ["**", "*"]\n[serve]')),
                                     links), env=OFFLINE))
    out.append(ScriptCase("i4-bundle-interrupted", BUNDLE, B, code=130, expect=("interrupted",),
                          setup=both(good, links, old_bundle), env=OFFLINE, interrupt=(subprocess, "run"),
                          keeps=("root/.carry",)))
    out.append(ScriptCase("i4-bundle-interrupted-writing", BUNDLE, B, code=130, expect=("interrupted",),
                          setup=both(good, links, old_bundle), env=OFFLINE, interrupt=(Path, "write_bytes"),
                          keeps=("root/.carry",)))
    return out


def _gen_cases() -> list[ScriptCase]:
    """scripts/gen-reference: its argv, and docs/reference/ (or a page in it) that cannot be written."""
    out = []
    for key, argv in {"unknown-flag": ["--bogus"], "two-args": ["--check", "x"], "a-path": ["docs"],
                      "empty": [""]}.items():
        out.append(ScriptCase(f"i4-gen-args-{key}", GEN, argv, expect=(argv[0] if argv[0] else "argument",)))
    outs = {  # docs/reference (or docs) where the pages go
        "out-a-file": at("root/docs/reference", "x"),
        "docs-a-file": at("root/docs", "x"),
        "out-a-loop": at("root/docs/reference", loop),
        "out-a-fifo": at("root/docs/reference", fifo),
        "out-read-only": at("root/docs/reference", lambda p: os.symlink("/proc/self/fdinfo", p)),
        "page-a-dir": at("root/docs/reference/cli.md", directory),
        "page-a-fifo": at("root/docs/reference/cli.md", fifo),
        "page-a-loop": at("root/docs/reference/cli.md", loop),
        "page-a-socket": at("root/docs/reference/cli.md", sock),
    }
    for key, setup in outs.items():
        out.append(ScriptCase(f"i4-gen-{key}", GEN, [], code=2, expect=("docs/reference",), setup=setup))
    checks = {  # --check reads the pages: whatever is there, it says stale (exit 1) or refuses in one line
        "page-not-utf8": (at("root/docs/reference/cli.md", lambda p: p.write_bytes(b"\xff\xfe")), 1, "cli.md"),
        "page-a-fifo": (at("root/docs/reference/cli.md", fifo), 1, "cli.md"),
        "page-a-dir": (at("root/docs/reference/cli.md", directory), 1, "cli.md"),
        "out-a-file": (at("root/docs/reference", "x"), 1, "cli.md"),
        "out-a-loop": (at("root/docs/reference", loop), 1, "cli.md"),
    }
    for key, (setup, code, word) in checks.items():
        out.append(ScriptCase(f"i4-gen-check-{key}", GEN, ["--check"], code=code, expect=(word,), setup=setup))
    out.append(ScriptCase("i4-gen-interrupted", GEN, [], code=130, expect=("interrupted",),
                          setup=at("root/docs/reference/README.md", "old page\n"), interrupt=(os, "replace"),
                          keeps=("root/docs",)))
    return out


def a_repo(tmp: Path, root: Path, store: Path) -> None:
    """tmp/gitdir: a git repository with one commit and tag v1 (what `git-host add` mirrors)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    work = tmp / "gitdir"
    work.mkdir()
    for argv in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "one"], ["tag", "v1"]):
        subprocess.run(["git", *argv], cwd=work, env=env, check=True, capture_output=True)


def hosted(tmp: Path, root: Path, store: Path) -> None:
    """tmp/host already serving github.com/acme/widget (added from tmp/gitdir)."""
    a_repo(tmp, root, store)
    subprocess.run([sys.executable, str(root / "scripts" / GIT_HOST), "add", str(tmp / "host"),
                    "https://github.com/acme/widget", str(tmp / "gitdir")], check=True, capture_output=True)


GIT_HOST = "git-host"


def _git_host_cases() -> list[ScriptCase]:
    """scripts/git-host: its verbs' arguments, upstream URLs that are no repository, ROOTs and GITDIRs that are not
    directories, a port it cannot take, a plan that is no plan, an add interrupted half-way (nothing left)."""
    out = [ScriptCase("i47-host-no-verb", GIT_HOST, [], expect=("verb",)),
           ScriptCase("i47-host-unknown-verb", GIT_HOST, ["push"], expect=("push",))]
    for key, url in {"ssh": "ssh://github.com/a/b", "relative": "github.com/a/b", "one-part": "https://github.com/a",
                     "three-parts": "https://github.com/a/b/c", "credentials": "https://u:p@github.com/a/b",
                     "dot-dot": "https://github.com/../b", "query": "https://github.com/a/b?x=1",
                     "space": "https://github.com/a b/c", "empty": ""}.items():
        out.append(ScriptCase(f"i47-host-add-url-{key}", GIT_HOST, ["add", "{tmp}/host", url, "{tmp}/gitdir"],
                              expect=("upstream repository URL" if key not in ("dot-dot", "space") else "plain",),
                              setup=a_repo))
    for key, setup, word in (("missing", None, "no such directory"), ("a-file", at("gitdir", "x"), "no such directory"),
                             ("not-git", at("gitdir/readme", "x"), "not a git directory")):
        out.append(ScriptCase(f"i47-host-add-gitdir-{key}", GIT_HOST, ["add", "{tmp}/host", "https://github.com/a/b",
                                                                        "{tmp}/gitdir"], expect=(word,), setup=setup))
    out.append(ScriptCase("i47-host-add-root-a-file", GIT_HOST, ["add", "{tmp}/host", "https://github.com/a/b",
                                                                  "{tmp}/gitdir"], expect=("not a directory",),
                          setup=both(a_repo, at("host", "x"))))
    out.append(ScriptCase("i47-host-add-twice", GIT_HOST, ["add", "{tmp}/host", "https://github.com/ACME/Widget.git",
                                                            "{tmp}/gitdir"], expect=("already in",), setup=hosted,
                          keeps=("host",)))
    out.append(ScriptCase("i47-host-add-interrupted", GIT_HOST, ["add", "{tmp}/host", "https://github.com/a/b",
                                                                  "{tmp}/gitdir"], code=130, expect=("interrupted",),
                          setup=a_repo, interrupt=(Path, "rename")))
    for key, argv, setup, word in (
            ("root-missing", ["serve", "{tmp}/host"], None, "no such directory"),
            ("root-a-file", ["serve", "{tmp}/host"], at("host", "x"), "not a directory"),
            ("root-empty", ["serve", "{tmp}/host"], at("host/readme", "x"), "no <host>/<owner>/<name>.git"),
            ("port-too-big", ["serve", "{tmp}/host", "--port", "70000"], hosted, "--port"),
            ("port-not-a-number", ["serve", "{tmp}/host", "--port", "x"], hosted, "--port"),
            ("check-no-plan", ["check", "{tmp}/host"], hosted, "PLAN.json"),
            ("check-plan-missing", ["check", "{tmp}/host", "{tmp}/plan.json"], hosted, "not a fetch plan"),
            ("check-plan-not-json", ["check", "{tmp}/host", "{tmp}/plan.json"], both(hosted, at("plan.json", "{")),
             "not a fetch plan"),
            ("check-plan-a-list", ["check", "{tmp}/host", "{tmp}/plan.json"], both(hosted, at("plan.json", "[]")),
             "not a fetch plan"),
            ("check-plan-a-dir", ["check", "{tmp}/host", "{tmp}/plan.json"], both(hosted, at("plan.json", directory)),
             "not a fetch plan")):
        out.append(ScriptCase(f"i47-host-{key}", GIT_HOST, argv, expect=(word,), setup=setup))
    return out


def _stargz_cases() -> list[ScriptCase]:
    """scripts/stargz-snapshotter: its one optional OUT; refused before any package is installed or built."""
    script = "stargz-snapshotter"
    return [ScriptCase("i48-stargz-two-args", script, ["{tmp}/a", "{tmp}/b"], expect=("usage",)),
            ScriptCase("i48-stargz-a-flag", script, ["--fast"], expect=("usage",)),
            ScriptCase("i48-stargz-out-a-directory", script, ["{tmp}"], expect=("is a directory",)),
            ScriptCase("i48-stargz-out-two-lines", script, ["{tmp}/a\nb"], expect=("one line",)),
            ScriptCase("i48-stargz-out-blank", script, [" "], expect=("one line",))]


FARM = "farm"


def _farm_cases() -> list[ScriptCase]:
    """scripts/farm start/status/stop: numbers that are no count, core share or size, more cores than the machine,
    a state dir that is a file or someone else's directory, a rehearsal file that is none, bubblewrap missing (exit
    3), no server's memory holding one job. All refused before a namespace, link or cgroup is made."""
    good = {"--servers": "2", "--cpus": "0.5", "--memory": "1g", "--gb-per-job": "0.4"}

    def start(**change) -> list[str]:
        flags = {**good, **{f"--{k.replace('_', '-')}": v for k, v in change.items()}}
        return ["start", *[x for k, v in flags.items() if v is not None for x in (k, v)], "--state", "{tmp}/farm"]

    out = [ScriptCase("i50-farm-no-verb", FARM, [], expect=("verb",)),
           ScriptCase("i50-farm-unknown-verb", FARM, ["restart"], expect=("restart",))]
    for flag, values in {"servers": ("0", "-1", "1000", "x", "nan"),
                         "cpus": ("0", "-1", "nan", "inf", "x", "4096", "1,1,1"),
                         "memory": ("0", "-1g", "x", "1e400", "nan", "10k", "1g,1g,1g"),
                         "gb_per_job": ("0", "-1", "nan", "inf", "x", "1e400"),
                         "toolchain_gb": ("-1", "nan", "inf", "x", "65")}.items():
        for value in values:
            key = value.replace(",", "-")
            out.append(ScriptCase(f"i50-farm-{flag.replace('_', '-')}-{key}", FARM, start(**{flag: value}),
                                  expect=(f"--{flag.replace('_', '-')}",)))
    rehearsal = start(gb_per_job=None) + ["--from-rehearsal", "{tmp}/r.json"]
    for key, setup in (("missing", None), ("not-json", at("r.json", "{")), ("no-units", at("r.json", "[]")),
                       ("no-peak", at("r.json", '[{"units": [{"source": "a.cu"}]}]')), ("a-dir", at("r.json", directory))):
        out.append(ScriptCase(f"i50-farm-rehearsal-{key}", FARM, rehearsal, expect=("--from-rehearsal",), setup=setup))
    out += [ScriptCase("i50-farm-both-gb-flags", FARM, start() + ["--from-rehearsal", "{tmp}/r.json"],
                       expect=("--gb-per-job",)),
            ScriptCase("i50-farm-state-a-file", FARM, start(), expect=("--state", "not a directory"),
                       setup=at("farm", "x"), keeps=("farm",)),
            ScriptCase("i50-farm-state-someone-elses", FARM, start(), expect=("--state", "did not make"),
                       setup=at("farm/notes", "x"), keeps=("farm",)),
            ScriptCase("i50-farm-no-bwrap", FARM, start(), code=3, expect=("apt-get install bubblewrap",),
                       env={"PATH": "{tmp}/empty"}),
            ScriptCase("i50-farm-no-server-fits", FARM, start(memory="256m", gb_per_job="1"),
                       expect=("no server's memory holds the 2 jobs",)),
            ScriptCase("i50-farm-status-none", FARM, ["status", "--state", "{tmp}/farm"], expect=("no farm at",))]
    return out


SCRIPT_CASES: list[ScriptCase] = [*_spec_cases(), *_run_cases(), *_bundle_cases(), *_gen_cases(), *_git_host_cases(),
                                  *_farm_cases(), *_stargz_cases()]


# -- running and judging a script case --------------------------------------------------------------------------
class Hung(Exception):
    pass


def _alarm(signum, frame):
    raise Hung()


def _fill(s: str, tmp: Path, root: Path) -> str:
    return s.replace("{tmp}", str(tmp)).replace("{root}", str(root))


def run_script(case: ScriptCase, tmp: Path, timeout: int = 20) -> subprocess.CompletedProcess[str]:
    """The script in-process (runpy, as `python scripts/<script> ARGS` runs it) from a private copy under tmp/root,
    its store tmp/store: exit code, stdout, stderr (an exception let through is a traceback there, a hang past
    `timeout` the word HUNG)."""
    root, store = tmp / "root", tmp / "store"
    script = root / "scripts" / case.script
    env = {"BUILDER_CARRY_STORE": str(store), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           **{k: _fill(v, tmp, root) for k, v in case.env.items()}}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_argv, saved_path, cwd = sys.argv, list(sys.path), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    code = 0
    patched = None
    if case.interrupt:
        owner, attr = case.interrupt
        patched = (owner, attr, getattr(owner, attr))

        def stop(*a, **kw):
            raise KeyboardInterrupt()

        setattr(owner, attr, stop)
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        os.environ.update(env)
        sys.argv = [str(script), *(_fill(a, tmp, root) for a in case.args)]
        os.chdir(tmp)
        signal.alarm(timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else (print(exc.code, file=sys.stderr) or 1))
            except Hung:
                code = -1
                print("HUNG: still running after the alarm", file=sys.stderr)
            except BaseException:  # noqa: BLE001 (KeyboardInterrupt too: what the console would show)
                code = 1
                traceback.print_exc(file=sys.stderr)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if patched:
            setattr(*patched)
        os.chdir(cwd)
        sys.argv, sys.path[:] = saved_argv, saved_path
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess([case.script, *case.args], code, out.getvalue(), err.getvalue())


def make_root(tmp: Path) -> Path:
    root = tmp / "root"
    (root / "scripts" / "gpu-host").mkdir(parents=True)
    for s in SCRIPTS:
        shutil.copy2(REPO / "scripts" / s, root / "scripts" / s)
    return root


def tree(path: Path) -> dict[str, tuple]:
    """Every path under `path` (not following links) with its type and content digest (a FIFO is not read)."""
    import stat

    out = {}
    if not os.path.lexists(path):
        return out
    for p in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else os.readlink(p) \
            if stat.S_ISLNK(st.st_mode) else ""
        out[str(p.relative_to(path.parent))] = (stat.S_IFMT(st.st_mode), digest)
    return out


@dataclass
class ScriptVerdict:
    verdict: str  # clear, fine, misleading, traceback, silent, hang
    why: str


def check_script(case: ScriptCase) -> ScriptVerdict:
    tmp = Path(tempfile.mkdtemp(prefix="builder-hardening-scripts-", dir="/tmp"))
    try:
        root = make_root(tmp)
        (tmp / "store").mkdir()
        if case.setup:
            case.setup(tmp, root, tmp / "store")
        before = {rel: tree(tmp / rel) for rel in case.keeps}
        whole_before = tree(tmp)
        res = run_script(case, tmp)
        after = {rel: tree(tmp / rel) for rel in case.keeps}
        return judge_script(case, res, before, after, whole_before, tree(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


HALF_DONE = (".tar", "-files", "site-", "py-", "installed-", ".part", ".tmp", "-repacked", ".new")


def judge_script(case: ScriptCase, res, before: dict, after: dict, whole_before: dict, whole_after: dict) -> ScriptVerdict:
    out = res.stdout + res.stderr
    if res.returncode == -1:
        return ScriptVerdict("hang", out[-800:])
    if "Traceback (most recent call last)" in out:
        return ScriptVerdict("traceback", out[-1500:])
    if res.returncode == 0 and case.code != 0:
        return ScriptVerdict("silent", out[-800:])
    problems = []
    if res.returncode != case.code:
        problems.append(f"exit {res.returncode}, expected {case.code}")
    errors = [l for l in res.stderr.splitlines() if "error: " in l or l.startswith("error:")]
    if case.code != 0 and len(errors) != 1:
        problems.append(f"{len(errors)} error lines, expected one")
    missing = [f for f in case.expect if f not in "\n".join(errors or [out])]
    if missing:
        problems.append(f"message lacks {missing}")
    changed = [rel for rel in before if before[rel] != after[rel]]
    if changed:
        problems.append(f"changed {changed}")
    made = sorted(set(whole_after) - set(whole_before))
    half = [m for m in made if any(h in Path(m).name for h in HALF_DONE) and "cache" not in m.split("/")[1:2]]
    if case.code != 0 and half:
        problems.append(f"left {half[:4]}")
    return ScriptVerdict("misleading" if problems else "clear", "; ".join(problems) + "\n--- output:\n" + out[-1500:])


def tally() -> None:
    """Run both tables; print the verdicts by verb (the counts issue 34 asks for)."""
    from collections import Counter

    from tests.hardening import cases as hc

    counts: Counter = Counter()
    bad: list[str] = []
    for case in CASES:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(20)
        try:
            v, left = hc.check_case(case, in_process=True)
            verdict = "clear" if v.clear and not left else "traceback" if v.traceback else "silent" if v.accepted \
                else "misleading"
        except Hung:
            verdict, v = "hang", None
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        verb = " ".join(a for a in case.args[:2] if not a.startswith("-")) if case.args[0] in ("bench", "wheels") \
            else case.args[0]
        counts[(f"{case.cls}: {verb}", verdict)] += 1
        if verdict != "clear":
            bad.append(f"{case.id}: {verdict}: {(v.why.splitlines() or [''])[0] if v else 'hung'}")
    for case in SCRIPT_CASES:
        v = check_script(case)
        counts[(f"script: {case.script}", v.verdict)] += 1
        if v.verdict != "clear":
            bad.append(f"{case.id}: {v.verdict}: {v.why.splitlines()[0] if v.why else ''}")
    rows = sorted({k for k, _ in counts})
    verdicts = ["clear", "misleading", "traceback", "silent", "hang"]
    print(f"{'verb':40} " + " ".join(f"{x:>10}" for x in verdicts) + "      total")
    for r in rows:
        print(f"{r:40} " + " ".join(f"{counts[(r, x)]:>10}" for x in verdicts) + f" {sum(counts[(r, x)] for x in verdicts):>10}")
    print(f"{'all':40} " + " ".join(f"{sum(c for (_, x), c in counts.items() if x == y):>10}" for y in verdicts)
          + f" {sum(counts.values()):>10}")
    if "-v" in sys.argv:
        print("\n".join(bad))


if __name__ == "__main__":
    tally()
