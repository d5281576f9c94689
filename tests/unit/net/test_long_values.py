"""Every echo of an input bounded: a value of megabytes given to a flag, a matrix key or an engine-data key is refused
in one line under 1,000 characters, within 2 s of CPU, through the real entry point (click's CliRunner on
builder.cli:main, in-process, as tests/hardening_cases.py runs the table).

The bounds: an argument longer than the kernel passes to a program (MAX_ARG_STRLEN, 128 KiB: only a caller in the
same process can give more) is refused before click reads it; a line of a TOML file over 64 KiB before the TOML
parser reads it (builder/files.py); below those, every check quotes a value through redact.describe, and what the
CLI prints goes through redact.clip (no line over 990 characters, at most 100 lines) as a last net.
"""

from __future__ import annotations

import pytest

from builder import redact

from tests.hardening import cases as hc

MB10 = 10 << 20
SHAPES = {"dots": "a.", "letters": "a", "colons": "a:"}


def _value(shape: str, size: int) -> str:
    return (shape * (size // len(shape) + 1))[:size]


def _refused(case: hc.Case, tmp_path, cpu: float = 2.0) -> str:
    """Run the case in-process; it must exit 2 with one `error:` line (click's `Error:`) under 1,000 characters,
    no line of the output over 1,000, no traceback, within `cpu` seconds of CPU. Returns the error line."""
    res = hc.run_in_process(case, hc.make_fixture(tmp_path, case))
    out = res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith(("error: ", "Error: "))]
    assert res.returncode == 2 and "Traceback" not in out, f"exit {res.returncode}\n{out[-2000:]}"
    assert len(errors) == 1 and all(len(line) < 1000 for line in out.splitlines()), \
        f"{len(out)} characters of output, longest line {max(map(len, out.splitlines()), default=0)}: {out[:600]}"
    assert res.cpu < cpu and res.wall < 3 * cpu, f"{res.cpu:.2f} s of CPU, {res.wall:.2f} s"
    assert not res.calls, res.calls
    return errors[0]


# -- flags ------------------------------------------------------------------------------------------------------
FLAGS = {  # name → argv with "{v}" where the long value goes, and what the refusal names
    "plan-arch": ([*hc.PLAN, "--arch", "{v}"], "--arch"),
    "plan-engine": ([*hc.PLAN, "--engine", "{v}"], "--engine"),
    "plan-profile": ([*hc.PLAN, "--profile", "{v}"], "--profile"),
    "plan-cache-remote": ([*hc.PLAN, "--cache-remote", "{v}"], "--cache-remote"),
    "build-progress": ([*hc.DRY, "--progress", "{v}"], "--progress"),
    "build-base-devel": ([*hc.DRY, "--base-devel", "{v}"], "--base-devel"),
    "build-layer-cache": ([*hc.DRY, "--layer-cache", "{v}"], "--layer-cache"),
    "publish-registry": ([*hc.PUBLISH, "--registry", "{v}"], "--registry"),
    "lock-index": ([*hc.LOCK, "--index", "{v}"], "--index"),
    "smoke-launcher": ([*hc.SMOKE, "--launcher", "{v}"], "--launcher"),
    "wheels-push-key": (["wheels", "push", *hc.M, *hc.WH, "--cache-remote", "registry:127.0.0.1:9/w", "--key", "{v}"],
                        "--key"),
    "doctor-registry": (["doctor", "--registry", "{v}"], "--registry"),
    "unknown-option": ([*hc.PLAN, "--{v}"], "No such option"),
}


@pytest.mark.pure
@pytest.mark.parametrize("name", FLAGS)
def test_ten_megabytes_given_to_a_flag_is_refused_in_one_short_line(name, tmp_path):
    argv, _ = FLAGS[name]
    value = _value("a.", MB10)
    line = _refused(hc.Case(name, "long-value", [a.replace("{v}", value) for a in argv]), tmp_path)
    assert "MAX_ARG_STRLEN" in line and ("10485760 characters" in line or "10485762 characters" in line), line


@pytest.mark.pure
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("name", FLAGS)
def test_the_longest_value_a_command_line_can_carry_is_refused_in_one_short_line(name, shape, tmp_path):
    """120 KiB (under MAX_ARG_STRLEN: what a shell can pass) reaches the flag's own check: it names the flag,
    quotes the value cut short."""
    argv, names = FLAGS[name]
    value = _value(shape, 120 << 10)
    line = _refused(hc.Case(name, "long-value", [a.replace("{v}", value) for a in argv]), tmp_path)
    assert names in line, line


@pytest.mark.pure
def test_an_unknown_verb_of_megabytes_is_refused_in_one_short_line(tmp_path):
    for size in (MB10, 120 << 10):
        (tmp_path / str(size)).mkdir()
        line = _refused(hc.Case("verb", "long-value", [_value("x", size)]), tmp_path / str(size))
        assert ("MAX_ARG_STRLEN" if size == MB10 else "No such command") in line, line


# -- the matrix and the engine data ------------------------------------------------------------------------------
def _quoted(size: int) -> str:
    return '"' + _value("a.", size) + '"'


MATRIX = {  # name → (matrix edit for a value of `size`, what the refusal names)
    "unknown-key": (lambda q: hc.add_default(f"{q} = 1"), "defaults"),
    "registry": (lambda q: hc.set_key("registry", q), "defaults.registry"),
    "index": (lambda q: hc.add_default(f"index = {q}"), "defaults.index"),
    "profile": (lambda q: hc.set_key("profile", q), "defaults.profile"),
    "devel": (lambda q: hc.set_key("devel", q), "defaults.base_images.devel"),
    "os": (lambda q: hc.set_key("os", q), "profiles.local.os"),
    "engine-name": (lambda q: hc.set_key("engines", f"{{ {q} = \"1.0.0\" }}"), "profiles.local.engines"),
    "mirrors-key": (lambda q: hc.add_default(f'mirrors = {{ {q} = "m.example/x" }}'), "defaults.mirrors"),
    "cache-remote": (lambda q: (lambda t: t + f"\n[defaults.cache]\nremotes = [{q}]\n"), "defaults.cache.remotes"),
    "cache-compile": (lambda q: (lambda t: t + f"\n[defaults.cache]\ncompile = {q}\n"), "defaults.cache.compile"),
}
ENGINE_DATA = {
    "unknown-key": (lambda q: hc.replace('kind = "engine"', f'kind = "engine"\n{q} = 1'), "packages.cuda-ext"),
    "kind": (lambda q: hc.replace('kind = "engine"', f"kind = {q}"), "packages.cuda-ext.kind"),
    "torch-pin": (lambda q: hc.replace('torch_pin = "none"', f"torch_pin = {q}"), "packages.cuda-ext.torch_pin"),
    "versions": (lambda q: hc.replace('versions = ">=1.0"', f"versions = {q}"), "rules[0].versions"),
    "rule-unknown-key": (lambda q: hc.replace('source_subdir = "pkg"', f'source_subdir = "pkg"\n{q} = 2'), "rules[0]"),
    "knob-env": (lambda q: hc.replace('env = "CUDA_EXT_ARCHS"', f"env = {q}"), "arch_knobs[0].env"),
    "package-name": (lambda q: hc.replace("[packages.cuda-ext]\n", f"[packages.{q}]\n"), "packages"),
}


@pytest.mark.pure
@pytest.mark.parametrize("size", [MB10, 60 << 10], ids=["10MB", "60KB"])
@pytest.mark.parametrize("name", MATRIX)
def test_a_matrix_key_of_megabytes_is_refused_in_one_short_line(name, size, tmp_path):
    edit, names = MATRIX[name]
    line = _refused(hc.Case(name, "long-value", hc.PLAN, matrix=edit(_quoted(size))), tmp_path)
    assert ("matrix.toml: line" in line and "no line of a matrix file is longer than 65536" in line) if size == MB10 \
        else names in line, line


@pytest.mark.pure
@pytest.mark.parametrize("size", [MB10, 60 << 10], ids=["10MB", "60KB"])
@pytest.mark.parametrize("name", ENGINE_DATA)
def test_an_engine_data_key_of_megabytes_is_refused_in_one_short_line(name, size, tmp_path):
    edit, names = ENGINE_DATA[name]
    line = _refused(hc.Case(name, "long-value", hc.PLAN, knowledge=edit(_quoted(size))), tmp_path)
    assert ("engines.toml: line" in line and "longer than 65536" in line) if size == MB10 else names in line, line


# -- the net -----------------------------------------------------------------------------------------------------
@pytest.mark.pure
def test_clip_bounds_each_line_and_the_lines_keeping_both_ends():
    assert redact.clip("short") == "short" and redact.clip("a\nb") == "a\nb"
    long = "head " + "x" * 5000 + " fix: do this"
    cut = redact.clip(long)
    assert len(cut) <= redact.LINE_WIDTH and cut.startswith("head ") and cut.endswith(" fix: do this"), cut
    assert "characters cut]" in cut
    many = "\n".join(f"line {i}" for i in range(1000))
    lines = redact.clip(many).split("\n")
    assert len(lines) == redact.MESSAGE_LINES and lines[0] == "line 0" and lines[-1] == "line 999"
    assert any("lines cut]" in line for line in lines)
    exact = "\n".join("y" * redact.LINE_WIDTH for _ in range(redact.MESSAGE_LINES))
    assert redact.clip(exact) == exact
