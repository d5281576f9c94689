"""One validation language: the shapes of every data file builder reads, and the one checker (`check`).

  matrix.toml (MATRIX, with [defaults] as DEFAULTS and [defaults.cache] as CACHE), builder/data/defaults.toml
  (its [matrix] table is a DEFAULTS too), builder/data/engines.toml and every extra file a matrix names
  (BUILT_IN, EXTRA), and matrix.lock (LOCK). Each file is checked key by key before anything reads it; what only
  the engine data can judge (an engine's versions, strategy names) the reader checks after.
  The JSON files builder writes for itself are read through shapes too: the image ledger's entries
  (LEDGER_ENTRY, builder/image/ledger.py). The GPU-host route's carry spec is one too (CARRY_SPEC).

A type here is a description, not code that runs: `noun` is how messages spell the expectation
("a list of strings", "one of engine, kernels").
"""

from __future__ import annotations

import difflib
import json
import math
import re
import string
from datetime import date, datetime
from collections.abc import Callable
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import grammar, redact
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


def _name_value(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", value):
        raise ValueError("is not a NAME=VALUE string")
    return value


# an environment entry (an engine's --env, a sleep mode's variables)
NAME_VALUE = Parsed(_name_value, "a NAME=VALUE string", "NAME=VALUE strings", explain=True, say_expected=False)


def _json_object(value: str) -> str:
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError("is not JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError("is JSON but not an object ({...})")
    return value


# a request body the engine data gives as JSON text (a sleep mode's)
JSON_OBJECT = Parsed(_json_object, "a JSON object", "JSON objects", explain=True, say_expected=False)


def _long_flag(value: str) -> str:
    if not re.fullmatch(r"--[a-z][a-z0-9-]*", value, re.ASCII):
        raise ValueError("is not a long flag (--name: lower-case letters, digits, '-')")
    return value


def _http_path(value: str) -> str:
    if not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", value, re.ASCII):
        raise ValueError("is not an HTTP path (/health: '/' then letters, digits, '.', '_', '~', '-')")
    return value


def _engine_wait(value: int) -> int:
    if isinstance(value, bool) or not 0 < value <= 600:
        raise ValueError("is not a number of seconds from 1 to 600")
    return value


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

    @property
    def plural(self) -> str:
        return f"{'non-empty ' if self.nonempty else ''}lists of {self.item.plural}"


@dataclass(frozen=True)
class TableOf:
    """A table whose keys the file chooses (package names, CUDA versions, variables), all values of one type."""

    value: Scalar | Table
    key: Parsed | None = None  # the grammar of its keys, when they reach a Dockerfile

    @property
    def noun(self) -> str:
        return f"a table of {self.value.plural}"


@dataclass(frozen=True)
class Key:
    """One key of a Table: its shape and its meaning — what the key does and why a user would set it, one or two
    sentences. The reference (scripts/gen-reference) prints the meaning beside the shape, and tests/unit/project/test_docs.py
    fails naming every key of the matrix, [defaults], the engine data and matrix.lock that has none."""

    shape: object
    meaning: str


@dataclass(frozen=True)
class Table:
    """A table with fixed keys. A key's value is its shape, or a Key (its shape and its meaning): the Keys are
    taken apart once, so `required`, `optional` and `keys` hold shapes only and `meanings` the meanings."""

    required: dict[str, object] = field(default_factory=dict)
    optional: dict[str, object] = field(default_factory=dict)
    exactly_one_of: tuple[str, ...] = ()  # optional keys of which exactly one must be given
    required_when: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (other key, its value)
    open: bool = False  # other keys allowed: a file another program writes (a load generator's result)
    meanings: dict[str, str] = field(default_factory=dict)  # key -> its meaning (from the Keys given)

    noun = "a table"
    plural = "tables"

    def __post_init__(self):
        meanings = dict(self.meanings)
        for name in ("required", "optional"):
            shapes = {}
            for key, value in getattr(self, name).items():
                if isinstance(value, Key):
                    meanings[key] = value.meaning
                    value = value.shape
                shapes[key] = value
            object.__setattr__(self, name, shapes)
        object.__setattr__(self, "meanings", meanings)

    @property
    def keys(self) -> dict[str, object]:
        return {**self.required, **self.optional}

    def all_optional(self) -> "Table":
        """The same keys, each optional, with their meanings (an extra knowledge file's sections)."""
        return Table(optional=self.keys, meanings=self.meanings, open=self.open)


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
    required={"format": Key(OneOf(KNOB_FORMATS), "How the requested archs are spelled for this knob: torch \"8.0 9.0\", "
                            "cmake-real \"80-real;90-real\" (SASS only), semicolon \"80;90\", or switch-below (ON when any "
                            "requested arch is below `threshold`).")},
    optional={"env": Key(ENV_NAME, "The environment variable the build reads its arch list from (TORCH_CUDA_ARCH_LIST): "
                                   "set in the compile RUN, so only the requested archs are compiled."),
              "cmake": Key(ENV_NAME, "The CMake define the build reads its arch list from, passed as -D<name>=<value> "
                                     "(for builds that ignore the environment)."),
              "accepted": Key(ARCHS, "The archs the knob recognises: a requested arch outside it is served by the highest "
                                     "accepted one whose SASS runs on it, or refused (flash-attn has no 103: sm_100 runs there)."),
              "threshold": Key(INT, "For format switch-below: the arch below which the switch is ON (90 for "
                                    "ENABLE_BELOW_SM90).")},
    exactly_one_of=("env", "cmake"),  # the environment variable or the CMake define the knob sets
    required_when={"threshold": ("format", "switch-below")},
)

# A literal edit of one source file, when building against a torch in `when_torch` (any torch without it).
PATCH = Table(required={"file": Key(REL_PATH, "The file of the source tree (under source_subdir) to edit."),
                        "replace": Key(QUOTABLE, "The exact text to replace; the build fails when the file does not "
                                                 "hold it, so a patch that no longer applies is noticed."),
                        "with": Key(QUOTABLE, "The text that replaces it.")},
              optional={"when_torch": Key(VERSION_RANGE, "Apply only when the cell's torch is in this range (absent: "
                                                         "always); for a fix one torch release needs.")})

# the JIT modules a release (a rule) or a strategy builds at its first requests (names in the jit_modules table), per
# GPU family (archs: the compute capabilities on which the engine's own code selects it), with the upstream file and
# condition that select each; not_built: listed (its links are provided) but not built by smoke or a prebuild, and why
# (a strategy's entry may hold versions: the engine releases whose code selects it, the strategy's own range otherwise)
JIT_MODULE_USES = ListOf(Table(
    required={"module": Key(TOKEN, "A module of the jit_modules table that this release (or strategy) builds at its "
                                   "first requests."),
              "archs": Key(ARCHS, "The compute capabilities on which the engine's own code selects the module: smoke's "
                                  "JIT layer and a prebuild build it for the cell's archs among these."),
              "selected_by": Key(STR, "The upstream file and condition that select it, so a reader can check the claim "
                                      "against the engine's source.")},
    optional={"not_built": Key(STR, "Why smoke and a prebuild leave the module out although it is listed (its links are "
                                    "still provided in the runtime image)."),
              "versions": Key(VERSION_RANGE, "In a strategy's list: the engine releases whose code selects it (absent: "
                                             "every release the strategy runs on).")}))

STRATEGY = Table(
    required={"versions": Key(VERSION_RANGE, "The engine releases that can run the strategy; a cell outside them is "
                                             "refused with why_not when the profile asks for it."),
              "why_not": Key(STR, "Why releases outside `versions` cannot run it: the message plan and smoke give."),
              "flags": Key(ListOf(STR), "The engine's real command-line flags for the strategy ({model}, {drafter} "
                                        "filled in): what smoke, bench and serve pass.")},
    optional={"env": Key(TableOf(ENV_VALUE, key=ENV_NAME), "The environment the engine runs under for this strategy "
                                                           "(VLLM_USE_V2_MODEL_RUNNER=1), set by smoke, bench and serve."),
              "forbid_log": Key(ListOf(STR), "Log lines that mean the strategy did not take effect (a silent fallback): "
                                             "smoke fails the boot when the engine's log holds one."),
              "expect": Key(TableOf(Scalar((str, int, bool), "a string, integer or boolean", "strings, integers or booleans")),
                            "What smoke L2 requires the engine's own parser to resolve the flags to: dotted attribute "
                            "paths to values (a key with \"@resolved\" goes through the engine's name resolution)."),
              "k": Key(INT, "Draft tokens per draft: smoke L3 checks draft tokens = drafts x k on the engine's "
                            "counters."),
              "drafter": Key(STR, "The default draft checkpoint ({drafter} in the flags) when --drafter is not given."),
              "cold_boot_s": Key(INT, "A cold boot's seconds under this strategy as measured (every compile cache "
                                      "empty): the stated boot budget `builder serve` gives an image that records "
                                      "no boot of its own, so a first boot that compiles is not killed mid-way."),
              "jit_modules": Key(JIT_MODULE_USES, "JIT modules only this strategy's code selects (DFlash2's top-k): "
                                                  "cells with the strategy build them too.")},
)

# What smoke needs to run an engine version (builder/deploy/smoke/): how it serves, how its own parser is reached,
# and which counters prove speculative decoding ran. Rules merge this table key by key.
SMOKE = Table(optional={
    "serve_args": Key(ListOf(STR), "The arguments that make the launch line listen ({host} {port}); smoke, bench and "
                                   "serve append them."),
    "dummy_load": Key(ListOf(STR), "The flags that load a checkpoint without its weights (random weights), so smoke "
                                   "boots the generated tiny model."),
    "tiny_args": Key(ListOf(STR), "The flags for the generated tiny model: a small context and little memory."),
    "completions": Key(STR, "The OpenAI completions path smoke L3 and bench send requests to (default "
                            "/v1/completions)."),
    "server_info": Key(STR, "A path echoing the resolved server arguments: smoke and bench read the speculative "
                            "settings the engine really runs with from it."),
    "args_class": Key(STR, "module:Class with add_cli_args(parser) and from_cli_args(namespace): smoke L2 parses the "
                           "strategy's flags with the engine's own code, without a GPU."),
    "parser": Key(ListOf(STR), "module:Parser factories for that parse; the first importable one is used (the class "
                               "moved between releases)."),
    "model_flag": Key(STR, "The flag that names the model in smoke L2's parse (--model, --model-path)."),
    "cpu_env": Key(TableOf(STR), "The environment the engine's parser needs on a host without a GPU "
                                 "(VLLM_TARGET_DEVICE=cpu)."),
    "name_resolver": Key(Table(required={
        "attr": Key(STR, "The parsed argument whose value the engine resolves by name (speculative_algorithm)."),
        "call": Key(STR, "module:callable the engine resolves it with; smoke reads the result's name as "
                         "\"<attr>@resolved\".")}),
        "The engine's own resolution of an argument's value, so `expect` can check what the engine makes of a name."),
    "spec_metrics": Key(Table(optional={
        "drafts": Key(STR, "The /metrics counter of drafts made."),
        "draft_tokens": Key(STR, "The /metrics counter of draft tokens proposed."),
        "accepted": Key(STR, "The /metrics counter of draft tokens accepted."),
        "accept_length": Key(STR, "The /metrics gauge of the mean accepted length (SGLang).")}),
        "The engine's counters that prove speculative decoding ran: smoke L3 and bench read their deltas around "
        "the requests."),
    "imports": Key(ListOf(STR), "More modules smoke L1 imports in the image (besides serve_modules): a missing "
                                "library fails there, not at the first request."),
    "jit_tools": Key(ListOf(STR), "Programs the engine's run-time kernel compilation calls (nvcc, ninja): smoke checks "
                                  "each is on PATH in the image."),
    "sleep": Key(Table(required={
        "flag": Key(STR, "The launch flag that turns the sleep mode on (--enable-sleep-mode)."),
        "path": Key(STR, "The POST path that puts it to sleep, releasing its GPU memory (/sleep?level=1)."),
        "wake": Key(STR, "The POST path that wakes it (/wake_up).")},
        optional={"env": Key(ListOf(NAME_VALUE),
                             "What the engine's environment needs for those paths to exist (vLLM: "
                             "VLLM_SERVER_DEV_MODE=1)."),
                  "body": Key(JSON_OBJECT, "The JSON object both POSTs send (SGLang: {\"tags\": [\"kv_cache\"]}, "
                                           "what to release and take back); none: an empty POST.")}),
        "The engine's sleep mode: builder snapshot puts it to sleep before the checkpoint (the KV cache released, "
        "so the GPU state copied is small) and wakes it after a restore."),
})

# where the torch pin comes from: the package's own metadata, the engine that pins the package, no torch, or
# the metadata of another package ("via:vllm": SGLang 0.3.x runs on the vLLM it pins)
TORCH_PIN = OneOf(("metadata", "consumer", "none"), ref_prefix="via:")

# One CMake option of a package that builds one of its arch-scoped binaries at all (sglang-kernel's
# SGL_KERNEL_ENABLE_FA3 and flash_ops).
BINARY_SWITCH = Table(required={
    "files": Key(QUOTABLE, "The binary's glob inside the wheel: the same string as its arch_scoped entry, which says "
                           "which GPUs load it."),
    "cmake": Key(ENV_NAME, "The CMake option; NAME=OFF leaves the binary's target out of the build."),
    "why": Key(STR, "What the option builds, and where the CMake says so."),
})

# Every rule whose `versions` contains the version applies, in file order; later rules override keys.
def _warm_glob(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._*?\[\]/-]+", value, re.ASCII) or value.startswith("/") or ".." in value.split("/"):
        raise ValueError("is not a relative glob of letters, digits, . _ - / * ? [ ]")
    return value


RULE = Table(
    required={"versions": Key(VERSION_RANGE, "The package versions this rule applies to; every matching rule applies, "
                                             "in file order, later ones overriding keys of earlier ones.")},
    optional={
        "source": Key(OneOf(("sdist", "git", "local")), "Where the build takes the source: the release's sdist from "
                                                        "the index, a git tag (git_repository, git_tag), or a local tree."),
        "source_subdir": Key(SUBDIR, "The directory of the source tree the package builds in (a monorepo's "
                                     "sgl-kernel/); the build's WORKDIR."),
        "tag_subdirs": Key(TableOf(SUBDIR, key=TOKEN),
                           "source_subdir at the named tags of the git source, where the tree kept the package "
                           "elsewhere at that tag (a monorepo that moved it): tag = directory."),
        "git_repository": Key(GIT_URL, "The repository a git source is fetched from; `builder lock` pins the tag's "
                                       "commit in matrix.lock."),
        "git_tag": Key(TOKEN, "The tag of a git source ({version} filled in) that `builder lock` resolves to a commit."),
        "min_cuda": Key(VERSION, "The oldest CUDA the version builds with: a cell with an older CUDA is refused at plan."),
        "min_arch": Key(INT, "The oldest SM arch the version supports: a requested arch below it is refused at plan."),
        "min_cmake": Key(VERSION, "The oldest CMake its build accepts, as a record beside build_tools.cmake (no verb "
                                  "checks it yet)."),
        "min_gcc": Key(VERSION, "The oldest GCC its build accepts: plan, build and doctor check it against the devel "
                                "base's compiler (base_os) and refuse an older one before compiling."),
        "build_requirements": Key(ListOf(REL_PATH), "Requirements files of the source tree the build installs first, "
                                                    "in this order; part of the wheel's cache key."),
        "build_requirements_list": Key(ListOf(QUOTABLE), "Requirement lines the build installs besides those files "
                                                         "(a build dependency upstream forgets)."),
        "build_command": Key(LINE, "The command that builds the wheel in the source directory, run under sccache; "
                                   "part of the cache key."),
        "build_env": Key(TableOf(ENV_VALUE, key=ENV_NAME), "Environment variables of the compile RUN (besides the arch "
                                                           "knobs); part of the cache key."),
        "arch_knobs": Key(ListOf(KNOB), "The switches that select GPU archs for this build, and how each spells the "
                                        "requested archs: what makes --arch real."),
        "builds_archs": Key(Table(optional={
            "always": Key(ARCHS, "Archs the build compiles whatever is requested (a hard-coded list)."),
            "switch": Key(ARCHS, "Archs added when a switch-below knob is ON.")}),
            "For a build that ignores the requested archs: what it really compiles, so plan, the audit and the cache "
            "key say the truth."),
        "compile_threads_define": Key(ENV_NAME, "The CMake define that takes NVCC_THREADS (for builds that read their "
                                                "nvcc --threads from CMake, not the environment)."),
        "torch_pin": Key(TORCH_PIN, "Where this version's torch pin comes from (overrides the package's torch_pin for "
                                    "these versions)."),
        "pin_extras": Key(ListOf(STR), "Extras whose requirements `builder lock` reads from the metadata when it looks "
                                       "for the torch and companion pins (sglang[srt] pins torch only there)."),
        "companions": Key(ListOf(PackageName()), "Packages of the engine data this version runs with and builds in the "
                                                 "same image, at the versions its metadata pins (sglang-kernel)."),
        "launch": Key(ListOf(STR), "The command that serves the engine ({model} filled in): the image's ENTRYPOINT and "
                                   "what smoke L3, bench and serve start."),
        "health": Key(STR, "The HTTP path that answers 200 once the engine is ready: smoke and bench wait for it, "
                           "serve prints it."),
        "tp_flag": Key(_grammar(_long_flag,
                                "a long flag like --tensor-parallel-size"),
                       "The engine's own tensor-parallel flag, given the number of GPUs one engine shards the model "
                       "over: `--tp N` of smoke, bench and serve adds it to the launch line (N > 1) and asks N GPUs; "
                       "an engine without it is refused --tp."),
        "ready_path": Key(_grammar(_http_path, "an HTTP path like /health"),
                          "The HTTP path that answers 200 only once the engine serves requests, its own warm-up done: "
                          "serve's startup and readiness probes and docker health check ask it (default /v1/models, "
                          "which vLLM answers only once the model is loaded; SGLang answers it before its warm-up "
                          "request has run)."),
        "health_wait_s": Key(Parsed(_engine_wait, "a number of seconds from 1 to 600", explain=True, say_expected=False,
                                    types=(int,)),
                             "The longest the engine itself takes to answer its health or ready path (SGLang's "
                             "/health and /health_generate run a one-token generation for up to 20 s): serve sets "
                             "those probes' timeouts above it, so the engine's own answer decides, not the probe's "
                             "timeout."),
        "shutdown_flag": Key(_grammar(_long_flag, "a long flag like --shutdown-timeout"),
                             "The engine's own flag bounding how long it lets in-flight requests finish after SIGTERM "
                             "(vLLM >= 0.18: --shutdown-timeout SECONDS, 0 aborts them): serve passes its "
                             "--drain-timeout there and sets the pod's terminationGracePeriodSeconds and docker's "
                             "--stop-timeout above it."),
        "ready_log": Key(STR, "The engine's own log line saying it is ready: smoke L3 fails the boot when health "
                              "answers but the line never comes."),
        "metrics": Key(ListOf(STR), "The engine's speculative-decoding counters on /metrics, as a record (smoke and bench "
                                    "read the names in smoke.spec_metrics)."),
        "rust_toolchain": Key(TOKEN, "A Rust toolchain the build needs, installed in its build stage (when no fetch "
                                     "plan supplies one); part of the cache key."),
        "fetch_plan": Key(BOOL, "The build's CMake downloads sources at configure time: builder reads what it fetches "
                                "(data/fetchplans/) and fetches it in a stage of its own, so the compile runs without "
                                "network."),
        "patches": Key(ListOf(PATCH), "Literal edits of source files before the build, for upstream bugs the pinned "
                                      "release has; part of the cache key."),
        "source_remove": Key(ListOf(REL_PATH), "Paths of the source tree the build leaves out (why: in the data); the "
                                               "build stops when one is gone, as the data is then out of date."),
        "source_version": Key(_grammar(_version_file, "a relative path to a pyproject.toml or a .py file"),
                              "The file (under source_subdir) naming the source's version, a pyproject.toml or a .py "
                              "with __version__: the source stage refuses a tree of another version than the pin."),
        "resolve_as_of": Key(UTC_TIME, "The release's upload time (UTC): the first resolve of the cell's build and "
                                       "runtime requirements takes only files uploaded before it, so a later release of "
                                       "a dependency cannot break an old engine."),
        "resolve_as_of_exempt": Key(ListOf(PIN), "Exact pins the first resolve takes although uploaded later (their "
                                                 "era's files are gone from the index)."),
        "setuptools_scm": Key(BOOL, "The source takes its version from git through setuptools-scm: the build sets "
                                    "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<NAME> to the pinned version."),
        "git_submodules": Key(ListOf(REL_PATH), "Submodules the build reads, fetched at the commit's gitlinks."),
        "companion_versions": Key(TableOf(PIN_VERSION_DATA, key=PACKAGE_KEY),
                                  "Companions the package's metadata does not pin, with the version it needs."),
        "install_extras": Key(ListOf(TOKEN), "Extras the runtime installs the engine with (sglang[srt])."),
        "serve_modules": Key(ListOf(TOKEN), "Modules serving imports: smoke L1 imports each in the image."),
        "stray_files": Key(ListOf(REL_PATH), "Site-packages files that dependencies ship by mistake and nothing imports "
                                             "(why: in the data): the runtime removes them after the install, and the "
                                             "check that no path is installed twice leaves them out."),
        "arch_sources": Key(ListOf(REL_PATH), "Site-packages directories of per-arch sources its JIT reads only when "
                                              "compiling for that arch (why: in the data): the runtime removes the "
                                              "files and directories in them named for a GPU generation newer than "
                                              "the cell's newest arch."),
        "runtime_jit": Key(BOOL, "The engine compiles kernels at run time: the runtime image gets the CUDA table's "
                                 "runtime_jit (nvcc, headers, ninja, a C++ compiler)."),
        "runtime_checks": Key(ListOf(QUOTABLE), "Python statements the image must run without error (smoke L1): that "
                                                "a fast kernel path is really on, say."),
        "serve_jit": Key(ListOf(TOKEN), "What the version compiles at its first request (names in the serve_jit table): "
                                        "the runtime image gets what each needs and smoke's JIT layer probes it."),
        "jit_modules": Key(JIT_MODULE_USES, "The JIT modules the version builds at its first requests (names in the "
                                            "jit_modules table), per GPU family: their link libraries go into the "
                                            "runtime, smoke builds them, and jit = \"prebuilt\" builds them into the image."),
        "compile_caches": Key(ListOf(TOKEN), "The compile caches the version fills at its first boot and requests (names "
                                             "in the compile_caches table): the runtime image points each at its "
                                             "directory under jit_cache_root, and `builder warm` captures that root."),
        "warm_allowance": Key(ListOf(Table(
            required={"glob": Key(_grammar(_warm_glob, "a glob like triton/*/kernel_name.* (relative to the cache root)"),
                                  "Files under the cache root (fnmatch: * crosses /) a boot from a warm layer may "
                                  "still write."),
                      "why": Key(STR, "Why a warm boot writes them, with the evidence.")})),
            "What a boot from a warm layer may still write under the cache root: smoke L3 of a warm image fails, "
            "naming them, when the boot writes anything else."),
        "jit_paths": Key(ListOf(Table(
            required={"path": Key(STR, "The JIT path: what the engine compiles and where in its code.")},
            optional={"covered_by": Key(TOKEN, "What in smoke's JIT layer covers it: \"serve_jit.<name>\" or "
                                               "\"jit_modules\"."),
                      "not_covered": Key(STR, "Why no smoke layer covers it.")},
            exactly_one_of=("covered_by", "not_covered"))),
            "Every JIT path the version can take at its first requests, covered by smoke's JIT layer or not with the "
            "reason: the list a reviewer checks against the engine's code."),
        "smoke": Key(SMOKE, "What smoke needs to run this version: how it serves, how its parser is reached, which "
                            "counters prove speculation ran; rules merge it key by key."),
        "fetch_overrides": Key(TableOf(OneOf(("fetchcontent",)), key=TOKEN),
                               "FetchContent sources whose override is CMake's FETCHCONTENT_SOURCE_DIR_<NAME> rather "
                               "than the engine's own variable (where the engine's variable takes another branch)."),
        "builds_extra_sass": Key(ListOf(Table(
            required={"min_cuda": Key(VERSION, "The CUDA from which this set applies."),
                      "sass": Key(ListOf(SASS_NAME), "The SASS built whatever the knobs say (sm_90a).")})),
            "SASS the build emits whatever the knobs say, by CUDA version (complete sets, the highest min_cuda <= the "
            "cell's CUDA applies): plan and the audit expect it."),
        "arch_select": Key(OneOf(("gencode-filter",)), "For a build that hard-codes its gencode lists: builder's nvcc "
                                                       "launcher filters them per CMake target, so --arch is honoured."),
        "holds": Key(ListOf(OneOf(("pure Python", "CUDA kernels", "C++ against torch", "Rust", "Rust (vllm-rs)"))),
                     "What kinds of binaries the wheel holds: plan and the image labels say it."),
        "bound_to": Key(ListOf(STR), "What those binaries only load with (torch, CUDA, CPython ABI3): plan and the "
                                     "labels say it, with the cell's versions filled in."),
        "binaries": Key(ListOf(Table(required={
            "files": Key(QUOTABLE, "A glob of the binary inside the wheel (the same string as its arch_scoped entry)."),
            "target": Key(CMAKE_TARGET, "The CMake target that makes it (what the gencode filter selects by).")},
            optional={
            "sass": Key(ListOf(SASS_NAME), "The SASS targets upstream builds it for."),
            "units": Key(INT, "Kernels per SASS target (fatbin entries per arch)."),
            "cmake_archs": Key(ListOf(ListOf(CMAKE_ARCH)), "Where the engine's CMake picks the target's archs itself "
                                                           "(cmake_archs below): the target's CMake arch lists, each "
                                                           "intersected with the build's archs, the results joined."),
            "pick": Key(OneOf(("all", "first")), "\"first\": only the first list that selects anything is compiled "
                                                 "(qutlass.cmake: one family per build), and the audit asks the binary "
                                                 "for that family's GPUs only."),
            "source": Key(STR, "The upstream file:lines the lists were read from.")},
            exactly_one_of=("sass", "cmake_archs"))),
            "What each binary of the release holds upstream and which target makes it: plan predicts the audit of a "
            "build for the requested archs from it, and rehearse projects compile time."),
        "binaries_cuda": Key(VERSION, "The CUDA release those binaries were read from: the prediction applies to cells "
                                      "of that CUDA only."),
        "arch_scoped": Key(ListOf(Table(
            required={"files": Key(QUOTABLE, "A glob of the binaries inside the wheel."),
                      "why": Key(STR, "Why they are built for some archs only (upstream's reason).")},
            optional={"archs": Key(ARCHS, "The archs they carry code for."),
                      "all_but": Key(ARCHS, "Loaded on every GPU except these (a copy another file replaces there).")},
            exactly_one_of=("archs", "all_but"))),
            "Binaries built for some arch families only, by design: the audit asks them for these archs only instead "
            "of failing the wheel."),
        "cmake_archs": Key(Table(
            required={"rule": Key(OneOf(("cuda_archs_loose_intersection",)), "The engine's own arch filter, ported "
                                  "step by step (builder/archs.py)."),
                      "supported": Key(ListOf(Table(
                          required={"min_cuda": Key(VERSION, "The nvcc release from which this list applies."),
                                    "archs": Key(ListOf(CMAKE_ARCH), "CUDA_SUPPORTED_ARCHS for that nvcc.")},
                          optional={"source": Key(STR, "The upstream file:line it was read from.")})),
                          "The engine's supported arch list per nvcc range (complete lists, the highest min_cuda <= the "
                          "cell's CUDA applies).")},
            optional={"source": Key(STR, "The upstream file:lines of the rule.")}),
            "The engine's CMake filters the requested archs itself before any target sees them (vLLM: CUDA_ARCHS = "
            "cuda_archs_loose_intersection(CUDA_SUPPORTED_ARCHS, torch's archs)): the knobs are given what it keeps, "
            "and plan's SASS and the cache key follow it (10.3 → 10.0 with nvcc 13.0)."),
        "binary_switches": Key(ListOf(BINARY_SWITCH), "CMake options that build one arch-scoped binary at all: when no "
                                                      "requested GPU loads that binary the build passes the option OFF "
                                                      "(plan shows it among the knobs) and neither compiles nor expects "
                                                      "the binary (sglang-kernel's SGL_KERNEL_ENABLE_FA3)."),
    },
)

PACKAGE = Table(
    required={
        "pypi": Key(PYPI_NAME, "The project's name on the index: lock reads its metadata and sdist there, and a "
                               "source = \"index\" cell takes its wheel there."),
        "kind": Key(OneOf(("engine", "kernels")), "An engine is served (a cell's image is named after it); kernels "
                                                  "are a library an engine runs with (flash-attn, sglang-kernel)."),
        "template": Key(TEMPLATE, "The Dockerfile template of dockerfiles/packages/ that builds it."),
        "torch_pin": Key(TORCH_PIN, "Where the torch pin comes from: its own metadata, the engine that pins the "
                                    "package (consumer), none, or another package's metadata (via:<package>)."),
        "mem_gb_per_nvcc_thread": Key(NUMBER, "Memory one nvcc thread of its compile takes (GB): the build chooses "
                                              "MAX_JOBS and NVCC_THREADS so the host does not run out; 0 for no compile."),
        "rules": Key(ListOf(RULE), "The facts per version range: every rule whose range holds the version applies."),
    },
    optional={
        "parallelism": Key(OneOf(("total-threads", "jobs-x-threads")),
                           "What MAX_JOBS counts in its build: every nvcc thread (total-threads) or processes of "
                           "NVCC_THREADS threads each (jobs-x-threads); decides how the two are chosen."),
        "compiled": Key(BOOL, "Whether the package compiles GPU code: a pure-Python package has no archs to select, "
                              "audit or time."),
        "strategies": Key(TableOf(STRATEGY), "The speculative-decoding strategies (MTP2, DFlash2) this engine can run, "
                                             "by name, with their real flags per version."),
    },
)

# runtime_jit: what an engine that compiles kernels at run time needs in its runtime image for this CUDA
RUNTIME_JIT = Table(required={
    "pip": Key(ListOf(QUOTABLE), "Requirements installed in the runtime (the CUDA toolkit's nvcc wheels, ninja)."),
    "apt": Key(ListOf(TOKEN), "Distribution packages installed in the runtime (g++)."),
    "root": Key(REL_PATH, "The toolkit directory under site-packages that becomes CUDA_HOME in the image.")})
def _nvcc_flag(value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9_-]*(=[A-Za-z0-9._,-]+)?", value, re.ASCII):
        raise ValueError("is not an nvcc option like -objtemp")
    return value


CUDA = Table(
    required={"archs": Key(ARCHS, "The SM archs this CUDA's nvcc can emit (nvcc --list-gpu-arch): --arch outside them "
                                  "is refused at plan for cells of this CUDA.")},
    optional={"min_driver": Key(STR, "The oldest NVIDIA driver this CUDA's runtime needs, as a record beside "
                                     "data/host.toml (which doctor --host reads)."),
              "runtime_jit": Key(RUNTIME_JIT, "What an engine that compiles kernels at run time (a rule's runtime_jit) "
                                              "needs in its runtime image for this CUDA."),
              "nvcc_append_flags": Key(ListOf(_grammar(_nvcc_flag, "an nvcc option like -objtemp")),
                                       "nvcc options every compile of the build takes (NVCC_APPEND_FLAGS): -objtemp "
                                       "makes objects reproducible; part of the cache key.")})

BUILD_TOOLS = Table(required={
    "pip": Key(ListOf(PIN), "The exact build tools every build stage installs (pip, setuptools, ninja ...); part of the "
                            "cache key, so a new tool version rebuilds."),
    "cmake": Key(PIN, "The exact CMake every build stage installs; part of the cache key.")})

# serve_jit: one compile an engine does at its first request, what the runtime image needs for it and why
SERVE_JIT = Table(
    required={"why": Key(STR, "What the engine compiles at its first request and why it needs these, with the evidence."),
              "probe": Key(OneOf(("triton", "nvcc-libcuda", "python-c")),
                           "The compile smoke's JIT layer runs inside the image without a GPU to prove the path works.")},
    optional={"apt": Key(ListOf(TOKEN), "Distribution packages the runtime installs for it ({python}: the cell's "
                                        "Python, python{python}-dev)."),
              "libcuda_stub": Key(BOOL, "Give the runtime a link stub for libcuda, so the link does not depend on the "
                                        "container runtime providing libcuda.so."),
              "needs_runtime_jit": Key(BOOL, "The path needs the CUDA table's runtime_jit (nvcc and headers) in the "
                                             "runtime.")})

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
_cache_subdir = _matching(r"[A-Za-z0-9_][A-Za-z0-9._-]*", "is not a plain directory name")
_abs_dir = _matching(r"(/[A-Za-z0-9._-]+)+", "is not an absolute directory path without spaces or shell characters")


# compile_caches: one compile cache an engine fills at its first boot, where the image puts it and what its key holds
COMPILE_CACHE = Table(
    required={"env": Key(ENV_NAME, "The variable naming the cache's directory: the runtime image sets it to "
                                   "<jit_cache_root>/<subdir>."),
              "subdir": Key(_grammar(_cache_subdir, "a directory name like triton"),
                            "The cache's directory under the image's cache root."),
              "holds": Key(STR, "What the engine writes there."),
              "key": Key(STR, "What the cache's key holds (GPU arch, versions, model config, absolute paths): why a "
                              "cache captured on one host or at one path is found on another, or not."),
              "source": Key(STR, "The upstream file that names the variable and computes the key, for a reader to "
                                 "check.")})

# jit_frameworks: how a JIT framework's module generators are driven (the environment variables of its arch list and
# JIT cache, the method that compiles and links) and what every module of it links; jit_modules: one generator each
LIBRARIES = ListOf(_grammar(_library, "a library name like nvrtc", "library names like nvrtc or cublasLt"))
JIT_FRAMEWORK = Table(
    required={"why": Key(STR, "How the framework JIT-builds its modules (the upstream files), the evidence for the "
                              "rest of the entry."),
              "links": Key(LIBRARIES, "Libraries every module of the framework links: the runtime image gets an "
                                      "unversioned link beside each (libnvrtc.so), or `ld: cannot find -lnvrtc`."),
              "cache_env": Key(ENV_NAME, "The variable naming the framework's JIT cache: a prebuilt image points it "
                                         "at <jit_cache_root>/<cache_subdir>."),
              "cache_subdir": Key(_grammar(grammar.identifier, "a directory name like flashinfer"),
                                  "The framework's directory under the image's JIT cache root.")},
    optional={"arch_env": Key(ENV_NAME, "The environment variable holding the arch list the generators build for "
                                        "(\"8.0 9.0\"): smoke and a prebuild set it to the cell's archs."),
              "arch_context": Key(_grammar(_generator, "module:function, like "
                                           "sglang.kernels.jit.utils.arch:override_jit_cuda_arch"),
                                  "For a framework that reads no environment: a context manager called with (major, "
                                  "minor) that sets the one target of the process."),
              "arch_scope": Key(OneOf(("set", "device")),
                                "set: the framework names its cache directory after the whole arch set (FlashInfer's "
                                "80_90a), so a prebuilt image pins the list to the cell's archs and builds once; device: "
                                "each process builds for its own GPU, so a prebuild builds each module per arch."),
              "build": Key(_grammar(grammar.identifier, "a method name like build"),
                           "The method of the generator's result that compiles and links; absent when calling the "
                           "generator (a loader) compiles, links and loads the module itself."),
              "answer_gpu": Key(ListOf(_grammar(_generator, "module:attribute")),
                                "Functions the module's flags depend on that ask whether a GPU is present: a build "
                                "without one (smoke, a prebuild) answers True, so the module is keyed and compiled as "
                                "the GPU's process keys it.")},
    exactly_one_of=("arch_env", "arch_context"))
_DOTTED = _grammar(_matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", "is not module.attribute"),
                   "a dotted name like torch.bfloat16")
JIT_MODULE = Table(
    required={"framework": Key(TOKEN, "The jit_frameworks entry that drives its generator."),
              "links": Key(LIBRARIES, "Libraries its own link line adds to the framework's: the runtime gets a link "
                                      "for each."),
              "defined_in": Key(STR, "The upstream file that defines the generator, for a reader to check."),
              "generator": Key(_grammar(_generator, "module:function, like flashinfer.jit.sampling:gen_sampling_module"),
                               "The module:function smoke and a prebuild call to build the module.")},
    optional={"kwargs": Key(TableOf(AnyOf((STR, BOOL, INT)), key=_grammar(grammar.identifier, "an argument name")),
                            "The generator's keyword arguments (the variant the engine really builds)."),
              "objects": Key(TableOf(_DOTTED, key=_grammar(grammar.identifier, "an argument name")),
                             "Keyword arguments whose values are Python objects, named module.attribute "
                             "(torch.bfloat16)."),
              "downloads": Key(STR, "What the generator fetches over the network when it runs, and from where: plan "
                                    "says it, since an image that builds it at run time needs that network.")})

# the system compiler of a base OS's devel image (its distribution's default gcc): checked against min_gcc
BASE_OS = Table(required={"gcc": Key(VERSION, "The default GCC of this OS's devel image: a rule's min_gcc is checked "
                                              "against it before anything compiles.")})

# index_wheels: the device code of a file an index publishes, per binary, as `builder audit` read it from the
# real file (keyed by its sha256): what `plan` predicts a `source = "auto"` choice with before any download
def _device_code_name(value: str) -> str:
    if not re.fullmatch(r"(sm|compute)_\d{2,3}[af]?", value):
        raise ValueError("write sm_90, sm_90a, sm_100f or compute_80")
    return value


INDEX_WHEEL = Table(
    required={"file": Key(_grammar(grammar.filename, "a plain file name"), "The wheel's file name on the index."),
              "package": Key(STR, "name==version of the release the file belongs to."),
              "cuda": Key(STR, "The CUDA runtime majors its binaries need (libcudart.so.N), \"\" for none: auto "
                               "refuses the file for a cell of another CUDA."),
              "binaries": Key(TableOf(ListOf(_grammar(_device_code_name, "a SASS or PTX name",
                                                      "SASS or PTX names like sm_90a or compute_80"))),
                              "Per binary of the wheel, the SASS and PTX it carries: plan predicts whether the file "
                              "covers the requested archs without downloading it.")},
    optional={"read": Key(STR, "How and when these facts were read (builder audit of the PyPI file, a date).")})
INDEX_WHEEL_KEY = _grammar(grammar.sha256, "a sha256 (64 lowercase hex digits)")

BUILT_IN = Table(
    required={"packages": Key(TableOf(PACKAGE, key=PACKAGE_KEY), "Every package builder builds, by name: engines and "
                                                                  "the kernels they run with."),
              "cuda": Key(TableOf(CUDA, key=CUDA_KEY), "Per CUDA major.minor: the archs its nvcc emits, its driver, what "
                                                       "run-time compiles need, nvcc's extra flags."),
              "build_tools": Key(BUILD_TOOLS, "The exact build tools every build stage installs.")},
    optional={"serve_jit": Key(TableOf(SERVE_JIT, key=TOKEN), "The compiles engines do at their first request, by "
                                                              "name: what the runtime image needs for each and how smoke "
                                                              "probes it."),
              "base_os": Key(TableOf(BASE_OS, key=TOKEN), "Per OS tag (ubuntu24.04): facts of its devel image, checked "
                                                          "against the rules' min_gcc."),
              "index_wheels": Key(TableOf(INDEX_WHEEL, key=INDEX_WHEEL_KEY),
                                  "Per published file (by sha256): its device code as builder audit read it, so plan "
                                  "predicts a source = \"auto\" choice before any download."),
              "jit_frameworks": Key(TableOf(JIT_FRAMEWORK, key=TOKEN), "How each JIT framework's module generators are "
                                                                       "driven and what its modules link."),
              "jit_modules": Key(TableOf(JIT_MODULE, key=TOKEN), "The JIT modules engines build at their first "
                                                                 "requests, one generator each; rules name them."),
              "compile_caches": Key(TableOf(COMPILE_CACHE, key=TOKEN), "Every compile cache engines fill at their "
                                                                       "first boot, by name: its variable, its directory "
                                                                       "under jit_cache_root, what its key holds."),
              "warm_keys": Key(Table(optional={
                  "keys": Key(ListOf(Table(open=True)), "Per compile cache and engine version range: the parts its key "
                                                       "holds, each with the upstream line that says so."),
                  "flags": Key(ListOf(Table(open=True)), "Per engine version range: which launch flag feeds which key "
                                                        "part, and the flags that reach no key.")}),
                               "What the compile caches of an engine this file adds are keyed on, as builder/data/"
                               "warmkeys.toml says it for vLLM and SGLang ([[keys]], [[flags]]): the warm judge reads "
                               "them to say whether a warm layer holds for a serve."),
              "jit_cache_root": Key(_grammar(_abs_dir, "an absolute directory like /opt/jit-cache"),
                                    "The image's one directory for its JIT and compile caches: prebuilt modules (jit "
                                    "= \"prebuilt\") and every compile cache of the engine (compile_caches), each a "
                                    "subdirectory; a warm layer holds exactly what a boot wrote there.")})

# An extra file adds to the built-in one: its packages and CUDA versions replace whole entries, its build_tools
# keys replace single keys, and any section may be left out.
EXTRA = Table(optional={**BUILT_IN.keys, "build_tools": BUILD_TOOLS.all_optional()}, meanings=BUILT_IN.meanings)


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
LOCK_GIT = Table(required={"repository": Key(GIT_URL, "The repository the source is fetched from."),
                            "tag": Key(TOKEN, "The tag the engine data names for this version."),
                            "commit": Key(COMMIT, "The commit the tag named when locked: builds fetch this commit, so "
                                                  "a moved tag changes nothing (\"\" while unresolved).")},
                  optional={"unresolved": Key(STR, "Why the tag could not be resolved (the git host's answer); "
                                                   "a build refuses the unpinned source unless --allow-unpinned.")})
_FILE = {"filename": Key(FILENAME, "The file's name."), "url": Key(URL, "Where the build downloads it."),
         "sha256": Key(SHA256, "Its sha256: the download is checked against it, so the index cannot change what is built.")}
LOCK_ENTRY = Table(optional={
    "requires_python": Key(PYTHON_RANGE, "The release's Requires-Python, as its metadata says (a record: the "
                                         "index route checks each wheel's own)."),
    "torch": Key(PIN_VERSION, "The torch the release pins in its own metadata: the cell's torch, checked against the "
                              "profile's torch."),
    "torch_cuda": Key(Table(required={
        "major": Key(INT, "The CUDA major that torch is built for."),
        "from": Key(STR, "The requirement of torch's own metadata that says so.")}),
        "The CUDA major that torch is built for: a cell of another CUDA major is refused."),
    "pins": Key(TableOf(PIN_VERSION, key=PACKAGE_KEY), "The versions its metadata pins for its companions (sglang-kernel, "
                                                       "flashinfer): the versions the cell builds."),
    "sdist": Key(Table(required=_FILE), "The release's sdist on the index (source = \"sdist\"), pinned by sha256."),
    "git": Key(LOCK_GIT, "A git source's tag and the commit it named (source = \"git\")."),
    "deps": Key(TableOf(LOCK_GIT, key=TOKEN), "The sources the build's CMake fetches by tag (its fetch plan), each "
                                              "pinned to a commit."),
    "wheels": Key(ListOf(Table(required=_FILE,
                               optional={"torch": Key(_grammar(lambda v: v and grammar.version(v), 'a version (or "")'),
                                                      "The torch the wheel's metadata pins (\"\": none)."),
                                         "requires_python": Key(PYTHON_RANGE, "The wheel's Requires-Python: auto refuses it for a cell of "
                                                                                "another Python.")})),
                  "The release's Linux wheels on the index, pinned by sha256: what source = \"index\" or \"auto\" "
                  "takes."),
})
def _image_digest(value) -> str:
    if value != "" and not (isinstance(value, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", value, re.ASCII)):
        raise ValueError("is not an image digest (sha256: and 64 lowercase hex digits)")
    return value


IMAGE_DIGEST = _grammar(_image_digest, 'an image digest like "sha256:<64 hex>" (or "" while unresolved)')
LOCK_BASE = Table(required={"digest": Key(IMAGE_DIGEST, "The image's digest when locked: every Dockerfile reads FROM "
                                                        "name:tag@digest, and lock --check fails when the base moved.")},
                  optional={"from": Key(STR, "Where the digest was read: its registry or the local Docker daemon."),
                            "unresolved": Key(STR, "Why no digest was found; the base stays unpinned.")})
LOCK = Table(required={"format": Key(INT, "The lock file's format: a file of another format is refused (run builder "
                                          "lock again).")},
             optional={"index": Key(URL, "The index the metadata and files were read from."),
                       "packages": Key(TableOf(LOCK_ENTRY, key=LOCK_KEY), "Per name==version of the matrix (and its "
                                                                         "companions): what its metadata pins and the "
                                                                         "files a build takes."),
                       "base_images": Key(TableOf(LOCK_BASE, key=_grammar(grammar.image_ref, "an image reference")),
                                          "Per base image the profiles build FROM: its digest.")})


# -- the image ledger (builder/image/ledger.py): one JSON file per content key under the wheelhouse's .images/ ---------
def _built_digest(value) -> str:
    if not _image_digest(value):
        raise ValueError("is empty")
    return value


BUILT_DIGEST = _grammar(_built_digest, 'an image digest like "sha256:<64 hex>"')
LEDGER_IMAGE = Table(required={"cell": STR, "recorded": UTC_TIME},
                     optional={"vouched_by": Key(STR, "Who vouched for a digest this host pulled rather than built: "
                                                      "the registry's ledger record and the key whose signature on it "
                                                      "verified (absent: builder built it here).")})
LEDGER_ENTRY = Table(required={"format": INT, "content_key": SHA256, "images": TableOf(LEDGER_IMAGE, key=BUILT_DIGEST)},
                     optional={"published": TableOf(BUILT_DIGEST, key=_grammar(grammar.image_ref, "an image reference"))})


# -- builder verify --policy (builder/image/verify.py) -------------------------------------------------------
DATE = Scalar((str, date), "a date (YYYY-MM-DD)", "dates")
VERIFY_KEY = Table(required={"path": Key(STR, "A PEM public key (ECDSA P-256 or Ed25519), relative to the policy file.")},
                   optional={"name": Key(STR, "What messages call the key."),
                             "expires": Key(DATE, "The last day a signature by this key is accepted.")})
VERIFY_POLICY = Table(required={"keys": Key(ListOf(VERIFY_KEY, nonempty=True), "The keys whose signatures count.")},
                      optional={"require": Key(ListOf(OneOf(("provenance", "sbom"))),
                                               "The attestations that must verify (default: both).")})


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


def _key_file(value) -> str:
    """The path of a key file (ledger_public_key): one line, and not empty ("" would turn the check it asks for off
    without a word: leave the key out for that)."""
    value = grammar.line(value)
    if not value.strip():
        raise ValueError("is empty: name the PEM public key file, or leave the key out (unset, reuse takes the "
                         "registry's unsigned word)")
    return value


def _said(rule, noun: str, plural: str = "", types: tuple[type, ...] = (str,)) -> Parsed:
    """A grammar whose reason already says what is expected (the message is the grammar's own)."""
    return Parsed(rule, noun, plural or noun, explain=True, say_expected=False, types=types)


def _git_url(mirror: bool):
    def rule(value: str) -> str:
        from . import gitmirror
        try:
            return gitmirror.check_url(value, "", mirror=mirror)
        except UserError as exc:
            # the schema's message shows the value already: the reason alone
            raise ValueError(str(exc).removeprefix(": ").removeprefix(redact.describe(value)).lstrip(": ")) from None
    return rule


GIT_UPSTREAM = _said(_git_url(False), "an upstream git URL prefix like https://github.com/")
GIT_MIRROR = _said(_git_url(True), "a mirror URL like http://127.0.0.1:9418/github/ (http, https, git or file)")


# which archs nvcc of a profile's CUDA can target is archs.py's business, once the shape is right
MATRIX_ARCHS = ListOf(_said(_sm_arch, "an SM arch number like 80 or 90", "SM arch numbers like 80 or 90", types=(int,)))
BASE_TEMPLATE = _said(_base_template, "an image reference with {cuda} / {os} placeholders")
BASE_IMAGES = Table(optional={
    "devel": Key(BASE_TEMPLATE, "The image the build stages start FROM (it needs nvcc): set it to build on your own "
                                "CUDA base; pinned by digest in matrix.lock."),
    "runtime": Key(BASE_TEMPLATE, "The image the runtime stage, the published image, starts FROM (no compiler): set it "
                                  "for a smaller or hardened base; pinned by digest in matrix.lock.")})
IMAGE_NAME = _said(grammar.image_name, "an image name like builder-local/cuda", "image names like builder-local/cuda")
RUNNER_LABELS = ListOf(_said(_runner_label, "a runner label", "runner labels"), nonempty=True)
# [defaults.cache]: remote wheel stores (a string "registry", "registry:HOST/REPO", "index:URL", or a table) and the
# compile cache's backend and scheduler. builder/cache/config.py and compile_cache.py read the values' meaning.
REMOTE = AnyOf((STR, Table(
    required={"kind": Key(OneOf(("registry", "index")), "An OCI registry (wheels as oras artifacts) or a PEP 503 "
                                                        "index (pypiserver, devpi, Nexus; uploads with twine).")},
    optional={"url": Key(STR, "A registry's HOST[:PORT]/REPO (default: {defaults.registry}/wheels) or an index's "
                              "simple URL."),
              "push": Key(BOOL, "Write built wheels through to it (default true); false for a store this machine may "
                                "only read."),
              "upload": Key(STR, "An index's upload URL, when it differs from the simple URL without its trailing "
                                 "simple/."),
              "insecure": Key(BOOL, "Talk to the registry over plain HTTP (default: only for 127.0.0.1 and "
                                    "localhost).")})))
CACHE = Table(optional={
    "remotes": Key(ListOf(REMOTE), "Remote wheel stores behind the local wheelhouse, read in order and written "
                                   "through: machines share compiled wheels by cache key (--cache-remote replaces the "
                                   "list, --no-remote empties it)."),
    "compile": Key(STR, "A shared sccache backend for the compile's objects (redis://, memcached://, webdav+https://, "
                        "s3://): a compile that must run finds objects other machines made; unset, they stay on this "
                        "host."),
    "dist": Key(STR, "An sccache-dist scheduler URL: the compile's steps are spread over its build servers."),
    "dist_cores": Key(INT, "The cores of the sccache-dist build servers together: plan's compile-time estimates count "
                           "them (needs dist).")})
DEFAULTS = Table(optional={
    "profile": Key(STR, "The profile a selection without --profile means (--profile all for every one)."),
    "archs": Key(MATRIX_ARCHS, "The SM archs every image is compiled for, unless its profile or --arch says otherwise: "
                               "fewer archs, faster compiles and smaller wheels."),
    "registry": Key(_said(_registry_prefix, "a registry/repository prefix like 127.0.0.1:5000/builder"),
                    "Where publish pushes the images (REGISTRY/ENGINE:TAG), and the base of the \"registry\" wheel "
                    "store, build cache and image reuse."),
    "ledger_public_key": Key(_said(_key_file, "a path on one line"),
                             "A PEM public key file (ECDSA P-256 or Ed25519), relative to the matrix file: a registry's "
                             "ledger record is adopted for image reuse only when signed by this key (publish signs with "
                             "the private key in BUILDER_LEDGER_SIGNING_KEY and refuses to push unsigned records); "
                             "unset, reuse takes the registry's unsigned word and says so once per run."),
    "index": Key(_said(grammar.index_url, "a PEP 691 index URL"),
                 "The package index `builder lock` reads metadata and files from and pip installs from inside the "
                 "builds: set it to a mirror or a private index."),
    "model": Key(_said(_model_id, "a model id like Qwen/Qwen3.8-27B-FP8"),
                 "The model the matrix is meant for, as a record: checked, but no verb reads it (smoke and bench "
                 "take --model, default tiny)."),
    "base_images": Key(BASE_IMAGES, "The base images every profile builds FROM, templates with {cuda} and {os} from "
                                    "the profile; a profile's own base_images override them."),
    "mirrors": Key(TableOf(IMAGE_NAME, key=IMAGE_NAME),
                   "Image-name prefixes rewritten in the base images (\"nvidia/cuda\" = \"mirror.example.com/nvidia/"
                   "cuda\"): build behind a mirror or on local bases with the same templates."),
    "git_mirrors": Key(TableOf(GIT_MIRROR, key=GIT_UPSTREAM),
                       "Upstream git URL prefixes rewritten to mirrors, as git's url.<mirror>.insteadOf (the longest "
                       "prefix wins), for lock's git commands and the builds' source and deps fetches (\"https://github.com/\" = "
                       "\"http://127.0.0.1:9418/github/\"): lock behind a firewall. The upstream URL and commit stay "
                       "the identity (no key, label or digest reads a mirror). --git-mirror and BUILDER_GIT_MIRRORS "
                       "replace it."),
    "knowledge": Key(ListOf(_said(grammar.line, "a path on one line", "paths on one line")),
                     "Extra engine-data TOML files, relative to the matrix file, merged over builder/data/engines.toml: "
                     "add a release or fix a fact without editing builder."),
    "cache": Key(CACHE, "The remote wheel stores and the compile cache ([defaults.cache])."),
    "layer_compression": Key(OneOf(("zstd", "gzip")),
                             "How the runtime and warm images' layers are compressed: zstd (default; Docker Engine 23+ and "
                             "containerd 1.5+ unpack it) or gzip (for older runtimes). Part of the image's content key."),
    "source_date_epoch": Key(_said(grammar.source_date_epoch, "a Unix timestamp like 1700000000", types=(str, int)),
                             "SOURCE_DATE_EPOCH of every build (file times in the images); unset: the last commit's time "
                             "of the matrix's repository. The environment's SOURCE_DATE_EPOCH wins."),
    "runners": Key(Table(optional={
        "compile": Key(RUNNER_LABELS, "Runner labels for cells that compile CUDA code (many cores, hours)."),
        "light": Key(RUNNER_LABELS, "Runner labels for cells that compile nothing (index wheels, pure Python)."),
        "gpu": Key(RUNNER_LABELS, "Runner labels for the GPU smoke of a cell.")}),
        "The CI runner labels `builder matrix` hands each cell's jobs (.github/workflows/images.yml)."),
})
MATRIX_VERSION = _said(grammar.version, "a version like 0.33.0", "versions like 0.33.0")
# profiles.<name>.source: where a package's wheel comes from. "build" (the default) compiles it from its pinned
# source; "index" takes the release's wheel from defaults.index as published (pinned by sha256 in matrix.lock)
# and lets the audit decide whether it carries the requested archs; "auto" takes that wheel when its audit passes
# for the requested archs and its torch / CUDA / Python match the cell, else compiles (builder/route.py).
SOURCE_CHOICES = ("build", "index", "auto")
JIT_CHOICES = ("first-request", "prebuilt")
PROFILE = Table(
    required={"cuda": Key(_said(grammar.cuda_version, "a CUDA version like 13.0.3"),
                          "The CUDA toolkit of the profile's images: {cuda} of the base images, and which archs nvcc "
                          "can emit."),
              "os": Key(_said(grammar.os_tag, "an OS tag like ubuntu24.04"),
                        "The OS of the base images ({os}); its devel image's GCC is checked against the engines' min_gcc."),
              "python": Key(_said(grammar.python_version, "a Python version like 3.12"),
                            "The Python the images install and the wheels are built for."),
              "engines": Key(TableOf(MATRIX_VERSION), "The engines and versions to build, one cell each (vllm = "
                                                      "\"0.33.0\").")},
    optional={"torch": Key(AnyOf((MATRIX_VERSION, TableOf(MATRIX_VERSION))),
                           "The torch the cells run, one for all or one per engine: checked against the torch each "
                           "engine pins in its own metadata (matrix.lock), so a wrong one is refused, not built."),
              "flash_attn": Key(MATRIX_VERSION, "A flash-attn version built into each cell of the profile (absent: "
                                                "none)."),
              "strategies": Key(ListOf(STR), "The speculative-decoding strategies (MTP2, MTP7, DFlash2) the cells must "
                                             "run: smoke and bench run them, and a cell whose engine cannot is refused "
                                             "with the engine data's reason."),
              "archs": Key(MATRIX_ARCHS, "The profile's SM archs, instead of defaults.archs (--arch overrides both)."),
              "base_images": Key(BASE_IMAGES, "The profile's own base images, key by key over defaults.base_images."),
              "source": Key(TableOf(OneOf(SOURCE_CHOICES)),
                            "Per package, where its wheel comes from: \"build\" (the default) compiles the pinned "
                            "source; \"index\" takes the published wheel (pinned by sha256 in matrix.lock) and lets the "
                            "audit judge its archs; \"auto\" takes it when its audit and torch / CUDA / Python fit the "
                            "cell, else compiles."),
              "criu": Key(BOOL, "The runtime images carry CRIU (builder/data/criu/criu.toml: built from source on the "
                                "devel base, with the libraries it links, at /opt/builder/criu and on PATH), which "
                                "`builder snapshot`'s container route runs inside the image. Default false."),
              "jit": Key(TableOf(OneOf(JIT_CHOICES)),
                         "Per engine, when its JIT modules (engine data jit_modules) are built: \"first-request\" (the "
                         "default) or \"prebuilt\", at image-build time into the image's JIT cache, so no request waits "
                         "for a compile.")},
)
MATRIX = Table(optional={"defaults": Key(DEFAULTS, "What every profile falls back to, key by key over "
                                                   "builder/data/defaults.toml."),
                         "profiles": Key(TableOf(PROFILE), "The profiles by name: each is a CUDA / OS / Python stack and "
                                                           "the engines built on it; --profile picks them.")})


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
                             "brand": _said(grammar.line, "a product brand on one line"),
                             "sm_count": OrNull(_count(1, 4096, "a GPU's SM count from 1 to 4096"))})
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


# -- the GPU-host route: a carry bundle's spec (scripts/gpu-host/<name>.toml, carried beside the bundle's parts) --
# gpu-host-bundle reads its wheel set, gpu-host-run its [serve] table (builder/deploy/runtime/hostenv.py)
def _host_python(value: str) -> str:
    if not re.fullmatch(r"3\.[0-9]{1,2}", value):
        raise ValueError("is not a Python version like \"3.12\"")
    return value


def _carry_requirement(value: str) -> str:
    """A requirement pip is given as one argument (never a shell's): packaging's grammar, no option."""
    from packaging.requirements import InvalidRequirement, Requirement

    if value.startswith("-"):
        raise ValueError("is an option, not a requirement (like name==1.0)")
    try:
        Requirement(value)
    except InvalidRequirement as exc:  # packaging's words, without the lines that point at the column
        raise ValueError(f"is not a requirement like name==1.0 ({str(exc).splitlines()[0]})") from None
    return value


def _shell_words(value: str) -> str:
    import shlex

    try:
        shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"is not one shell-quoted string ({exc})") from None
    return value


