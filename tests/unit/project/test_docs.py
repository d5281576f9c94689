"""The docs stay true to the code: the generated reference pages (docs/reference/) are what scripts/gen-reference
writes from builder/schema.py, builder/data/defaults.toml and the click commands today."""
from pathlib import Path

import pytest

from tests.helpers import REPO, load_script

ROOT = REPO


def generator():
    return load_script("gen-reference")


@pytest.mark.pure
def test_the_reference_pages_are_what_the_generator_writes_from_the_code():
    gen = generator()
    stale = gen.stale()
    assert not stale, (f"stale generated pages: {', '.join('docs/reference/' + n for n in stale)}; "
                       f"regenerate them with: {gen.REGENERATE}")


@pytest.mark.pure
def test_the_generator_is_deterministic_and_covers_every_verb_and_key(tmp_path):
    gen = generator()
    first, second = gen.pages(), gen.pages()
    assert first == second
    cli, matrix, engines = first["cli.md"], first["matrix.md"], first["engine-data.md"]
    for path, _ in gen.commands(gen.main, ("builder",)):
        assert f"\n## {' '.join(path)}\n" in cli, path
    assert "`--arch TEXT`" in cli and "`--dry-run`" in cli
    for key in gen.schema.DEFAULTS.keys:
        assert f"| `{key}` |" in matrix, key
    assert '| `profile` | a string |  | `"cu130"` |' in matrix  # the default comes from defaults.toml
    for key in gen.schema.RULE.keys:
        assert f"| `{key}` |" in engines, key


def schema_tables(shape, path: str = ""):
    """(path, Table) of every table a shape holds, nested ones included, with the path a reader writes it at."""
    from builder import schema

    if isinstance(shape, schema.Table):
        yield path, shape
        for key, sub in shape.keys.items():
            yield from schema_tables(sub, f"{path}.{key}" if path else key)
    elif isinstance(shape, schema.ListOf):
        yield from schema_tables(shape.item, f"{path}[]")
    elif isinstance(shape, schema.TableOf):
        yield from schema_tables(shape.value, f"{path}.<name>")
    elif isinstance(shape, schema.AnyOf):
        for kind in shape.kinds:
            yield from schema_tables(kind, path)
    elif isinstance(shape, schema.OrNull):
        yield from schema_tables(shape.kind, path)


@pytest.mark.pure
def test_every_key_of_the_matrix_defaults_engine_data_and_lock_has_a_meaning_the_reference_prints():
    """A key is explained where it is declared (schema.Key: its shape and its meaning), so a new key without one
    fails here, naming it; the generated pages print every meaning beside the shape."""
    gen = generator()
    from builder import schema

    pages = gen.pages()
    roots = {"matrix.toml": (schema.MATRIX, "matrix.md"), "[defaults] (and defaults.toml [matrix])": (schema.DEFAULTS, "matrix.md"),
             "engine data": (schema.BUILT_IN, "engine-data.md"), "extra engine data": (schema.EXTRA, "engine-data.md"),
             "matrix.lock": (schema.LOCK, "matrix.md")}
    missing, unprinted = [], []
    for what, (root, page) in roots.items():
        for path, table in schema_tables(root):
            for key in table.keys:
                meaning = table.meanings.get(key, "").strip()
                where = f"{what}: {path + '.' if path else ''}{key}"
                if len(meaning) < 12 or meaning.strip(".").lower() == key.replace("_", " "):
                    missing.append(where)
                elif f"| {gen.md(meaning)} |" not in pages[page]:
                    unprinted.append(f"{where} (docs/reference/{page})")
    assert not missing, ("keys without a meaning: give each one in builder/schema.py as Key(shape, \"what it does and "
                         "why a user sets it\"):\n  " + "\n  ".join(missing))
    assert not unprinted, "meanings the reference does not print:\n  " + "\n  ".join(unprinted)
    defaults = tomllib.loads((ROOT / "builder" / "data" / "defaults.toml").read_text())["matrix"]
    assert set(defaults) <= set(schema.DEFAULTS.keys)  # so every defaults.toml [matrix] key is one explained above


