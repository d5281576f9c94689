"""Round five of the bad-input table: inputs of absurd length, key files that are no files, hostile credential helpers.

- long values: 120 KiB (near the most one argument carries: the kernel's MAX_ARG_STRLEN is 128 KiB) to the flags of
  several verbs, 60 KiB and 10 MB to matrix and engine-data keys and key names. Each is refused in one line the
  judge holds under 1,000 characters (an echo of the input cut short: redact.describe, redact.clip), within the
  table's CPU bound; 10 MB on one line of a TOML file is refused before the TOML parser reads it;
- key files: `ledger_public_key` naming a FIFO (it blocked build and publish), /dev/zero (read forever), a
  directory, "" and "  " (which turned verification off without a word): exit 2, before anything is opened;
- credential helpers: a docker-credential helper printing 20 MB (it stalled the verbs that read a registry's
  docker login), or failing with the password in its error text (it was quoted): exit 3 at once, its words never
  quoted (the judge looks for SECRET in every output).
"""

from __future__ import annotations

from typing import Callable

from tests.hardening.cases import DRY, LOCK, M, PLAN, PUBLISH, SECRET, SMOKE, WH, Case, add_default, directory, fifo, replace, set_key
from tests.hardening.remotes import ENV, _path_with, config, helper

DEAD = "127.0.0.1:9"
ARG = 120 << 10  # under MAX_ARG_STRLEN: what a shell can pass as one argument
SHAPES = {"dots": "a.", "marks": "x?"}


