"""builder/deploy/runtime/caches.py: one value says where a boot's compile caches go (an image's labels, the cell's
engine data, --cache-root under it), made there and put into the options by their caller; the cell's cache root
has one derivation (engines.Knowledge.cache_root_of) and --cache-root one declaration (cli/flags.py)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from builder.deploy.bench import run as bench_run
from builder.deploy.runtime import caches
from builder.deploy.smoke.layers import Model, SmokeOptions
from builder.image import labels as labels_mod

from tests.helpers import REPO, stand_in_cell

pytestmark = pytest.mark.pure

IMAGE = {labels_mod.CACHE_ROOT: "/opt/jit-cache",
         labels_mod.CACHE_ENV: "VLLM_CACHE_ROOT=/opt/jit-cache/vllm TRITON_CACHE_DIR=/opt/jit-cache/triton",
         labels_mod.WARM_ALLOWANCE: "*.lock flashinfer/*.log"}
WARM = {**IMAGE, labels_mod.WARM: "1", f"{labels_mod.WARM}.of": "sha256:" + "0" * 64}


@pytest.fixture(scope="module")
def cell():
    return stand_in_cell()


def test_an_images_setting_is_its_labels():
    got = caches.of_image(IMAGE)
    assert (got.root, got.source, got.allowance, got.warm) == ("/opt/jit-cache", caches.LABELS, None, False)
    assert got.env == {"VLLM_CACHE_ROOT": "/opt/jit-cache/vllm", "TRITON_CACHE_DIR": "/opt/jit-cache/triton"}
    # a warm image: its boot may write only the allowance its labels name
    warm = caches.of_image(WARM)
    assert warm.allowance == ("*.lock", "flashinfer/*.log") and warm.warm and warm.root == got.root
    # an image built before its caches had one root: nothing set, nothing watched
    assert caches.of_image({}) == caches.NONE and not caches.NONE.root and caches.NONE.env == {}


def test_a_cells_setting_is_its_engine_data_at_the_image_root_or_under_cache_root(cell):
    own = caches.of_cell(cell)
    assert (own.root, own.source, own.allowance) == (cell.cache_root, caches.CELL, None)
    assert own.variables == cell.compile_caches and own.root == "/opt/jit-cache"
    moved = caches.of_cell(cell, "/scratch/jit/")  # --cache-root: each cache at its variable, under that root
    assert (moved.root, moved.source) == ("/scratch/jit", caches.FLAG)
    assert moved.env == {k: "/scratch/jit" + v[len(cell.cache_root):] for k, v in cell.compile_caches}
    assert caches.of_cell(cell, "") == own  # an empty --cache-root is the image's own root
    # a release whose engine data names no compile caches: none, whatever --cache-root says
    bare = dataclasses.replace(cell, cache_root="", compile_caches=())
    assert caches.of_cell(bare) == caches.NONE and caches.of_cell(bare, "/scratch/jit") == caches.NONE


def test_what_the_options_already_hold_wins_over_the_labels(cell):
    given = caches.of_cell(cell, "/scratch/jit")
    assert caches.of_image(IMAGE, given) == given  # its root, with its variables
    facts = tuple(sorted(labels_mod.warm(WARM).items()))  # what the layer was made for: the judge's, always the image's
    assert caches.of_image(WARM, given) == dataclasses.replace(given.warm_boot(("*.lock", "flashinfer/*.log")),
                                                               warm_facts=facts)  # no allowance of its own
    expecting = given.warm_boot(("*.lock",))
    assert caches.of_image(WARM, expecting).allowance == ("*.lock",)  # its own allowance wins too
    # an allowance without a root: the labels' root and variables, the given allowance
    only_allowance = caches.NONE.warm_boot(())
    got = caches.of_image(WARM, only_allowance)
    assert (got.root, got.source, got.allowance) == ("/opt/jit-cache", caches.LABELS, ())
    assert caches.of_image({}, given) == given


def test_the_setting_is_a_value_and_no_options_object_is_filled(cell, tmp_path):
    smoke_opts = SmokeOptions(strategies=("MTP2",), model=Model(tmp_path))
    bench_opts = bench_run.BenchOptions(strategies=("none",), workload=None, model=Model(tmp_path))
    before = (dict(vars(smoke_opts)), dict(vars(bench_opts)))
    setting = caches.of_cell(cell, str(tmp_path / "root"))
    warm = setting.warm_boot(cell.warm_globs)
    caches.of_image(WARM, smoke_opts.caches)
    assert (dict(vars(smoke_opts)), dict(vars(bench_opts))) == before
    assert smoke_opts.caches == bench_opts.caches == caches.NONE and setting.allowance is None and warm.warm
    with pytest.raises(dataclasses.FrozenInstanceError):
        setting.root = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        smoke_opts.cache_root = "/elsewhere"  # type: ignore[misc]  # read only: caches.root
    placed = dataclasses.replace(smoke_opts, caches=setting)  # how a caller puts it in
    assert placed.cache_root == setting.root and placed.caches.env == setting.env
    setting.env["X"] = "y"  # a copy: the setting's variables stay as made
    assert "X" not in setting.env


def test_the_cells_cache_root_has_one_derivation(cell):
    """resolve (a matrix's cell) and deploy/subject.py (an image's cell, from its labels) both take it from
    engines.Knowledge.cache_root_of: jit_cache_root for a release with compile caches, "" without."""
    from builder.engines import load_knowledge

    kn = load_knowledge()
    recipe = cell.engine_recipe
    assert recipe.compile_caches and kn.cache_root_of(recipe) == kn.jit_cache_root() == cell.cache_root
    assert kn.cache_root_of(dataclasses.replace(recipe, compile_caches=())) == ""
    sources = {p: p.read_text() for p in (REPO / "builder").rglob("*.py")}
    derive = sorted(str(p.relative_to(REPO)) for p, text in sources.items() if "jit_cache_root() if" in text)
    callers = sorted(str(p.relative_to(REPO)) for p, text in sources.items() if ".cache_root_of(" in text)
    assert derive == ["builder/engines.py"] and callers == ["builder/deploy/subject.py", "builder/resolve.py"]


def test_cache_root_is_declared_once_and_taken_by_smoke_bench_and_warm():
    import click

    from builder.cli.app import main

    declared = []
    for path in sorted((REPO / "builder" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in ("--cache-root", "--image-paths"):
                declared.append((path.name, node.value))
    assert sorted(declared) == [("flags.py", "--cache-root"), ("flags.py", "--image-paths")]
    ctx = click.Context(main)
    commands = {"smoke": main.get_command(ctx, "smoke"), "bench": main.get_command(ctx, "bench").commands["run"],
                "warm": main.get_command(ctx, "warm")}
    helps = {verb: next(p.help for p in cmd.params if p.name == "cache_root") for verb, cmd in commands.items()}
    assert all(h.startswith("With --launcher process: the directory the engine's compile caches go to")
               for h in helps.values()), helps
    assert {verb for verb, cmd in commands.items() if any(p.name == "image_paths" for p in cmd.params)} == \
        {"smoke", "warm"}


def test_the_cache_watch_lives_with_the_setting():
    """What a boot wrote under the root is caches.py's; engine.py (the launchers and the boot loop) uses it."""
    from builder.deploy.runtime import engine

    for name in ("Written", "container_written", "process_written", "snapshot"):
        assert getattr(engine, name) is getattr(caches, name)
    text = Path(engine.__file__).read_text()
    assert "def container_written" not in text and "def snapshot" not in text and "_root_tar" not in text
