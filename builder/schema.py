"""The shape of engine knowledge, as data: builder/data/engines.toml and every extra file a matrix names
(`defaults.knowledge`). engines.py checks each file against it, key by key, before any Recipe is built.

A type here is a description, not code that runs: `noun` is how messages spell the expectation
("a list of strings", "one of engine, kernels").
"""

from __future__ import annotations

import re
from datetime import datetime
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import grammar
from .archs import KNOB_FORMATS


@dataclass(frozen=True)
class Scalar:
    """A TOML string, integer, float or boolean."""

    types: tuple[type, ...]
    noun: str
    plural: str


STR = Scalar((str,), "a string", "strings")
INT = Scalar((int,), "an integer", "integers")
NUMBER = Scalar((int, float), "a number", "numbers")  # `4` is as good as `4.0`
BOOL = Scalar((bool,), "a boolean", "booleans")


@dataclass(frozen=True)
class Parsed:
    """A string that `parse` must accept (it raises ValueError otherwise)."""

    parse: Callable[[str], object]
    noun: str
    plural: str = ""
    explain: bool = False  # add the parser's reason to the message (the grammar's reasons are written for users)


VERSION = Parsed(Version, 'a version like "12.8"')
VERSION_RANGE = Parsed(SpecifierSet, 'a version range like ">=0.6,<0.7"')


def _grammar(rule, noun: str, plural: str = "") -> Parsed:
    return Parsed(rule, noun, plural or noun, explain=True)


def _template(name: str) -> str:
    from .templates import TEMPLATE_DIR

    grammar.package_name(name)
    if not (TEMPLATE_DIR / "packages" / f"{name}.j2").is_file():
        known = sorted(p.stem for p in (TEMPLATE_DIR / "packages").glob("*.j2"))
        raise ValueError(f"no dockerfiles/packages/{name}.j2; known: {', '.join(known)}")
    return name


# Strings that reach a Dockerfile or a command line are checked by their grammar (builder/grammar.py)
ENV_NAME = _grammar(grammar.identifier, "a variable name like TORCH_CUDA_ARCH_LIST")
LINE = _grammar(grammar.line, "a string on one line", "strings on one line")
QUOTABLE = _grammar(grammar.quotable, "a string on one line without a single quote",
                    "strings on one line without a single quote")
ENV_VALUE = _grammar(grammar.double_quotable, 'a string on one line without " or \\')
REL_PATH = _grammar(grammar.relative_path, "a relative path inside the source tree")
SUBDIR = _grammar(grammar.subdir, "a directory path without spaces or shell characters")
GIT_URL = _grammar(grammar.git_url, "a git URL like https://github.com/org/repo")
TOKEN = _grammar(grammar.token, "a plain word (letters, digits, . _ + / - { } :)")
PYPI_NAME = _grammar(grammar.pypi_name, "a PyPI project name")
TEMPLATE = _grammar(_template, "a template of dockerfiles/packages/")
PACKAGE_KEY = _grammar(grammar.package_name, "a package name like flash-attn (lowercase letters, digits, single '-')")
CUDA_KEY = _grammar(lambda v: grammar.cuda_version(v) if v.count(".") == 1 else grammar.cuda_version("x"),
                    'a CUDA major.minor like "13.0"')
PIN_VERSION_DATA = _grammar(grammar.version, "a version like 0.1.6")


def _sass_name(value: str) -> str:
    if not re.fullmatch(r"sm_\d{2,3}[af]?", value):
        raise ValueError("write sm_90, sm_90a or sm_100f")
    return value


