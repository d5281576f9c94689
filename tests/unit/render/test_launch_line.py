"""One launch line: the image's ENTRYPOINT that render writes, the `docker run` that `builder serve` prints and
what smoke L3 starts come from one derivation (builder/image/launchline.py). For every shipped cell and strategy the
argv L3 would start in a container (the image's own ENTRYPOINT + its arguments) equals the rendered ENTRYPOINT
plus what `builder serve` prints after the image, and the process launcher runs the same line with host paths.
(No Docker: the docker launcher here is given a client it never calls; the container run itself is
tests/docker/deploy/test_smoke_docker.py, whose stand-in image runs its own ENTRYPOINT.)"""

from __future__ import annotations

import json
import re

import pytest

from builder import plan, render
from builder.deploy.serve import docker as serve
from builder.deploy.serve import fit
from builder.engines import load_knowledge
from builder.matrix import Selection, load
from builder.resolve import select
from builder.deploy.smoke import layers
from builder.deploy.runtime.engine import DockerLauncher, ProcessLauncher

from tests.helpers import MATRIX

CASES = [(c, s) for c in select(load(MATRIX), Selection(profiles=("all",))) for s in c.strategies]


@pytest.mark.pure
def test_every_shipped_profile_with_strategies_is_compared():
    assert {c.profile.name for c, _ in CASES} == {"cu130"} and len(CASES) == 6  # cu121 cells run none


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "Qwen3.8-27B-FP8"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d


@pytest.mark.pure
@pytest.mark.parametrize("cell, strategy", CASES, ids=[f"{c.id}-{s}" for c, s in CASES])
def test_l3_starts_what_builder_serve_prints_after_the_images_own_entrypoint(cell, strategy, model):
    p = plan.plan_cells([cell], None)[0]
    text = render.render(p, load(MATRIX).defaults["index"])
    (entry,) = re.findall(r"^ENTRYPOINT (.+)$", text, re.M)
    image = "127.0.0.1:5000/builder/" + cell.engine + ":" + cell.tag
    line = serve.serve_line(image, dict(render.labels(cell, p.keys)), load_knowledge(), strategy, model, port=8000)
    served = line.argv[line.argv.index(image) + 1:]
    # serve's one addition: how the engine stops (the engine data's drain flag, builder/deploy/serve/fit.py); smoke
    # stops an engine it has finished with
    drain = list(fit.Shutdown.of(cell.engine_recipe, fit.DEFAULT_DRAIN_S).args)
    assert served[len(served) - len(drain):] == drain
    served = served[:len(served) - len(drain)]

    opts = layers.SmokeOptions(strategies=(strategy,), model=layers.Model(model))
    docker_line = layers.engine_line(cell, DockerLauncher(image, client=object()), opts,
                                     cell.engine_recipe.strategy(strategy), 8000)
    assert list(docker_line.entrypoint) == json.loads(entry)
    assert list(docker_line.args) == served

    process_line = layers.engine_line(cell, ProcessLauncher(), opts, cell.engine_recipe.strategy(strategy), 8000)
    assert process_line.entrypoint == docker_line.entrypoint
    assert list(process_line.args) == [str(model) if a == f"/models/{model.name}" else "127.0.0.1" if a == "0.0.0.0"
                                       else a for a in served]


HOSTILE = ['org/a","num_speculative_tokens":99,"method":"ngram', 'a"}, {"x": "', "back\\slash\\", "line\nbreak",
           "{drafter}", '"', "ünïcode ✓", "x" * 4096]


@pytest.mark.pure
@pytest.mark.parametrize("engine,version", [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_every_strategy_flag_takes_any_value_as_one_value(engine, version):
    """Issue 46 item 4: `--drafter` was pasted raw into `--speculative-config`'s JSON, so `org/a","method":"ngram`
    changed the speculative method. Every strategy flag of every engine is filled with hostile values: a JSON flag
    keeps exactly its keys, each value lands whole in its string; any other flag is one argv element equal to the
    plain substitution."""
    recipe = load_knowledge().recipe(engine, version)
    checked = 0
    for strategy in recipe.strategies.values():
        for hostile in HOSTILE:
            values = {"model": hostile + "-model", "drafter": hostile, "host": "0.0.0.0", "port": "8000"}
            line = launch_line_args(recipe, strategy, values)
            for template in strategy.flags:
                filled = line[strategy.flags.index(template)]
                if template.startswith('{"'):  # a JSON value (a bare "{model}" is a placeholder)
                    want = {k: (v.replace("{drafter}", hostile).replace("{model}", hostile + "-model")
                                if isinstance(v, str) else v) for k, v in json.loads(template).items()}
                    assert json.loads(filled) == want, (strategy.name, filled)
                else:
                    assert filled == template.replace("{drafter}", hostile).replace("{model}", hostile + "-model")
                checked += 1
    assert checked >= 3 * len(HOSTILE) * 2


def launch_line_args(recipe, strategy, values) -> list[str]:
    """The strategy's flags as launch_line fills them (they follow the model, serve args and tiny/dummy flags)."""
    from builder.image.launchline import launch_line

    args = list(launch_line(recipe, strategy, values).args)
    without = list(launch_line(recipe, None, values).args)
    assert args[:len(without)] == without
    return args[len(without):len(without) + len(strategy.flags)]
