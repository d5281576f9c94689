"""The shape of engine knowledge, as data: builder/data/engines.toml and every extra file a matrix names
(`defaults.knowledge`). engines.py checks each file against it, key by key, before any Recipe is built.

A type here is a description, not code that runs: `noun` is how messages spell the expectation
("a list of strings", "one of engine, kernels").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

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


VERSION = Parsed(Version, 'a version like "12.8"')
VERSION_RANGE = Parsed(SpecifierSet, 'a version range like ">=0.6,<0.7"')


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
    optional={"env": STR, "cmake": STR, "accepted": ARCHS, "threshold": INT},
    exactly_one_of=("env", "cmake"),  # the environment variable or the CMake define the knob sets
    required_when={"threshold": ("format", "switch-below")},
)

# A literal edit of one source file, when building against a torch in `when_torch` (any torch without it).
PATCH = Table(required={"file": STR, "replace": STR, "with": STR}, optional={"when_torch": VERSION_RANGE})

STRATEGY = Table(
    required={"versions": VERSION_RANGE, "why_not": STR, "flags": ListOf(STR)},
    # smoke: what the engine's parser must resolve the flags to (dotted attribute paths; a key with
    # "@resolved" is the engine's own name resolution), draft tokens per draft, the default drafter
    optional={"expect": TableOf(Scalar((str, int, bool), "a string, integer or boolean", "strings, integers or booleans")),
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
        "source_subdir": STR,
        "git_repository": STR,
        "git_tag": STR,
        "min_cuda": VERSION,
        "min_arch": INT,
        "min_cmake": VERSION,
        "build_requirements": STR,
        "build_requirements_list": ListOf(STR),
        "build_command": STR,
        "build_env": TableOf(STR),
        "arch_knobs": ListOf(KNOB),
        "builds_archs": Table(optional={"always": ARCHS, "switch": ARCHS}),
        "compile_threads_define": STR,
        "torch_pin": TORCH_PIN,
        "pin_extras": ListOf(STR),
        "companions": ListOf(PackageName()),
        "launch": ListOf(STR),
        "health": STR,
        "ready_log": STR,
        "metrics": ListOf(STR),
        # vLLM's setup.py splits $CMAKE_ARGS on whitespace from 0.12 on; unset, it ignores them
        "rust_toolchain": STR,
        "fetch_plan": BOOL,
        "patches": ListOf(PATCH),
        "smoke": SMOKE,
    },
)

PACKAGE = Table(
    required={
        "pypi": STR,
        "kind": OneOf(("engine", "kernels")),
        "template": STR,
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

CUDA = Table(required={"archs": ARCHS}, optional={"min_driver": STR})

BUILD_TOOLS = Table(required={"pip": ListOf(STR), "cmake": STR})

BUILT_IN = Table(required={"packages": TableOf(PACKAGE), "cuda": TableOf(CUDA), "build_tools": BUILD_TOOLS})

# An extra file adds to the built-in one: its packages and CUDA versions replace whole entries, its build_tools
# keys replace single keys, and any section may be left out.
EXTRA = Table(optional={
    "packages": TableOf(PACKAGE),
    "cuda": TableOf(CUDA),
    "build_tools": Table(optional=BUILD_TOOLS.required),
})
