"""One validation language: the shapes of every data file builder reads, and the one checker (`check`).

  matrix.toml (MATRIX, with [defaults] as DEFAULTS and [defaults.cache] as CACHE), builder/data/defaults.toml
  (its [matrix] table is a DEFAULTS too), builder/data/engines.toml and every extra file a matrix names
  (BUILT_IN, EXTRA), and matrix.lock (LOCK). Each file is checked key by key before anything reads it; what only
  the engine data can judge (an engine's versions, strategy names) the reader checks after.
  The JSON files builder writes for itself are read through shapes too: the image ledger's entries
  (LEDGER_ENTRY, builder/ledger.py).

A type here is a description, not code that runs: `noun` is how messages spell the expectation
("a list of strings", "one of engine, kernels").
"""

from __future__ import annotations

import difflib
import math
import re
import string
from datetime import datetime
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import grammar
from .archs import KNOB_FORMATS
from .errors import UserError


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
    say_expected: bool = True  # "; expected <noun>" after the reason (not where the reason says it already)
    types: tuple[type, ...] = (str,)  # the TOML types it parses (a timestamp may be an integer too)


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
def _version_file(value: str) -> str:
    grammar.relative_path(value)
    if not (value.endswith(".py") or value.rsplit("/", 1)[-1] == "pyproject.toml"):
        raise ValueError("names neither a pyproject.toml nor a .py file")
    return value


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


def _cmake_arch(value: str) -> str:
    if value != "CUDA_ARCHS" and not re.fullmatch(r"\d{1,2}\.\d[af]?(\+PTX)?", value):
        raise ValueError("write 9.0a, 10.0f, 8.0+PTX or CUDA_ARCHS")
    return value


def _cmake_target(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.+-]*", value):
        raise ValueError("letters, digits and _ . + - (a leading _ allowed)")
    return value


CMAKE_TARGET = _grammar(_cmake_target, "a CMake target name like _qutlass_C or flash_ops")
# an arch in CMake's spelling as vLLM's lists write it; "CUDA_ARCHS" (a list of its own): the build's whole list
CMAKE_ARCH = _grammar(_cmake_arch, 'a CMake arch like "9.0a", "10.0f" or "8.0+PTX"', 'CMake archs like "9.0a"')
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

    @property
    def plural(self) -> str:
        return "strings, each " + self.noun


class PackageName:
    """A string naming a package of the knowledge, from any of its files."""

    noun = "a package name"
    plural = "package names"


@dataclass(frozen=True)
class ListOf:
    item: Scalar | PackageName | Table
    nonempty: bool = False

    @property
    def noun(self) -> str:
        return f"a{' non-empty' if self.nonempty else ''} list of {self.item.plural}"


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
    open: bool = False  # other keys allowed: a file another program writes (a load generator's result)

    noun = "a table"
    plural = "tables"

    @property
    def keys(self) -> dict[str, object]:
        return {**self.required, **self.optional}


@dataclass(frozen=True)
class OrNull:
    """A JSON value that may also be null (JSON files only: TOML has no null)."""

    kind: object

    @property
    def noun(self) -> str:
        return f"{self.kind.noun} or null"

    @property
    def plural(self) -> str:
        return f"{self.kind.plural} or nulls"


@dataclass(frozen=True)
class AnyOf:
    """One of several kinds, told apart by the value's TOML type (a string or a table)."""

    kinds: tuple

    @property
    def noun(self) -> str:
        return " or ".join(k.noun for k in self.kinds)

    @property
    def plural(self) -> str:
        return " or ".join(k.plural for k in self.kinds)


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

# the JIT modules a release (a rule) or a strategy builds at its first requests (names in the jit_modules table), per
# GPU family (archs: the compute capabilities on which the engine's own code selects it), with the upstream file and
# condition that select each; not_built: listed (its links are provided) but not built by smoke or a prebuild, and why
# (a strategy's entry may hold versions: the engine releases whose code selects it, the strategy's own range otherwise)
JIT_MODULE_USES = ListOf(Table(required={"module": TOKEN, "archs": ARCHS, "selected_by": STR},
                               optional={"not_built": STR, "versions": VERSION_RANGE}))