CARRY_REQUIREMENT = _said(_carry_requirement, "a requirement like name==1.0", "requirements like name==1.0")
CARRY_SERVE = Table(
    required={"cell": Key(_grammar(grammar.bundle_name, "a cell name"), "The cell of the GPU host's matrix "
                          "(tests/fixtures/gpu-host/matrix.toml) that smoke, bench and warm run."),
              "engine_args": Key(_said(_shell_words, "one shell-quoted string"),
                                 "The engine's own flags, one shell-quoted string (--engine-args).")},
    optional={"env": Key(ListOf(NAME_VALUE),
                         "The engine's environment on the host (--env).")})
_CARRY_WHEELS = {
    "python": Key(_said(_host_python, 'a Python version like "3.12"'), "The host's Python: pip downloads for it."),
    "platforms": Key(ListOf(STR, nonempty=True), "The wheel platform tags pip downloads for (manylinux_2_28_x86_64, any)."),
    "wheels": Key(ListOf(CARRY_REQUIREMENT), "The wheels the bundle carries besides the engine, one requirement each."),
}
_CARRY_MORE = {
    "engine": Key(CARRY_REQUIREMENT, "The engine wheel (absent: a bundle of wheels only, carried with --with)."),
    "strip": Key(ListOf(STR), "Globs of the engine wheel's members left out of the bundle."),
    "repack": Key(TableOf(ListOf(STR), key=CARRY_REQUIREMENT),
                  "Other wheels of the set (a requirement each) that travel without the members these globs match."),
    "serve": Key(CARRY_SERVE, "How gpu-host-run serves the bundle: its cell, engine flags and environment."),
}
# the whole spec, as gpu-host-bundle checks it
CARRY_SPEC = Table(required=_CARRY_WHEELS, optional=_CARRY_MORE)
# the same keys as gpu-host-run reads them: [serve] given, the wheel set (gpu-host-bundle's) not needed
CARRY_SPEC_SERVED = Table(required={"serve": _CARRY_MORE["serve"]},
                          optional={**_CARRY_WHEELS, **{k: v for k, v in _CARRY_MORE.items() if k != "serve"}})