def long(shape: str, size: int) -> str:
    return (shape * (size // len(shape) + 1))[:size]


# -- long values to flags ----------------------------------------------------------------------------------------
FLAGS = {  # name → (argv before the value, the flag, what the refusal names)
    "plan-arch": (PLAN, "--arch", "--arch"),
    "plan-engine": (PLAN, "--engine", "--engine"),
    "plan-profile": (PLAN, "--profile", "--profile"),
    "plan-cache-remote": (PLAN, "--cache-remote", "--cache-remote"),
    "build-progress": (DRY, "--progress", "--progress"),
    "build-base-devel": (DRY, "--base-devel", "--base-devel"),
    "build-layer-cache": (DRY, "--layer-cache", "--layer-cache"),
    "publish-registry": ([*PUBLISH, "--retries", "0"], "--registry", "--registry"),
    "lock-index": (LOCK, "--index", "--index"),
    "smoke-launcher": (SMOKE, "--launcher", "--launcher"),
    "push-key": (["wheels", "push", *M, *WH, "--cache-remote", f"registry:{DEAD}/w"], "--key", "--key"),
    "doctor-registry": (["doctor"], "--registry", "--registry"),
    "unknown-option": (PLAN, None, "No such option"),
}


def _flag_cases() -> list[Case]:
    out = []
    for name, (before, flag, names) in FLAGS.items():
        for shape_name, shape in SHAPES.items():
            value = long(shape, ARG)
            given = [flag, value] if flag else ["--" + value]
            out.append(Case(f"l5-flag-{name}-{shape_name}", "long-value", [*before, *given], expect=(names,)))
    return out


# -- long values in the matrix and the engine data ---------------------------------------------------------------
def _quoted(size: int) -> Callable[[], str]:
    return lambda: '"' + long("a.", size) + '"'


def _edit(make: Callable[[str], Callable[[str], str]], size: int) -> Callable[[str], str]:
    """A matrix / engine-data edit whose long value is made when the case runs (not held by the table)."""
    return lambda text: make(_quoted(size)())(text)


MATRIX = {  # name → (edit for a quoted value, what the refusal names at 60 KiB)
    "unknown-key": (lambda q: add_default(f"{q} = 1"), "defaults: unknown key"),
    "registry": (lambda q: set_key("registry", q), "defaults.registry"),
    "index": (lambda q: add_default(f"index = {q}"), "defaults.index"),
    "profile": (lambda q: set_key("profile", q), "defaults.profile"),
    "devel": (lambda q: set_key("devel", q), "defaults.base_images.devel"),
    "os": (lambda q: set_key("os", q), "profiles.local.os"),
    "engine-name": (lambda q: set_key("engines", f"{{ {q} = \"1.0.0\" }}"), "unknown engine"),
    "mirrors-key": (lambda q: add_default(f'mirrors = {{ {q} = "m.example/x" }}'), "defaults.mirrors"),
    "cache-remote": (lambda q: (lambda t: t + f"\n[defaults.cache]\nremotes = [{q}]\n"), "defaults.cache.remotes[0]"),
    "cache-compile": (lambda q: (lambda t: t + f"\n[defaults.cache]\ncompile = {q}\n"), "defaults.cache.compile"),
}
ENGINE_DATA = {
    "unknown-key": (lambda q: replace('kind = "engine"', f'kind = "engine"\n{q} = 1'), "packages.cuda-ext: unknown key"),
    "kind": (lambda q: replace('kind = "engine"', f"kind = {q}"), "packages.cuda-ext.kind"),
    "torch-pin": (lambda q: replace('torch_pin = "none"', f"torch_pin = {q}"), "packages.cuda-ext.torch_pin"),
    "versions": (lambda q: replace('versions = ">=1.0"', f"versions = {q}"), "rules[0].versions"),
    "rule-unknown-key": (lambda q: replace('source_subdir = "pkg"', f'source_subdir = "pkg"\n{q} = 2'), "rules[0]: unknown key"),
    "knob-env": (lambda q: replace('env = "CUDA_EXT_ARCHS"', f"env = {q}"), "arch_knobs[0].env"),
    "package-name": (lambda q: replace("[packages.cuda-ext]\n", f"[packages.{q}]\n"), "packages: key"),
}
TEN_MB = 10 << 20


def _data_cases() -> list[Case]:
    out = []
    for name, (make, names) in MATRIX.items():
        out.append(Case(f"l5-matrix-{name}-60k", "long-value", PLAN, matrix=_edit(make, 60 << 10), expect=(names,)))
    for name in ("unknown-key", "registry", "cache-compile"):
        out.append(Case(f"l5-matrix-{name}-10mb", "long-value", PLAN, matrix=_edit(MATRIX[name][0], TEN_MB),
                        expect=("matrix.toml: line", "no line of a matrix file is longer than 65536")))
    out.append(Case("l5-matrix-registry-10mb-build", "long-value", DRY, matrix=_edit(MATRIX["registry"][0], TEN_MB),
                    expect=("matrix.toml: line",)))
    for name, (make, names) in ENGINE_DATA.items():
        out.append(Case(f"l5-engines-{name}-60k", "long-value", PLAN, knowledge=_edit(make, 60 << 10), expect=(names,)))
    for name in ("kind", "package-name"):
        out.append(Case(f"l5-engines-{name}-10mb", "long-value", PLAN, knowledge=_edit(ENGINE_DATA[name][0], TEN_MB),
                        expect=("engines.toml: line", "longer than 65536")))
    return out


# -- key files that are no files ---------------------------------------------------------------------------------
def _named_key(path: str) -> Callable[[str], str]:
    return add_default(f'ledger_public_key = "{path}"')


KEY_FILES = {  # name → (what the matrix names, files to make, what the refusal says)
    "fifo": ("ledger.pub", {"fx/ledger.pub": fifo}, "not a regular file (a FIFO, socket or device)"),
    "dev-zero": ("/dev/zero", {}, "not a regular file (a FIFO, socket or device)"),
    "directory": ("keys", {"fx/keys": directory}, "is a directory"),
    "empty": ("", {}, "'' is empty"),
    "blank": ("  ", {}, "'  ' is empty"),
}


def _key_cases() -> list[Case]:
    out = []
    for name, (named, made, says) in KEY_FILES.items():
        for verb, argv in (("build", DRY), ("publish", [*PUBLISH, "--registry", f"{DEAD}/x", "--retries", "0"])):
            out.append(Case(f"l5-ledger-key-{name}-{verb}", "key-file", argv, matrix=_named_key(named), files=made,
                            expect=("ledger_public_key", says)))
    return out


# -- credential helpers that flood or name the secret ------------------------------------------------------------
HELPERS = {  # name → (the helper's script, what builder's one line says)
    "floods-output": ("head -c 20000000 /dev/zero | tr '\\0' a\n", "printed more than 256 KiB"),
    "floods-errors": ("head -c 20000000 /dev/zero | tr '\\0' a >&2\nexit 1\n", "printed more than 256 KiB"),
    "names-the-secret": (f"echo 'cannot unlock the keychain for {SECRET}' >&2\nexit 1\n", "message is withheld"),
}
HELPER_VERBS = {
    "publish": [*PUBLISH, "--registry", f"{DEAD}/x", "--retries", "0"],
    "plan": [*PLAN, "--remote", "--cache-remote", f"registry:{DEAD}/w"],
}


def _helper_cases() -> list[Case]:
    out = []
    for name, (script, says) in HELPERS.items():
        for verb, argv in HELPER_VERBS.items():
            if name == "floods-errors" and verb == "publish":
                continue  # one verb is enough for the second stream
            out.append(Case(f"l5-cred-helper-{name}-{verb}", "cred-helper", argv, code=3,
                            files={**config('{"credsStore": "flood"}'), "bin": helper("flood", script)},
                            env={**ENV, **_path_with("bin")}, expect=("docker-credential-flood", says),
                            needs_programs=True))
    return out


CASES: list[Case] = [*_flag_cases(), *_data_cases(), *_key_cases(), *_helper_cases()]