STRATEGY = Table(
    required={"versions": VERSION_RANGE, "why_not": STR, "flags": ListOf(STR)},
    # the environment the engine runs under for this strategy, and log lines that mean it did not take effect
    optional={"env": TableOf(ENV_VALUE, key=ENV_NAME), "forbid_log": ListOf(STR),
              # smoke: what the engine's parser must resolve the flags to (dotted attribute paths; a key with
              # "@resolved" is the engine's own name resolution), draft tokens per draft, the default drafter
              "expect": TableOf(Scalar((str, int, bool), "a string, integer or boolean", "strings, integers or booleans")),
              "k": INT, "drafter": STR,
              # JIT modules only this strategy's code selects (DFlash2's top-k): cells with the strategy build them too
              "jit_modules": JIT_MODULE_USES},
)

# What smoke needs to run an engine version (builder/deploy/smoke/): how it serves, how its own parser is reached,
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

# One CMake option of a package that builds one of its arch-scoped binaries at all (sglang-kernel's
# SGL_KERNEL_ENABLE_FA3 and flash_ops).
BINARY_SWITCH = Table(required={
    "files": QUOTABLE,  # the binary's glob inside the wheel: the same string as its arch_scoped entry, which says which GPUs load it
    "cmake": ENV_NAME,  # the CMake option (-D NAME=OFF leaves the binary's target out of the build)
    "why": STR,  # what the option builds, and where the CMake says so
})

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
        # the file of the source tree (under source_subdir) that names its version: a pyproject.toml ([project]
        # version) or a Python file (__version__ = "..."); the source stage refuses a tree of another version
        "source_version": _grammar(_version_file, "a relative path to a pyproject.toml or a .py file"),
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
        # the JIT modules it builds at its first requests (names in the jit_modules table), per GPU family, with the
        # upstream file that selects each; not_built: listed (its links are provided) but not built by smoke, and why
        "jit_modules": JIT_MODULE_USES,
        # every JIT path the version can take at its first requests: covered by smoke's JIT layer (a serve_jit
        # entry "serve_jit.<name>" or "jit_modules") or not, with the reason
        "jit_paths": ListOf(Table(required={"path": STR}, optional={"covered_by": TOKEN, "not_covered": STR},
                                  exactly_one_of=("covered_by", "not_covered"))),
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
        # what each binary of the release holds upstream (SASS, kernels per SASS target) and which target makes it;
        # or, where the engine's CMake selects each target's archs itself (cmake_archs below), the CMake arch lists
        # the target passes to that rule (each intersected with the build's archs, the results joined; pick
        # "first": only the first list that selects anything is compiled) and the upstream file:lines they are from
        "binaries": ListOf(Table(required={"files": QUOTABLE, "target": CMAKE_TARGET},
                                 optional={"sass": ListOf(SASS_NAME), "units": INT,
                                           "cmake_archs": ListOf(ListOf(CMAKE_ARCH)),
                                           "pick": OneOf(("all", "first")), "source": STR},
                                 exactly_one_of=("sass", "cmake_archs"))),
        "binaries_cuda": VERSION,  # the CUDA release those binaries were read from
        # the engine's CMake filters the requested archs itself before any target sees them (vLLM: CUDA_ARCHS =
        # cuda_archs_loose_intersection(CUDA_SUPPORTED_ARCHS, the archs of torch's -gencode flags)): the rule and its
        # supported list per CUDA (complete lists, the highest min_cuda <= the cell's CUDA applies). The knobs are
        # given what it keeps, plan's SASS and the cache key follow it (10.3 → 10.0 with nvcc 13.0)
        "cmake_archs": Table(required={"rule": OneOf(("cuda_archs_loose_intersection",)),
                                       "supported": ListOf(Table(required={"min_cuda": VERSION,
                                                                           "archs": ListOf(CMAKE_ARCH)},
                                                                 optional={"source": STR}))},
                             optional={"source": STR}),
        "arch_scoped": ListOf(Table(required={"files": QUOTABLE, "why": STR}, optional={"archs": ARCHS, "all_but": ARCHS},
                                    exactly_one_of=("archs", "all_but"))),
        # CMake options that build one arch-scoped binary at all: when no requested GPU loads that binary the build
        # passes the option OFF (plan shows it among the knobs) and neither compiles nor expects the binary
        "binary_switches": ListOf(BINARY_SWITCH),
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