def noun_of(value) -> str:
    """How a message names a value's type (JSON or TOML)."""
    return _TOML_NOUNS.get(type(value), type(value).__name__)


# -- the checker -------------------------------------------------------------------------------------------
MAX_NAME_GUESSED = 100  # did_you_mean guesses for words up to this long
_TOML_NOUNS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list", dict: "a table",
               type(None): "null"}


def did_you_mean(word: str, choices) -> str:
    """` (did you mean 'x'?)` for the choice closest to a mistyped word; nothing for a word longer than any name
    (difflib's comparison grows with its length: megabytes take seconds)."""
    if not isinstance(word, str) or len(word) > MAX_NAME_GUESSED:
        return ""
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
                    self._fail(path, f"{redact.describe(value)} is not {kind.noun}{did_you_mean(value, kind.values)}")
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
                self._fail(path, f"unknown key {redact.describe(key)}{did_you_mean(key, allowed)}; allowed: "
                                 f"{', '.join(sorted(allowed))}")
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
            self._fail(path, f"{redact.describe(value)} names no known package{hint}; known: {', '.join(self.packages)}")

    def _expect(self, ok: bool, value, kind, path: str) -> None:
        if not ok:
            got = _TOML_NOUNS.get(type(value), type(value).__name__)
            self._fail(path, f"expected {kind.noun}, got {got} {_shown(value)}")

    def _fail(self, path: str, problem: str):
        where = ": ".join(p for p in (self.file, path) if p)
        raise UserError(f"{where}: {problem}" if where else problem)


def _shown(value) -> str:
    """A value in a message: redacted, then cut (redact.describe)."""
    return redact.describe(value, 30)


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
    """`packages.vllm`, or `cuda."12.1"` for a key TOML must quote; a key too long for a message cut short (redacted
    first: redact.describe)."""
    if len(key) > MAX_NAME_GUESSED:
        part = redact.describe(key, 40)
    else:
        part = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'
    return f"{path}.{part}" if path else part