@pytest.mark.pure
def test_a_key_without_a_meaning_is_named():
    from builder import schema

    table = schema.Table(optional={"explained": schema.Key(schema.STR, "What it does and why one sets it."),
                                   "bare": schema.STR})
    assert table.keys == {"explained": schema.STR, "bare": schema.STR}  # the checker sees shapes only
    assert [k for _, t in schema_tables(schema.ListOf(table)) for k in t.keys if not t.meanings.get(k)] == ["bare"]


@pytest.mark.pure
def test_every_option_of_every_verb_has_help_and_every_argument_is_explained_in_its_verb_text():
    """Options carry `help=`; an argument (click gives arguments no help text before 8.5) is explained in its verb's
    docstring, which names it by its metavar (TARGET, CELL): the convention the reference relies on."""
    gen = generator()
    bad = []
    verbs = [(("builder",), gen.main), *gen.commands(gen.main, ("builder",))]
    for path, cmd in verbs:
        for param in cmd.params:
            if isinstance(param, click.Option):
                if not param.hidden and not (param.help or "").strip():
                    bad.append(f"{' '.join(path)} {param.opts[-1]}: no help=")
            elif not re.search(rf"\b{re.escape(param.human_readable_name)}\b", cmd.help or ""):
                bad.append(f"{' '.join(path)} {param.human_readable_name}: the verb's docstring does not explain it")
    assert not bad, "\n".join(bad)


@pytest.mark.pure
def test_a_stale_page_is_named_with_the_command_that_regenerates_it(tmp_path, capsys):
    gen = generator()
    for name, text in gen.pages().items():
        (tmp_path / name).write_text(text)
    assert gen.stale(tmp_path) == []
    (tmp_path / "matrix.md").write_text(gen.pages()["matrix.md"].replace('"cu130"', '"cu121"'))
    (tmp_path / "cli.md").unlink()
    assert gen.stale(tmp_path) == ["cli.md", "matrix.md"]


# -- the command blocks of README.md and docs/ ---------------------------------------------------------------
# A ```sh block runs here (in-process, through click's CliRunner, from the repository root) unless the line
# before it is `<!-- check-only: why -->`: then each of its commands is checked instead — a builder verb and its
# flags against the click commands, a script of the repository for existing, a test path for existing.
import json
import re
import shlex
import tomllib

import click
from click.testing import CliRunner

from builder import schema
from builder.cli import main

DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
CHECK_ONLY = re.compile(r"<!--\s*check-only:\s*(\S.*?)\s*-->")
# programs a check-only block may call besides builder and the repository's scripts
EXTERNAL = {"docker", "export", "mv", "printf", "chmod", "tail"}
SEPARATORS = {";", "&&", "||", "|", "(", ")", "$(", "&"}


def command_blocks():
    """(file:line, language, text, why it is only checked or None) of every fenced block that has a language."""
    for path in DOC_FILES:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.fullmatch(r"```(\w+)", lines[i])
            if fence:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                mark = CHECK_ONLY.fullmatch(lines[i - 1].strip()) if i else None
                yield (f"{path.relative_to(ROOT)}:{i + 1}", fence[1], "\n".join(lines[i + 1:end]),
                       mark[1] if mark else None)
                i = end
            i += 1