def _matching(pattern: str, why: str):
    """A check of a string value against `pattern` (whole, ASCII), refusing with `why`."""
    rx = re.compile(pattern, re.ASCII)

    def check(value: str) -> str:
        if not rx.fullmatch(value):
            raise ValueError(why)
        return value

    return check


_library = _matching(r"[A-Za-z][A-Za-z0-9_+]*", "is not a library name as -l takes it, like nvrtc or cublasLt")
_generator = _matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*", "is not module:function")
_abs_dir = _matching(r"(/[A-Za-z0-9._-]+)+", "is not an absolute directory path without spaces or shell characters")


# jit_frameworks: how a JIT framework's module generators are driven (the environment variables of its arch list and
# JIT cache, the method that compiles and links) and what every module of it links; jit_modules: one generator each
LIBRARIES = ListOf(_grammar(_library, "a library name like nvrtc", "library names like nvrtc or cublasLt"))
# - the target: arch_env, an environment variable holding the arch list ("8.0 9.0"), or arch_context, a context manager
#   (module:function) called with (major, minor) that sets the one target of the process (SGLang's JIT reads no
#   environment: it takes the GPU's capability or override_jit_cuda_arch); arch_scope: "set" when the framework names
#   its cache directory after the whole arch set it reads (FlashInfer: 80_90a on a host with both GPUs), so a prebuilt
#   image pins arch_env to the cell's archs and builds each module once for that set; "device" when each process
#   builds for its own GPU, so a prebuilt image builds each module once per arch
# - cache_env: the variable naming its JIT cache; cache_subdir: its directory under the image's JIT cache root
#   (jit_cache_root, one value for every framework)
# - build: the method of the generator's result that compiles and links; absent when calling the generator (a loader)
#   compiles, links and loads the module itself
# - answer_gpu: functions (module:attribute) the module's flags depend on that ask whether a GPU is present: a build
#   without one (smoke, a prebuild) answers True, so the module is keyed and compiled as the GPU's process keys it
JIT_FRAMEWORK = Table(required={"why": STR, "links": LIBRARIES, "cache_env": ENV_NAME,
                                "cache_subdir": _grammar(grammar.identifier, "a directory name like flashinfer")},
                      optional={"arch_env": ENV_NAME, "arch_context": _grammar(_generator, "module:function, like "
                                "sglang.kernels.jit.utils.arch:override_jit_cuda_arch"),
                                "arch_scope": OneOf(("set", "device")),
                                "build": _grammar(grammar.identifier, "a method name like build"),
                                "answer_gpu": ListOf(_grammar(_generator, "module:attribute"))},
                      exactly_one_of=("arch_env", "arch_context"))
# kwargs: the generator's keyword arguments; objects: keyword arguments whose values are Python objects, named
# module.attribute (torch.bfloat16); downloads: what the generator fetches over the network when it runs, and from
# where (plan says it: an image that builds it at run time needs that network, or the files beforehand)
_DOTTED = _grammar(_matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", "is not module.attribute"),
                   "a dotted name like torch.bfloat16")
JIT_MODULE = Table(required={"framework": TOKEN, "links": LIBRARIES, "defined_in": STR,
                             "generator": _grammar(_generator, "module:function, like flashinfer.jit.sampling:gen_sampling_module")},
                   optional={"kwargs": TableOf(AnyOf((STR, BOOL, INT)), key=_grammar(grammar.identifier, "an argument name")),
                             "objects": TableOf(_DOTTED, key=_grammar(grammar.identifier, "an argument name")),
                             "downloads": STR})

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
                           "index_wheels": TableOf(INDEX_WHEEL, key=INDEX_WHEEL_KEY),
                           "jit_frameworks": TableOf(JIT_FRAMEWORK, key=TOKEN), "jit_modules": TableOf(JIT_MODULE, key=TOKEN),
                           # the image's one directory for the JIT caches of prebuilt modules (jit = "prebuilt")
                           "jit_cache_root": _grammar(_abs_dir, "an absolute directory like /opt/jit-cache")})

