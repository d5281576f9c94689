"""The docs stay true to the code: the generated reference pages (docs/reference/) are what scripts/gen-reference
writes from builder/schema.py, builder/data/defaults.toml and the click commands today."""
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def generator():
    loader = SourceFileLoader("gen_reference", str(ROOT / "scripts" / "gen-reference"))
    module = module_from_spec(spec_from_loader("gen_reference", loader))
    loader.exec_module(module)
    return module


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


@pytest.mark.pure
def test_a_stale_page_is_named_with_the_command_that_regenerates_it(tmp_path, capsys):
    gen = generator()
    for name, text in gen.pages().items():
        (tmp_path / name).write_text(text)
    assert gen.stale(tmp_path) == []
    (tmp_path / "matrix.md").write_text(gen.pages()["matrix.md"].replace('"cu130"', '"cu121"'))
    (tmp_path / "cli.md").unlink()
    assert gen.stale(tmp_path) == ["cli.md", "matrix.md"]
