"""builder/fanout.py and the runner's fan-out: `--builder A,B` parsed and refused in one line, every cell assigned to
one builder by rendezvous hashing (stable, order-free, few moves when the list changes), one worker per builder over
the fixture's two cells with the real audit and cache steps (BuildKit replaced by the test doubles of
tests/helpers.py, named as such; the real two-builder build is tests/docker/builds/test_fanout.py), and the shared
display writing whole lines from several threads."""

from __future__ import annotations

import io
import itertools
import threading

import pytest

from builder import fanout, matrix, plan, report, resolve, runner
from builder.cache.local import Wheelhouse
from builder.errors import UserError
from builder.progress import Display
from builder.resources import Host
from builder.steps import BuildOptions
from builder.steps.audit import AuditStep
from builder.steps.cache import CacheStep

from tests.helpers import REPO, FakeCompile, FakeImage

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST = Host(cores=2, free_gb=16.0)

CELLS = [f"vllm-0.{minor}.0-cu130-torch2.{minor % 5}.0-py312-sm{arch}" for minor in range(20) for arch in (80, 90)]


@pytest.mark.pure
@pytest.mark.parametrize("value, names", [
    (None, ()), ("one", ("one",)), ("a,b", ("a", "b")), (" a , b.c_d-2 ", ("a", "b.c_d-2")),
])
def test_the_builder_list_is_parsed_in_the_order_given(value, names):
    assert fanout.parse(value) == names


@pytest.mark.pure
@pytest.mark.parametrize("value, said", [
    ("a,,b", "has an empty item"), ("a,", "has an empty item"), ("", "has an empty item"), (",", "has an empty item"),
    ("a,b,a", "a named twice"), ("a,b c", "is not a builder name"), ("a,../x", "--builder"),
])
def test_a_bad_builder_list_is_refused_in_one_line(value, said):
    with pytest.raises(UserError) as err:
        fanout.parse(value)
    assert said in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("--builder")


@pytest.mark.pure
def test_a_cell_sticks_to_one_builder_whatever_else_is_selected_and_the_list_order():
    builders = ("alpha", "beta", "gamma")
    every = fanout.assign(CELLS, builders)
    assert set(every.values()) == set(builders)  # 40 cells: every builder gets some
    assert fanout.assign(CELLS[5:9], builders) == {c: every[c] for c in CELLS[5:9]}  # --only takes a few: same builders
    assert fanout.assign(CELLS, ("gamma", "alpha", "beta")) == every  # the list's order does not matter
    assert fanout.assign(CELLS, builders) == every  # and a second run agrees (nothing random, no process state)


@pytest.mark.pure
def test_adding_a_builder_moves_only_the_cells_it_wins_and_removing_one_only_its_own():
    before = fanout.assign(CELLS, ("alpha", "beta"))
    after = fanout.assign(CELLS, ("alpha", "beta", "gamma"))
    moved = [c for c in CELLS if before[c] != after[c]]
    assert moved and all(after[c] == "gamma" for c in moved)
    assert fanout.assign(CELLS, ("alpha", "beta")) == before  # gamma gone: its cells go back where they were


def planned(matrix_path, wheelhouse):
    return plan.plan_cells(resolve.select(matrix.load(matrix_path), matrix.Selection()), wheelhouse)


def options(tmp, **kw) -> BuildOptions:
    return BuildOptions(work_dir=tmp / "work", log_dir=tmp / "logs", index_url="https://pypi.org/simple", **kw)


def two_builders(cell_ids: list[str]) -> tuple[str, str]:
    """Two builder names that rendezvous hashing gives one cell each (first cell → first builder)."""
    for a, b in itertools.permutations([f"b{i}" for i in range(10)], 2):
        where = fanout.assign(cell_ids, (a, b))
        if [where[c] for c in cell_ids] == [a, b]:
            return a, b
    raise AssertionError("no pair of names splits the cells")


def test_each_builder_runs_its_own_cells_and_a_failure_stops_only_its_builder(tmp_path):
    """Without --keep-going a failed cell stops its own builder's cells only: the other builder's cell still runs and
    the outcomes come back in plan order, each naming its builder (table and JSON)."""
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = planned(FIXTURE / "matrix-two.toml", wh)
    ids = [p.cell.id for p in plans]
    bad, good = two_builders(ids)
    assert runner.lanes(plans, (bad, good)) == {bad: plans[:1], good: plans[1:]}
    compile_ = FakeCompile(fail_for={"cuda-ext-badknob": FileNotFoundError("exported no .whl")})
    stream = io.StringIO()
    display = Display("plain", stream=stream)
    outcomes = runner.run_cells(plans, wh, options(tmp_path, builders=(bad, good), display=display),
                                display.say, HOST, steps=(compile_, AuditStep(), CacheStep(), FakeImage()))
    assert [(o.cell.id, o.builder) for o in outcomes] == [(ids[0], bad), (ids[1], good)]
    assert not outcomes[0].ok and sorted(compile_.ran) == ["cuda-ext", "cuda-ext-badknob"]
    # these builders do not exist, so the failed cell's reason says its builder does not answer
    assert outcomes[0].error.startswith(f"builder {bad} does not answer (")
    lines = stream.getvalue().splitlines()
    assert any(line.startswith(f"[builder {bad}] [{ids[0]}] FAILED") for line in lines)
    assert any(line.startswith(f"[builder {good}] [{ids[1]}]") for line in lines)
    table = report.format_table(outcomes, planned=2)
    assert table.splitlines()[0].split()[:3] == ["cell", "builder", "result"]
    assert report.outcome_json(outcomes[1])["builder"] == good


@pytest.mark.pure
def test_one_builder_or_none_keeps_the_one_after_another_run(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = planned(FIXTURE / "matrix-two.toml", wh)
    compile_ = FakeCompile(fail_for={"cuda-ext-badknob": FileNotFoundError("exported no .whl")})
    outcomes = runner.run_cells(plans, wh, options(tmp_path, builder="solo", builders=("solo",)), lambda s: None,
                                HOST, steps=(compile_, AuditStep(), CacheStep(), FakeImage()))
    assert len(outcomes) == 1 and outcomes[0].builder is None and compile_.ran == ["cuda-ext-badknob"]
    assert "builder" not in report.format_table(outcomes, planned=2).splitlines()[0].split()


@pytest.mark.pure
def test_lines_said_from_several_builders_at_once_are_never_cut():
    stream = io.StringIO()
    display = Display("plain", stream=stream)
    lanes = [display.lane(f"[builder b{i}] ") for i in range(4)]

    def chatter(lane) -> None:
        for n in range(300):
            lane.say(f"[cell] step {n} " + "x" * 50)

    threads = [threading.Thread(target=chatter, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1200
    assert all(line.startswith("[builder b") and line.endswith("x" * 50) and line.count("[builder") == 1 for line in lines)


@pytest.mark.pure
def test_a_progress_label_carries_its_builder():
    stream = io.StringIO()
    tracker = Display("plain", stream=stream).lane("[builder b1] ").track("[cell] compile cuda-ext", None)
    assert tracker.label == "[builder b1] [cell] compile cuda-ext"