# An extra file adds to the built-in one: its packages and CUDA versions replace whole entries, its build_tools
# keys replace single keys, and any section may be left out.
EXTRA = Table(optional={
    "packages": TableOf(PACKAGE, key=PACKAGE_KEY),
    "cuda": TableOf(CUDA, key=CUDA_KEY),
    "build_tools": Table(optional=BUILD_TOOLS.required),
    "serve_jit": TableOf(SERVE_JIT, key=TOKEN),
    "base_os": TableOf(BASE_OS, key=TOKEN),
    "index_wheels": TableOf(INDEX_WHEEL, key=INDEX_WHEEL_KEY),
    "jit_frameworks": TableOf(JIT_FRAMEWORK, key=TOKEN),
    "jit_modules": TableOf(JIT_MODULE, key=TOKEN),
    "jit_cache_root": _grammar(_abs_dir, "an absolute directory like /opt/jit-cache"),
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
    # the CUDA major that torch is built for, and the requirement of its own metadata that says so
    "torch_cuda": Table(required={"major": INT, "from": STR}),
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


# -- the image ledger (builder/ledger.py): one JSON file per content key under the wheelhouse's .images/ ---------
def _built_digest(value) -> str:
    if not _image_digest(value):
        raise ValueError("is empty")
    return value


BUILT_DIGEST = _grammar(_built_digest, 'an image digest like "sha256:<64 hex>"')
LEDGER_IMAGE = Table(required={"cell": STR, "recorded": UTC_TIME})
LEDGER_ENTRY = Table(required={"format": INT, "content_key": SHA256, "images": TableOf(LEDGER_IMAGE, key=BUILT_DIGEST)},
                     optional={"published": TableOf(BUILT_DIGEST, key=_grammar(grammar.image_ref, "an image reference"))})


# -- matrix.toml -------------------------------------------------------------------------------------------
# What a matrix file may say; builder/matrix.py checks it against these shapes first, then what only the engine
# data can judge (an engine's name and versions, CUDA versions the toolkit knows, strategy names). Values that
# reach a Dockerfile or a command line are checked by their grammar, and the messages are the grammar's.
BASE_PLACEHOLDERS = ("cuda", "os")


def _base_template(value: str) -> str:
    """A base-image template: an image reference once {cuda} and {os} are filled in."""
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise ValueError(f"bad placeholder ({exc}); write {{cuda}} or {{os}}, and {{{{ }}}} for a literal brace") from None
    for _, name, spec, conv in parts:
        if name is not None and (name not in BASE_PLACEHOLDERS or spec or conv):
            raise ValueError(f"unknown placeholder {{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}; "
                             "known: {cuda}, {os}")
    try:
        grammar.image_ref(value.format(cuda="13.0.3", os="ubuntu24.04"))
    except ValueError as exc:
        raise ValueError(f"{exc} (with {{cuda}} and {{os}} filled in)") from None
    return value


def _registry_prefix(value: str) -> str:
    if not grammar.NAME_RE.fullmatch(value) or len(value) > 200:
        raise ValueError("is not a registry/repository prefix like 127.0.0.1:5000/builder")
    return value


def _model_id(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?", value, re.ASCII):
        raise ValueError("is not a model id like Qwen/Qwen3.8-27B-FP8")
    return value


def _sm_arch(value: int) -> int:
    if not 30 <= value <= 200:
        raise ValueError("is not an SM arch number like 80 or 90")
    return value


def _runner_label(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value, re.ASCII):
        raise ValueError('is not a runner label like "self-hosted" (letters, digits, ".", "_", "-")')
    return value


def _said(rule, noun: str, plural: str = "", types: tuple[type, ...] = (str,)) -> Parsed:
    """A grammar whose reason already says what is expected (the message is the grammar's own)."""
    return Parsed(rule, noun, plural or noun, explain=True, say_expected=False, types=types)


# which archs nvcc of a profile's CUDA can target is archs.py's business, once the shape is right
MATRIX_ARCHS = ListOf(_said(_sm_arch, "an SM arch number like 80 or 90", "SM arch numbers like 80 or 90", types=(int,)))
BASE_TEMPLATE = _said(_base_template, "an image reference with {cuda} / {os} placeholders")
BASE_IMAGES = Table(optional={"devel": BASE_TEMPLATE, "runtime": BASE_TEMPLATE})
IMAGE_NAME = _said(grammar.image_name, "an image name like builder-local/cuda", "image names like builder-local/cuda")
RUNNER_LABELS = ListOf(_said(_runner_label, "a runner label", "runner labels"), nonempty=True)
# [defaults.cache]: remote wheel stores (a string "registry", "registry:HOST/REPO", "index:URL", or a table) and the
# compile cache's backend and scheduler. builder/cache/config.py and compile_cache.py read the values' meaning.
REMOTE = AnyOf((STR, Table(required={"kind": OneOf(("registry", "index"))},
                           optional={"url": STR, "push": BOOL, "upload": STR, "insecure": BOOL})))
CACHE = Table(optional={"remotes": ListOf(REMOTE), "compile": STR, "dist": STR, "dist_cores": INT})
DEFAULTS = Table(optional={
    "profile": STR,
    "archs": MATRIX_ARCHS,
    "registry": _said(_registry_prefix, "a registry/repository prefix like 127.0.0.1:5000/builder"),
    "index": _said(grammar.index_url, "a PEP 691 index URL"),
    "model": _said(_model_id, "a model id like Qwen/Qwen3.8-27B-FP8"),
    "base_images": BASE_IMAGES,
    "mirrors": TableOf(IMAGE_NAME, key=IMAGE_NAME),
    "knowledge": ListOf(_said(grammar.line, "a path on one line", "paths on one line")),
    "cache": CACHE,
    "source_date_epoch": _said(grammar.source_date_epoch, "a Unix timestamp like 1700000000", types=(str, int)),
    "runners": Table(optional={"compile": RUNNER_LABELS, "light": RUNNER_LABELS, "gpu": RUNNER_LABELS}),
})
MATRIX_VERSION = _said(grammar.version, "a version like 0.33.0", "versions like 0.33.0")
# profiles.<name>.source: where a package's wheel comes from. "build" (the default) compiles it from its pinned
# source; "index" takes the release's wheel from defaults.index as published (pinned by sha256 in matrix.lock)
# and lets the audit decide whether it carries the requested archs; "auto" takes that wheel when its audit passes
# for the requested archs and its torch / CUDA / Python match the cell, else compiles (builder/route.py).
SOURCE_CHOICES = ("build", "index", "auto")
JIT_CHOICES = ("first-request", "prebuilt")
PROFILE = Table(
    required={"cuda": _said(grammar.cuda_version, "a CUDA version like 13.0.3"),
              "os": _said(grammar.os_tag, "an OS tag like ubuntu24.04"),
              "python": _said(grammar.python_version, "a Python version like 3.12"),
              "engines": TableOf(MATRIX_VERSION)},
    optional={"torch": AnyOf((MATRIX_VERSION, TableOf(MATRIX_VERSION))), "flash_attn": MATRIX_VERSION,
              "strategies": ListOf(STR), "archs": MATRIX_ARCHS, "base_images": BASE_IMAGES,
              "source": TableOf(OneOf(SOURCE_CHOICES)),
              # profiles.<name>.jit: per engine, when its JIT modules (engine data jit_modules) are built: at the first
              # request that needs each (the default) or at image-build time into the image's JIT cache
              "jit": TableOf(OneOf(JIT_CHOICES))},
)
MATRIX = Table(optional={"defaults": DEFAULTS, "profiles": TableOf(PROFILE)})


# -- bench: workloads (builder/data/bench.toml, a TOML or JSONL file), the load generator's result, bench.json ---
def _in_range(lo: float, hi: float, lo_open: bool = False) -> Callable:
    """A number from lo to hi (above lo when lo_open), finite: NaN and infinities are no figure."""

    def parse(value):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("is not a finite number")
        if value < lo or (lo_open and value == lo) or value > hi:
            plain = lambda x: str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"
            raise ValueError(f"is out of range ({'above' if lo_open else 'from'} {plain(lo)} "
                             f"{'and at most' if lo_open else 'to'} {plain(hi)})")
        return value

    return parse


def _count(lo: int, hi: int, noun: str) -> Parsed:
    return _said(_in_range(lo, hi), noun, types=(int,))


def _token_range(value) -> list:
    if (len(value) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in value)
            or not 1 <= value[0] <= value[1] <= MAX_TOKENS):
        raise ValueError(f"is not [lo, hi]: two integers with 1 <= lo <= hi <= {MAX_TOKENS}")
    return value


def _nonempty(value: str) -> str:
    if not value:
        raise ValueError("is empty")
    return value


MAX_TOKENS = 1_000_000
FIGURE = OrNull(_said(_in_range(0, 1e15), "a finite number of at least 0", types=(int, float)))
REQUESTS = _count(1, 1_000_000, "an integer from 1 to 1000000")
CONCURRENCY = _count(1, 100_000, "an integer from 1 to 100000")
OUTPUT_TOKENS = _count(1, MAX_TOKENS, f"an integer from 1 to {MAX_TOKENS}")
SEED = _count(0, 2**32 - 1, "an integer from 0 to 4294967295")  # numpy's seeds, in the load generator
WORKLOAD_BIN = Table(required={"share": _said(_in_range(0, 1, lo_open=True), "a share above 0 and at most 1",
                                              types=(int, float)),
                               "input_tokens": _said(_token_range, "[lo, hi] input tokens", types=(list,))})
WORKLOAD = Table(required={"concurrency": CONCURRENCY, "requests": REQUESTS, "output_tokens": OUTPUT_TOKENS,
                           "mix": ListOf(WORKLOAD_BIN, nonempty=True)},
                 optional={"seed": SEED})
PROMPT_LINE = Table(required={"prompt": _said(_nonempty, "a non-empty string")},
                    optional={"output_tokens": OUTPUT_TOKENS, "input_tokens": _count(0, MAX_TOKENS, "a token count")})
# `vllm bench serve --save-result`: the keys bench reads (the file holds more: other keys are left alone)
_CLIENT_FIGURES = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                   "output_throughput", "request_goodput",
                   *[f"p{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for p in (50, 90, 99)],
                   "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
                   "spec_decode_draft_tokens", "spec_decode_accepted_tokens")
CLIENT_RESULT = Table(required={"completed": FIGURE, "duration": FIGURE},
                      optional={**{k: FIGURE for k in _CLIENT_FIGURES if k not in ("completed", "duration")},
                                "errors": OrNull(ListOf(OrNull(STR)))}, open=True)
# bench.json, as `builder bench` writes it: what diff, plot and the table read is checked, the rest left alone
BENCH_RUN = Table(optional={k: FIGURE for k in (
    "duration", "completed", "failed", "request_throughput", "output_throughput", "request_goodput", "errors",
    *[f"{m}_ms_p{p}" for m in ("ttft", "tpot", "itl", "e2el") for p in (50, 90, 99)])}, open=True)
BENCH_ROW = Table(required={"strategy": _said(_nonempty, "a strategy name"), "workload": _said(_nonempty, "a workload name")},
                  optional={"runs": ListOf(BENCH_RUN), **BENCH_RUN.optional}, open=True)
BENCH_RESULT = Table(
    required={"environment": Table(optional={k: OrNull(STR) for k in ("subject", "digest", "engine", "engine_version",
                                                                       "cuda", "gpu", "driver")}, open=True),
              "rows": ListOf(BENCH_ROW)},
    optional={"client": STR, "workload": Table(optional={"name": STR}, open=True),
              "slo": Table(optional={"ttft_ms": OrNull(_said(_in_range(0, 3.6e6, lo_open=True), "milliseconds above 0",
                                                             types=(int, float)))}, open=True),
              "failures": ListOf(Table(required={"strategy": STR, "why": STR}, open=True)),
              "lossless_threshold": FIGURE, "seconds": FIGURE},
    open=True)


# -- doctor --host: GPU records (nvidia-smi, --gpus-file, its own --json) and image configs -------------------
def _driver(value: str) -> str:
    if not re.fullmatch(r"[0-9]{2,4}(\.[0-9]{1,3}){1,2}", value, re.ASCII):
        raise ValueError("is not an NVIDIA driver version like 580.65.06")
    return value


def _compute_cap(value) -> int:
    text = str(value)
    m = re.fullmatch(r"([0-9]{1,2})\.([0-9])", text, re.ASCII) if not isinstance(value, int) else None
    arch = value if isinstance(value, int) else int(m[1]) * 10 + int(m[2]) if m else None
    if arch is None or not 30 <= arch <= 200:
        raise ValueError("is not a compute capability like 9.0 (3.0 to 20.0)")
    return arch


def _one_line(value: str) -> str:
    grammar.line(value)
    if not value.strip() or len(value) > 256:
        raise ValueError("is empty or longer than 256 characters")
    return value


GPU_RECORD = Table(required={"name": _said(_one_line, "a GPU name on one line"),
                             "driver": _said(_driver, "an NVIDIA driver version like 580.65.06"),
                             "compute_cap": _said(_compute_cap, 'a compute capability like "9.0"', types=(str, int, float))},
                   optional={"index": _count(0, 999, "a GPU index from 0 to 999"),
                             "brand": _said(grammar.line, "a product brand on one line")})
HOST_REPORT = Table(required={"gpus": ListOf(GPU_RECORD, nonempty=True)}, optional={"no_gpu": OrNull(STR)}, open=True)
# an image config as docker image inspect, an OCI config or skopeo print it: the keys --host reads
IMAGE_CONFIG = Table(optional={"Env": OrNull(ListOf(STR)), "Labels": OrNull(TableOf(STR))}, open=True)


def _device_code(value: str) -> str:
    if not re.fullmatch(r"(sm|compute)_[0-9]{2,3}[af]?|from-index", value, re.ASCII):
        raise ValueError("is not a device code like sm_90, sm_90a or compute_90")
    return value


DEVICE_CODE = _said(_device_code, "a device code like sm_90 or compute_90", "device codes like sm_90")
# io.builder.package.<name>.binaries: per binary of the wheel, the device code it carries
BINARIES = TableOf(Table(optional={"sass": ListOf(DEVICE_CODE), "ptx": ListOf(DEVICE_CODE)}, open=True))


def noun_of(value) -> str:
    """How a message names a value's type (JSON or TOML)."""
    return _TOML_NOUNS.get(type(value), type(value).__name__)


# -- the checker -------------------------------------------------------------------------------------------
_TOML_NOUNS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list", dict: "a table",
               type(None): "null"}


def did_you_mean(word: str, choices) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def check(file: str, data, shape, packages: tuple[str, ...] = ()) -> None:
    """Check parsed TOML against a shape: a UserError naming the file (when given), the key path and what was
    expected. `packages`: the names a PackageName may take (the engine data's)."""
    _Checker(file, packages).check(data, shape)


class _Checker:
    """A data file is code too: a wrong type or a typo in it is refused with the file, the key path and what was
    expected, before anything reads it."""

    def __init__(self, file: str, packages: tuple[str, ...]):
        self.file = file
        self.packages = packages

    def check(self, value, kind, path: str = "") -> None:
        match kind:
            case Table():
                self._table(value, kind, path)
            case TableOf():
                self._expect(isinstance(value, dict), value, kind, path)
                for key, item in value.items():
                    if kind.key is not None:
                        try:
                            kind.key.parse(key)
                        except ValueError as exc:
                            self._fail(path, f"key {_shown(key)} {exc}" + (
                                f"; expected {kind.key.noun}" if kind.key.say_expected else ""))
                    self.check(item, kind.value, _key_path(path, key))
            case ListOf():
                self._expect(isinstance(value, list), value, kind, path)
                if kind.nonempty and not value:
                    self._fail(path, f"expected {kind.noun}, got an empty list")
                for i, item in enumerate(value):
                    self.check(item, kind.item, f"{path}[{i}]")
            case Scalar():
                # TOML's true is no integer, though Python's bool is an int
                self._expect(isinstance(value, kind.types) and (bool in kind.types or not isinstance(value, bool)),
                             value, kind, path)
            case Parsed():
                self._expect(isinstance(value, kind.types) and not isinstance(value, bool), value, kind, path)
                try:
                    kind.parse(value)
                except ValueError as exc:
                    if kind.explain:  # the grammar's reason says what is wrong with the value
                        self._fail(path, f"{_shown(value)} {exc}" + (f"; expected {kind.noun}" if kind.say_expected else ""))
                    self._fail(path, f"{_shown(value)} is not {kind.noun}")
            case OneOf():
                self._expect(isinstance(value, str), value, kind, path)
                if kind.ref_prefix and value.startswith(kind.ref_prefix):
                    self._package(value, path, kind.ref_prefix)
                elif value not in kind.values:
                    self._fail(path, f"{value!r} is not {kind.noun}{did_you_mean(value, kind.values)}")
            case OrNull():
                if value is not None:
                    self.check(value, kind.kind, path)
            case AnyOf():
                fits = [k for k in kind.kinds if isinstance(value, _container(k))]
                self._expect(bool(fits), value, kind, path)
                self.check(value, fits[0], path)
            case PackageName():
                self._expect(isinstance(value, str), value, kind, path)
                self._package(value, path)
            case _:
                raise AssertionError(f"no check for schema type {kind!r}")

    def _table(self, value, table: Table, path: str) -> None:
        self._expect(isinstance(value, dict), value, table, path)
        allowed = table.keys
        for key in value:
            if key not in allowed and not table.open:
                self._fail(path, f"unknown key {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}")
        for key, kind in table.required.items():
            if key not in value:
                self._fail(path, f"missing key {key!r}: expected {kind.noun}")
        for key, item in value.items():
            if key in allowed:
                self.check(item, allowed[key], _key_path(path, key))
        for key, (other, when) in table.required_when.items():
            if value.get(other) == when and key not in value:
                self._fail(path, f"missing key {key!r}: expected {allowed[key].noun} when {other} is {when!r}")
        if table.exactly_one_of:
            given = [k for k in table.exactly_one_of if k in value]
            if len(given) != 1:
                self._fail(path, f"expected exactly one of {', '.join(table.exactly_one_of)}, got {' and '.join(given) or 'none'}")

    def _package(self, value: str, path: str, prefix: str = "") -> None:
        if value.removeprefix(prefix) not in self.packages:
            hint = did_you_mean(value, [prefix + p for p in self.packages])
            self._fail(path, f"{value!r} names no known package{hint}; known: {', '.join(self.packages)}")

    def _expect(self, ok: bool, value, kind, path: str) -> None:
        if not ok:
            got = _TOML_NOUNS.get(type(value), type(value).__name__)
            self._fail(path, f"expected {kind.noun}, got {got} {_shown(value)}")

    def _fail(self, path: str, problem: str):
        where = ": ".join(p for p in (self.file, path) if p)
        raise UserError(f"{where}: {problem}" if where else problem)


def _shown(value) -> str:
    """A value in a message: redacted, then cut (grammar.describe)."""
    return grammar.describe(value, 30)


def _container(kind) -> tuple[type, ...]:
    """The TOML types a kind's values have (what AnyOf chooses an alternative by)."""
    match kind:
        case Table() | TableOf():
            return (dict,)
        case ListOf():
            return (list,)
        case Scalar():
            return kind.types
        case Parsed():
            return kind.types
        case OrNull():
            return (*_container(kind.kind), type(None))
        case _:
            return (str,)


def _key_path(path: str, key: str) -> str:
    """`packages.vllm`, or `cuda."12.1"` for a key TOML must quote."""
    part = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'
    return f"{path}.{part}" if path else part