SH_BLOCKS = [b for b in command_blocks() if b[1] in ("sh", "console", "bash")]
TOML_BLOCKS = [b for b in command_blocks() if b[1] == "toml"]


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at ; && | ( )."""
    return [c for line in text.replace("\\\n", " ").splitlines() for c in _line_commands(line)]


def _line_commands(line: str) -> list[list[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found, current, skip_next = [], [], False
    for token in lexer:
        if skip_next:
            skip_next = False
            continue
        if token in (">", ">>", "<"):
            skip_next = True
            continue
        if token in SEPARATORS or token.endswith("=$"):
            if current:
                found.append(current)
            current = []
            continue
        current.append(token)
    if current:
        found.append(current)
    # leading VAR=value assignments are the environment of the command, not the command
    return [c for c in (_drop_assignments(c) for c in found) if c]


def _drop_assignments(words: list[str]) -> list[str]:
    while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    return words


def builder_args(words: list[str]) -> list[str] | None:
    """The arguments of a builder call (scripts/builder, builder, python3 -m builder.cli), else None."""
    if words[0] in ("scripts/builder", "builder", ".venv/bin/builder"):
        return words[1:]
    if words[:3] == ["python3", "-m", "builder.cli"]:
        return words[3:]
    return None


def resolve(args: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """The click command a builder argument list reaches, its name path and the arguments left for it."""
    cmd, path, rest = main, ["builder"], list(args)
    while isinstance(cmd, click.Group):
        check_flags(cmd, path, [a for a in _leading_options(rest)])
        rest = rest[len(_leading_options(rest)):]
        assert rest, f"`{' '.join(path)}` needs a verb"
        ctx = click.Context(cmd, info_name=path[-1])
        sub = cmd.get_command(ctx, rest[0])
        if sub is None and path == ["builder", "bench"]:  # `builder bench TARGET ...` is `builder bench run TARGET`
            sub, rest = cmd.get_command(ctx, "run"), ["run", *rest]
        assert sub is not None, f"`{' '.join(path)} {rest[0]}`: no such verb (verbs: {', '.join(cmd.list_commands(ctx))})"
        cmd, path, rest = sub, [*path, rest[0]], rest[1:]
    return cmd, path, rest


def _leading_options(args: list[str]) -> list[str]:
    n = 0
    while n < len(args) and args[n].startswith("-"):
        n += 1
    return args[:n]


def check_flags(cmd: click.Command, path: list[str], args: list[str]) -> None:
    """Every option named is one the command declares; the value of an option that takes one is skipped; no more
    positional arguments than the command takes."""
    ctx = click.Context(cmd, info_name=path[-1], **cmd.context_settings)
    options = {}
    for param in cmd.get_params(ctx):
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                options[name] = param
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    positional, i = 0, 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            assert name in options, (f"`{' '.join(path)}` has no option {name} "
                                     f"(it has: {', '.join(sorted(options))})")
            param = options[name]
            if not param.is_flag and not param.count and "=" not in word:
                i += 1  # its value
        else:
            positional += 1
        i += 1
    if not any(a.nargs == -1 for a in arguments):
        assert positional <= sum(a.nargs for a in arguments), f"`{' '.join(path)}` takes {len(arguments)} arguments: {args}"


def check_command(words: list[str]) -> None:
    args = builder_args(words)
    if args is not None:
        cmd, path, rest = resolve(args)
        check_flags(cmd, path, rest)
        return
    program = words[0]
    if program in ("python3", "python"):
        if words[1:3] == ["-m", "pytest"] or words[1:2] == ["-c"] or words[1:3] in (["-m", "pip"], ["-m", "json.tool"]):
            for word in words[3:]:
                if word.startswith("tests/"):
                    assert (ROOT / word.split("::")[0]).exists(), f"{word}: no such test file"
            return
        assert (ROOT / words[1]).is_file(), f"python3 {words[1]}: no such file in the repository"
        return
    if program.startswith("scripts/"):
        script = ROOT / program
        assert script.is_file() and script.stat().st_mode & 0o111, f"{program}: no such executable script"
        if program == "scripts/gpu-host-run":
            verb, name, rest = words[1], words[2], words[3:]
            from builder.deploy import gpuhost

            assert verb in gpuhost.VERBS, f"scripts/gpu-host-run {verb}: no such verb"
            if verb == "layer":  # layer CAPTURE OUT [--part-mib N] [--epoch N]: no bundle name
                assert len(rest) >= 1 and set(rest[1::2]) <= {"--part-mib", "--epoch"}, f"{words}: layer CAPTURE OUT"
                return
            assert (ROOT / "scripts" / "gpu-host" / f"{name}.toml").is_file(), f"{name}: no spec in scripts/gpu-host/"
            while set(gpuhost.OWN_FLAGS) & set(rest):  # gpu-host-run's own flags, each with a value
                at = min(rest.index(f) for f in gpuhost.OWN_FLAGS if f in rest)
                rest = rest[:at] + rest[at + 2:]
            rest = [w for w in rest if w not in gpuhost.OWN_SWITCHES]  # and those without one
            if verb in ("bench", "smoke", "warm"):
                target = ["bench", "run"] if verb == "bench" else [verb]
                cmd, path, _ = resolve([*target, "CELL"])
                check_flags(cmd, path, ["CELL", *rest])
        elif program == "scripts/gpu-host-bundle":
            assert (ROOT / "scripts" / "gpu-host" / f"{words[1]}.toml").is_file(), f"{words[1]}: no spec"
        elif program == "scripts/test":
            for word in words[1:]:
                if word.startswith("tests/"):
                    assert (ROOT / word.split("::")[0]).exists(), f"{word}: no such test file"
        return
    assert program in EXTERNAL, (f"{program}: neither builder, a script of the repository nor a known program "
                                 f"({', '.join(sorted(EXTERNAL))})")


@pytest.mark.pure
def test_every_docs_block_is_run_or_marked_check_only_with_a_reason():
    assert len(SH_BLOCKS) >= 20
    run_here = [b for b in SH_BLOCKS if b[3] is None]
    assert run_here, "no command block runs here"
    for where, _, text, why in run_here:
        for words in commands(text):
            assert builder_args(words) is not None, (
                f"{where}: `{' '.join(words)}` cannot run in this test: mark its block <!-- check-only: why -->")


@pytest.mark.pure
@pytest.mark.parametrize("where, lang, text, why", [pytest.param(*b, id=b[0]) for b in SH_BLOCKS if b[3] is not None])
def test_a_check_only_block_names_existing_verbs_flags_and_scripts(where, lang, text, why):
    found = commands(text)
    assert found, f"{where}: no command in the block"
    for words in found:
        try:
            check_command(words)
        except AssertionError as exc:
            raise AssertionError(f"{where}: `{' '.join(words)}`: {exc}") from None


@pytest.mark.pure
@pytest.mark.parametrize("where, lang, text, why", [pytest.param(*b, id=b[0]) for b in SH_BLOCKS if b[3] is None])
def test_a_block_that_runs_here_exits_0(where, lang, text, why, monkeypatch):
    monkeypatch.chdir(ROOT)
    # in-process: the epoch from the environment, so that plan does not ask git for the last commit's time
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for words in commands(text):
        result = CliRunner().invoke(main, builder_args(words), catch_exceptions=False)
        assert result.exit_code == 0, f"{where}: `{' '.join(words)}` exit {result.exit_code}:\n{result.output[-2000:]}"
        assert result.output.strip(), f"{where}: `{' '.join(words)}` printed nothing"


@pytest.mark.pure
def test_the_check_finds_a_wrong_flag_a_wrong_verb_and_a_missing_script():
    for words, message in [(["scripts/builder", "build", "--archs", "80"], "has no option --archs"),
                           (["scripts/builder", "bulid"], "no such verb"),
                           (["scripts/builder", "wheels", "ls", "--quarantine"], "has no option --quarantine"),
                           (["scripts/gpu-host-run", "bench", "vllm-0.26.0", "--strategies", "all"], "no option"),
                           (["scripts/no-such-script"], "no such executable"),
                           (["curl", "http://x"], "neither builder")]:
        with pytest.raises(AssertionError, match=message):
            check_command(words)
    check_command(["scripts/builder", "bench", "IMAGE", "--strategy", "all", "--repeats", "3"])
    check_command(["python3", "-m", "builder.cli", "smoke", "CELL", "--engine-args", "--enforce-eager --x", "--env", "A=1"])
    assert commands("A=1 scripts/builder plan --profile all  # note\nmv $i $i.h; python3 -c 'x' | tail -1") == [
        ["scripts/builder", "plan", "--profile", "all"], ["mv", "$i", "$i.h"], ["python3", "-c", "x"], ["tail", "-1"]]


@pytest.mark.pure
@pytest.mark.parametrize("where, lang, text, why", [pytest.param(*b, id=b[0]) for b in TOML_BLOCKS])
def test_a_toml_block_is_a_matrix_the_schema_accepts(where, lang, text, why):
    data = tomllib.loads(text)
    if "keys" in data:  # a `builder verify --policy` file (docs/deployers.md), not a matrix
        schema.check(where, data, schema.VERIFY_POLICY)
        return
    if not set(data) <= set(schema.MATRIX.keys):  # a fragment of a profile
        data = {"profiles": {"doc": {"cuda": "13.0.3", "os": "ubuntu24.04", "python": "3.12",
                                     "engines": {"vllm": "0.33.0"}, **data}}}
    schema.check(where, data, schema.MATRIX)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    found = {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


@pytest.mark.pure
def test_every_relative_link_of_the_docs_reaches_a_file_and_its_anchor():
    bad = []
    for path in DOC_FILES:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


@pytest.mark.pure
def test_page_one_gives_one_command_for_the_main_job_and_one_for_the_suite_which_ci_runs():
    readme = [text.strip() for where, _, text, _ in SH_BLOCKS if where.startswith("README.md:")]
    assert "scripts/builder build --arch 80,90 --engine sglang" in readme
    assert "scripts/demo" in readme
    assert "scripts/test" in readme
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == "scripts/test", ".ci/run must end by running exactly the README's test command"
    assert len((ROOT / "README.md").read_text().splitlines()) < 200


# A ```yaml block whose line before is `<!-- output-of-the-block-above -->` shows what the ```sh block before it
# prints: that block's one command runs here (in-process) and its stdout must be the YAML shown, byte for byte.
OUTPUT_OF = "<!-- output-of-the-block-above -->"


def shown_outputs():
    blocks = list(command_blocks())
    for path in DOC_FILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == OUTPUT_OF:
                assert lines[i + 1] == "```yaml", f"{path.relative_to(ROOT)}:{i + 1}: {OUTPUT_OF} not before a yaml block"
                where = f"{path.relative_to(ROOT)}:{i + 2}"
                at = next(k for k, b in enumerate(blocks) if b[0] == where)
                command = blocks[at - 1]
                assert command[1] == "sh" and command[3] is None, f"{where}: the block above is no sh block run here"
                yield where, command[2], blocks[at][2]


@pytest.mark.pure
@pytest.mark.parametrize("where, command, shown", [pytest.param(*b, id=b[0]) for b in shown_outputs()])
def test_a_yaml_block_shown_as_output_is_what_the_command_prints(where, command, shown, monkeypatch):
    monkeypatch.chdir(ROOT)
    (words,) = commands(command)
    result = CliRunner().invoke(main, builder_args(words), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == shown, f"{where}: the YAML shown is not what `{command}` prints now"


@pytest.mark.pure
def test_the_deployers_page_shows_generated_yaml():
    assert any(w.startswith("docs/deployers.md") for w, _, _ in shown_outputs())


@pytest.mark.pure
def test_the_deployers_example_reads_the_config_of_an_image_publish_pushed():
    """Issue 45 item 5: the example is made from a real image's labels, not written by hand. The fixture's digest
    is the one the publish evidence records, and its labels are what builder writes (the cell, the content key,
    the JIT cache the prebuilt modules live in)."""
    (image,) = json.loads((ROOT / "tests/fixtures/serve/vllm-0.33.0-image.json").read_text())
    digest = image["RepoDigests"][0].rpartition("@")[2]
    evidence = (ROOT / "docs/evidence/2026-12-05-publish-as-built.md").read_text()
    assert digest[:len("sha256:") + 8] in evidence
    labels = image["Config"]["Labels"]
    assert labels["io.builder.cell"] == "vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-index-jitprebuilt"
    assert "-jitprebuilt" in evidence  # the cell the evidence names by its id's end
    assert len(labels["io.builder.content-key"]) == 64
    assert labels["io.builder.cache-root"] == "/opt/jit-cache"
