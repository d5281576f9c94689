"""builder/options.py: the options of a run, typed and built once, their defaults as data, and the paragraph of
what differs from those defaults."""

from __future__ import annotations

import tomllib

from builder import matrix as matrix_mod
from builder import options
from builder.options import BuildFlags, CacheFlags, HostFlags

from tests.helpers import MATRIX, REPO, run_cli, write_matrix

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml"
DATA = tomllib.loads((REPO / "builder" / "data" / "defaults.toml").read_text())


def test_a_matrix_without_defaults_takes_every_default_from_the_data_file(tmp_path):
    text = MATRIX.read_text()
    profiles = text[text.index("[profiles."):]
    m = matrix_mod.load(write_matrix(tmp_path, 'defaults.profile = "cu130"\n' + profiles))
    for key, value in DATA["matrix"].items():
        if key != "cache":  # [defaults.cache] is parsed into remote specs
            assert m.defaults[key] == value, key
    assert m.defaults["source_date_epoch"] is None


def test_the_summary_names_what_differs_and_only_that():
    m = matrix_mod.load(FIXTURE)
    flags = BuildFlags(max_jobs=2, keep_going=True, smoke=False, cache=CacheFlags(no_remote=True),
                       host=HostFlags(builder="remote1", provenance=True))
    text = options.summary(m, matrix_mod.Selection(archs=(80,), engines=("cuda-ext",)), flags, width=10_000)
    for said in ("matrix " + str(FIXTURE), "defaults.registry = 127.0.0.1:5000/builder-test",
                 "defaults.base_images.devel = builder-local/cuda:13.0-devel", "--arch 80", "--engine cuda-ext",
                 "--max-jobs 2", "--keep-going", "--no-smoke", "--no-remote", "--builder remote1", "--provenance"):
        assert said in text, (said, text)
    for unsaid in ("--work-dir", "--log-dir", "--progress", "--smoke-model", "defaults.index", "runners"):
        assert unsaid not in text, (unsaid, text)
    assert "\n" not in options.summary(m, None, BuildFlags(), width=10_000)


def test_the_plain_run_of_the_shipped_matrix_says_it_runs_on_the_defaults(monkeypatch):
    monkeypatch.chdir(REPO)
    assert options.summary(matrix_mod.load(MATRIX), matrix_mod.Selection(), BuildFlags()) == \
        "options: the defaults of builder/data/defaults.toml"


def test_build_options_are_assembled_once_for_build_and_verify_repro():
    m = matrix_mod.load(FIXTURE)
    flags = BuildFlags(work_dir="w", log_dir="l", max_jobs=3, host=HostFlags(builder="b1", layer_cache="registry",
                                                                              provenance=True))
    build = options.build_options(m, flags, "1700000000")
    repro = options.build_options(m, flags, "1700000000", repro=True)
    assert build.max_jobs == repro.max_jobs == 3 and build.builder == repro.builder == "b1"
    assert build.work_dir.name == "w" and build.log_dir.name == "l"
    assert build.layer_cache == "127.0.0.1:5000/builder-test/buildcache" and build.attest
    assert not build.no_cache and repro.no_cache and repro.layer_cache is None and repro.attest == ()
    assert build.pins_dir == FIXTURE.resolve().parent / "runtime-pins"


def test_build_prints_the_summary_before_any_work(tmp_path):
    res = run_cli("build", "--matrix", str(FIXTURE), "--arch", "80", "--dry-run", "--no-remote",
                  "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "work"))
    assert res.exit_code == 0, res.output
    assert "options: matrix " in res.output and "--arch 80" in res.output and "--dry-run" in res.output
    assert res.output.index("options: ") < res.output.index("docker buildx build")