def _utc_time(value: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", value):
        raise ValueError(value)
    datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")  # a real date and time
    return value


UTC_TIME = _grammar(_utc_time, 'a UTC time like "2024-10-17T18:04:43Z"')
PIN = _grammar(grammar.requirement, "a requirement like cmake==3.31.6", "requirements like cmake==3.31.6")
SASS_NAME = _grammar(_sass_name, "a SASS name like sm_90a", "SASS names like sm_90a")


@dataclass(frozen=True)
class OneOf:
    """An enumeration; with `ref_prefix`, also "<ref_prefix><package>" naming a package of the knowledge."""

    values: tuple[str, ...]
    ref_prefix: str = ""

    @property
    def noun(self) -> str:
        shown = [*self.values, f"{self.ref_prefix}<package>"] if self.ref_prefix else self.values
        return "one of " + ", ".join(shown)


class PackageName:
    """A string naming a package of the knowledge, from any of its files."""

    noun = "a package name"
    plural = "package names"


@dataclass(frozen=True)
class ListOf:
    item: Scalar | PackageName | Table

    @property
    def noun(self) -> str:
        return f"a list of {self.item.plural}"


@dataclass(frozen=True)
class TableOf:
    """A table whose keys the file chooses (package names, CUDA versions, variables), all values of one type."""

    value: Scalar | Table
    key: Parsed | None = None  # the grammar of its keys, when they reach a Dockerfile

    @property
    def noun(self) -> str:
        return f"a table of {self.value.plural}"


@dataclass(frozen=True)
class Table:
    """A table with fixed keys."""

    required: dict[str, object] = field(default_factory=dict)
    optional: dict[str, object] = field(default_factory=dict)
    exactly_one_of: tuple[str, ...] = ()  # optional keys of which exactly one must be given
    required_when: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (other key, its value)

    noun = "a table"
    plural = "tables"

    @property
    def keys(self) -> dict[str, object]:
        return {**self.required, **self.optional}


# -- engine knowledge --------------------------------------------------------------------------------------
ARCHS = ListOf(INT)

KNOB = Table(
    required={"format": OneOf(KNOB_FORMATS)},
    optional={"env": ENV_NAME, "cmake": ENV_NAME, "accepted": ARCHS, "threshold": INT},
    exactly_one_of=("env", "cmake"),  # the environment variable or the CMake define the knob sets
    required_when={"threshold": ("format", "switch-below")},
)

# A literal edit of one source file, when building against a torch in `when_torch` (any torch without it).
PATCH = Table(required={"file": REL_PATH, "replace": QUOTABLE, "with": QUOTABLE}, optional={"when_torch": VERSION_RANGE})

STRATEGY = Table(
    required={"versions": VERSION_RANGE, "why_not": STR, "flags": ListOf(STR)},
    # the environment the engine runs under for this strategy, and log lines that mean it did not take effect
    optional={"env": TableOf(ENV_VALUE, key=ENV_NAME), "forbid_log": ListOf(STR),
              # smoke: what the engine's parser must resolve the flags to (dotted attribute paths; a key with
              # "@resolved" is the engine's own name resolution), draft tokens per draft, the default drafter
              "expect": TableOf(Scalar((str, int, bool), "a string, integer or boolean", "strings, integers or booleans")),
              "k": INT, "drafter": STR},
)

# What smoke needs to run an engine version (builder/smoke/): how it serves, how its own parser is reached,
# and which counters prove speculative decoding ran. Rules merge this table key by key.
SMOKE = Table(optional={
    "serve_args": ListOf(STR),  # {host} {port}: where it listens
    "dummy_load": ListOf(STR),  # a checkpoint without weights (random weights)
    "tiny_args": ListOf(STR),  # for the generated tiny model: small context and memory
    "completions": STR,  # the OpenAI completions path
    "server_info": STR,  # a path echoing the resolved server arguments
    "args_class": STR,  # module:Class with add_cli_args(parser) and from_cli_args(namespace)
    "parser": ListOf(STR),  # module:Parser factories, the first importable one is used
    "model_flag": STR,
    "cpu_env": TableOf(STR),  # the environment its parser needs on a host without a GPU
    "name_resolver": Table(required={"attr": STR, "call": STR}),  # the engine's own resolution of a value
    "spec_metrics": Table(optional={"drafts": STR, "draft_tokens": STR, "accepted": STR, "accept_length": STR}),
    "imports": ListOf(STR),  # more modules that must import (besides serve_modules)
    "jit_tools": ListOf(STR),  # programs its run-time kernel compilation calls
})

# where the torch pin comes from: the package's own metadata, the engine that pins the package, no torch, or
# the metadata of another package ("via:vllm": SGLang 0.3.x runs on the vLLM it pins)
TORCH_PIN = OneOf(("metadata", "consumer", "none"), ref_prefix="via:")

# Every rule whose `versions` contains the version applies, in file order; later rules override keys.
RULE = Table(
    required={"versions": VERSION_RANGE},
    optional={
        "source": OneOf(("sdist", "git", "local")),
        "source_subdir": SUBDIR,
        "git_repository": GIT_URL,
        "git_tag": TOKEN,
        "min_cuda": VERSION,
        "min_arch": INT,
        "min_cmake": VERSION,
        "min_gcc": VERSION,  # the oldest GCC its build accepts (checked against the devel base: plan, build, doctor)
        "build_requirements": ListOf(REL_PATH),  # requirements files in the source tree, read in this order
        "build_requirements_list": ListOf(QUOTABLE),
        "build_command": LINE,
        "build_env": TableOf(ENV_VALUE, key=ENV_NAME),
        "arch_knobs": ListOf(KNOB),
        "builds_archs": Table(optional={"always": ARCHS, "switch": ARCHS}),
        "compile_threads_define": ENV_NAME,
        "torch_pin": TORCH_PIN,
        "pin_extras": ListOf(STR),
        "companions": ListOf(PackageName()),
        "launch": ListOf(STR),
        "health": STR,
        "ready_log": STR,
        "metrics": ListOf(STR),
        # vLLM's setup.py splits $CMAKE_ARGS on whitespace from 0.12 on; unset, it ignores them
        "rust_toolchain": TOKEN,
        "fetch_plan": BOOL,
        "patches": ListOf(PATCH),
        "source_remove": ListOf(REL_PATH),  # paths of the source tree the build leaves out (why: in the data)
        # the first resolve of the cell's build and runtime requirements takes only files uploaded before this
        # moment (UTC, ISO 8601): the engine release's own upload time on the index
        "resolve_as_of": UTC_TIME,
        # exact pins the first resolve takes although uploaded later (their era's files are gone from the index)
        "resolve_as_of_exempt": ListOf(PIN),
        # -- what issue 7 found missing (see builder/data/engines.toml for the evidence per key) --
        # the source takes its version from git through setuptools-scm: the build sets
        # SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<NAME> to the pinned version
        "setuptools_scm": BOOL,
        "git_submodules": ListOf(REL_PATH),  # submodules the build reads (fetched at the commit's gitlinks)
        # companions the package's metadata does not pin, with the version it needs
        "companion_versions": TableOf(PIN_VERSION_DATA, key=PACKAGE_KEY),
        "install_extras": ListOf(TOKEN),  # extras the runtime installs the engine with (sglang[srt])
        "serve_modules": ListOf(TOKEN),  # modules serving imports: the image check finds each of them
        # site-packages files that dependencies ship by mistake and nothing imports (why: in the data): the runtime
        # removes them after the install, and the check that no path is installed twice leaves them out
        "stray_files": ListOf(REL_PATH),
        "runtime_jit": BOOL,  # kernels compile at run time: the runtime gets the CUDA table's runtime_jit
        "runtime_checks": ListOf(QUOTABLE),  # Python statements the image must run without error
        "serve_jit": ListOf(TOKEN),  # what it compiles at its first request: names in the serve_jit table
        "smoke": SMOKE,
        # FetchContent sources whose override is CMake's FETCHCONTENT_SOURCE_DIR_<NAME>, not the engine's variable
        "fetch_overrides": TableOf(OneOf(("fetchcontent",)), key=TOKEN),
        # SASS built whatever the knobs say, by CUDA version: complete sets, the highest min_cuda <= CUDA applies
        "builds_extra_sass": ListOf(Table(required={"min_cuda": VERSION, "sass": ListOf(SASS_NAME)})),
        # binaries built for some arch families only, by design: the audit asks them for these archs only
        # (all_but: loaded on every GPU except these, e.g. a copy another file replaces on sm_90)
        # --arch for a build that hard-codes its gencode lists: builder's nvcc launcher filters them per CMake target
        "arch_select": OneOf(("gencode-filter",)),
        # what kind of binaries the wheel holds and what they are bound to (plan and labels say it)
        "holds": ListOf(OneOf(("pure Python", "CUDA kernels", "C++ against torch", "Rust", "Rust (vllm-rs)"))),
        "bound_to": ListOf(STR),
        # what each binary of the release holds upstream (SASS, kernels per SASS target) and which target makes it
        "binaries": ListOf(Table(required={"files": QUOTABLE, "target": TOKEN, "sass": ListOf(SASS_NAME), "units": INT})),
        "binaries_cuda": VERSION,  # the CUDA release those binaries were read from
        "arch_scoped": ListOf(Table(required={"files": QUOTABLE, "why": STR}, optional={"archs": ARCHS, "all_but": ARCHS},
                                    exactly_one_of=("archs", "all_but"))),
    },
)

PACKAGE = Table(
    required={
        "pypi": PYPI_NAME,
        "kind": OneOf(("engine", "kernels")),
        "template": TEMPLATE,
        "torch_pin": TORCH_PIN,
        "mem_gb_per_nvcc_thread": NUMBER,
        "rules": ListOf(RULE),
    },
    optional={
        # what MAX_JOBS counts: "total-threads" every nvcc thread, "jobs-x-threads" processes of NVCC_THREADS each
        "parallelism": OneOf(("total-threads", "jobs-x-threads")),
        "compiled": BOOL,
        "strategies": TableOf(STRATEGY),
    },
)

# runtime_jit: what an engine that compiles kernels at run time needs in its runtime image for this CUDA
RUNTIME_JIT = Table(required={"pip": ListOf(QUOTABLE), "apt": ListOf(TOKEN), "root": REL_PATH})
def _nvcc_flag(value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_-]*(=[A-Za-z0-9._,-]+)?", value, re.ASCII):
        raise ValueError("is not an nvcc option like -objtemp")
    return value


CUDA = Table(required={"archs": ARCHS}, optional={"min_driver": STR, "runtime_jit": RUNTIME_JIT,
                                                  "nvcc_append_flags": ListOf(_grammar(_nvcc_flag, "an nvcc option like -objtemp"))})

BUILD_TOOLS = Table(required={"pip": ListOf(PIN), "cmake": PIN})

# serve_jit: one compile an engine does at its first request, what the runtime image needs for it and why
SERVE_JIT = Table(required={"why": STR, "probe": OneOf(("triton", "nvcc-libcuda", "python-c"))},
                  optional={"apt": ListOf(TOKEN), "libcuda_stub": BOOL, "needs_runtime_jit": BOOL})

# the system compiler of a base OS's devel image (its distribution's default gcc): checked against min_gcc
BASE_OS = Table(required={"gcc": VERSION})

# index_wheels: the device code of a file an index publishes, per binary, as `builder audit` read it from the
# real file (keyed by its sha256): what `plan` predicts a `source = "auto"` choice with before any download
def _device_code_name(value: str) -> str:
    if not re.fullmatch(r"(sm|compute)_\d{2,3}[af]?", value):
        raise ValueError("write sm_90, sm_90a, sm_100f or compute_80")
    return value


INDEX_WHEEL = Table(required={"file": _grammar(grammar.filename, "a plain file name"), "package": STR,
                              "cuda": STR,  # the CUDA runtime majors its binaries need (libcudart.so.N), "" none
                              "binaries": TableOf(ListOf(_grammar(_device_code_name, "a SASS or PTX name",
                                                                  "SASS or PTX names like sm_90a or compute_80")))},
                    optional={"read": STR})
INDEX_WHEEL_KEY = _grammar(grammar.sha256, "a sha256 (64 lowercase hex digits)")

BUILT_IN = Table(required={"packages": TableOf(PACKAGE, key=PACKAGE_KEY), "cuda": TableOf(CUDA, key=CUDA_KEY),
                           "build_tools": BUILD_TOOLS},
                 optional={"serve_jit": TableOf(SERVE_JIT, key=TOKEN), "base_os": TableOf(BASE_OS, key=TOKEN),
                           "index_wheels": TableOf(INDEX_WHEEL, key=INDEX_WHEEL_KEY)})

# An extra file adds to the built-in one: its packages and CUDA versions replace whole entries, its build_tools
# keys replace single keys, and any section may be left out.
EXTRA = Table(optional={
    "packages": TableOf(PACKAGE, key=PACKAGE_KEY),
    "cuda": TableOf(CUDA, key=CUDA_KEY),
    "build_tools": Table(optional=BUILD_TOOLS.required),
    "serve_jit": TableOf(SERVE_JIT, key=TOKEN),
    "base_os": TableOf(BASE_OS, key=TOKEN),
    "index_wheels": TableOf(INDEX_WHEEL, key=INDEX_WHEEL_KEY),
})


# -- matrix.lock -------------------------------------------------------------------------------------------
# Written by `builder lock`, but a file like any other: every value that reaches a Dockerfile is checked too.
SHA256 = _grammar(grammar.sha256, "a sha256 (64 lowercase hex digits)")
COMMIT = _grammar(grammar.commit, 'a git commit (40 hex digits) or "" while unresolved')
URL = _grammar(grammar.url, "an http(s) URL")
FILENAME = _grammar(grammar.filename, "a plain file name")
PIN_VERSION = _grammar(grammar.version, "a version like 2.14.0")
PYTHON_RANGE = _grammar(lambda v: v and grammar.version_range(v), 'a version range like ">=3.11" (or "")')
LOCK_KEY = _grammar(lambda k: (grammar.package_name(k.partition("==")[0]), grammar.version(k.partition("==")[2])),
                    'name==version, like "vllm==0.33.0"')
LOCK_GIT = Table(required={"repository": GIT_URL, "tag": TOKEN, "commit": COMMIT}, optional={"unresolved": STR})
LOCK_ENTRY = Table(optional={
    "requires_python": PYTHON_RANGE,
    "torch": PIN_VERSION,
    "pins": TableOf(PIN_VERSION, key=PACKAGE_KEY),
    "sdist": Table(required={"filename": FILENAME, "url": URL, "sha256": SHA256}),
    "git": LOCK_GIT,
    "deps": TableOf(LOCK_GIT, key=TOKEN),
    "wheels": ListOf(Table(required={"filename": FILENAME, "url": URL, "sha256": SHA256},
                           optional={"torch": _grammar(lambda v: v and grammar.version(v), 'a version (or "")'),
                                     "requires_python": PYTHON_RANGE})),
})
def _image_digest(value) -> str:
    if value != "" and not (isinstance(value, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", value, re.ASCII)):
        raise ValueError("is not an image digest (sha256: and 64 lowercase hex digits)")
    return value


IMAGE_DIGEST = _grammar(_image_digest, 'an image digest like "sha256:<64 hex>" (or "" while unresolved)')
LOCK_BASE = Table(required={"digest": IMAGE_DIGEST}, optional={"from": STR, "unresolved": STR})
LOCK = Table(required={"format": INT}, optional={"index": URL, "packages": TableOf(LOCK_ENTRY, key=LOCK_KEY),
                                                 "base_images": TableOf(LOCK_BASE, key=_grammar(grammar.image_ref, "an image reference"))})
