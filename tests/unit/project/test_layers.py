"""The import layering of the package, read from the source with ast (every import, at module level or inside a
function): no cycle between its modules and subpackages, the foundation imports nothing above it, and the
network is builder/net.py's — a module that talks to a remote imports net, never the wheel cache's remotes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.pure

PACKAGE = REPO / "builder"

# Modules every other one may build on; they import only each other.
FOUNDATION = {"errors", "redact", "net", "files", "globs", "grammar", "archs", "gencode_filter", "progress", "docker", "imageref",
              "owner", "templates", "epoch", "compile_cache", "gitmirror"}
# Modules that talk to a registry, an index or a download without being the wheel cache.
NETWORK_USERS = {"image.publish", "deploy.subject", "registry_api", "image.reuse", "doctor", "lock", "download", "pypi",
                 "steps.compile"}


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)  # "" is the package itself


def imports(package: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, names relative to the package ("cache.config")."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    top = package.name
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if name else []
        if path.name != "__init__.py":
            here = here[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1] if node.level > 1 else here
                    target = ".".join([top, *base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                targets = [(target, tuple(a.name for a in node.names))]
            else:
                continue
            for target, names in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                rel = target[len(top) + 1:]
                subs = [f"{rel}.{n}" if rel else n for n in names]
                hits = [s for s in subs if s in modules]
                found.update(hits or [rel])
        found.discard(name)
        graph[name] = found
    return graph


def unit(module: str) -> str:
    """A top-level module, or a subpackage with everything in it."""
    return module.split(".")[0]


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        for dst in targets:
            if unit(src) != unit(dst):
                out.setdefault(unit(src), set()).add(unit(dst))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return imports(PACKAGE)


def test_the_reader_sees_relative_absolute_and_function_level_imports(tmp_path):
    pkg = tmp_path / "builder"
    (pkg / "cache").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "net.py").write_text("from .errors import X\n")
    (pkg / "download.py").write_text("def f():\n    from .cache.config import down\n")
    (pkg / "cache" / "__init__.py").write_text("from ..errors import X\n")
    (pkg / "cache" / "config.py").write_text("from .. import net\nimport builder.download\nimport os\n")
    got = imports(pkg)
    assert got["net"] == {"errors"}
    assert got["download"] == {"cache.config"}
    assert got["cache"] == {"errors"}
    assert got["cache.config"] == {"net", "download"}
    assert cycles(unit_graph(got)) == [["cache", "download"]]


def test_no_cycle_between_the_modules_and_subpackages(graph):
    assert cycles(unit_graph(graph)) == []
    assert cycles(graph) == []


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports between the package's modules (the graph has no cycle): its floors are its
    arrows."""
    depth: dict[str, int] = {}

    def floors(m: str) -> int:
        if m not in depth:
            depth[m] = 0  # a cycle (test_no_cycle fails then) must not recurse forever
            depth[m] = 1 + max((floors(t) for t in graph.get(m, ()) if t in graph), default=-1)
        return depth[m]

    chain = [max(sorted(graph), key=floors)]
    while nxt := sorted(t for t in graph.get(chain[-1], ()) if t in graph and floors(t) == floors(chain[-1]) - 1):
        chain.append(nxt[0])
    return chain


def test_the_longest_import_chain_has_at_most_15_floors(graph):
    """Each floor is one more module a change must be read through; the engine's run added three (17 at ed4cf96:
    grammar imported net for redact alone, resolve imported the lock verb's network code for the lock file)."""
    chain = longest_chain(graph)
    assert len(chain) - 1 <= 15, " -> ".join(chain)


def test_the_foundation_imports_nothing_above_it(graph):
    assert FOUNDATION <= set(graph), sorted(FOUNDATION - set(graph))
    upward = {m: sorted(t for t in graph[m] if unit(t) not in FOUNDATION) for m in FOUNDATION}
    assert {m: t for m, t in upward.items() if t} == {}


def test_net_stands_on_errors_and_redact_alone(graph):
    assert graph["net"] <= {"errors", "redact"}


def test_what_a_message_may_say_is_the_ground_floor(graph):
    """builder/redact.py (redaction and describe) imports nothing of builder; the grammar and the image reference
    stand on it, not on the network (they imported net for redact alone: two floors more)."""
    assert graph["redact"] == set()
    assert "redact" in graph["grammar"] and "net" not in graph["grammar"]
    assert "redact" in graph["imageref"] and "net" not in graph["imageref"]


def test_the_network_is_nets_and_not_the_wheel_caches(graph):
    assert NETWORK_USERS <= set(graph), sorted(NETWORK_USERS - set(graph))
    through_cache = {m: sorted(t for t in graph[m] if t == "cache.config" or t.startswith("cache.config."))
                     for m in NETWORK_USERS}
    assert {m: t for m, t in through_cache.items() if t} == {}
    # what they use of the network is there
    assert all("net" in graph[m] for m in ("image.publish", "registry_api", "doctor", "lock", "download", "steps.compile"))


def test_the_fetch_plan_is_reached_through_deps(graph):
    """builder/fetchplan/ reads plans; builder/deps.py is its face to the rest of builder."""
    users = sorted(m for m, targets in graph.items()
                   if unit(m) != "fetchplan" and any(unit(t) == "fetchplan" for t in targets))
    assert users == ["deps"]
    # its phases build on each other in one direction: model, lexer and tree, the interpreter, document / script
    order = ["fetchplan.model", "fetchplan.tree", "fetchplan.lexer", "fetchplan.interpreter", "fetchplan.document",
             "fetchplan.script", "fetchplan"]
    for i, m in enumerate(order):
        later = set(order[i + 1:]) - ({"fetchplan.script"} if m == "fetchplan.document" else set())
        assert not graph[m] & later, (m, sorted(graph[m] & later))


def test_the_deployers_side_stands_apart_from_the_build(graph):
    """builder/deploy/ (smoke, bench, serve, doctor --host over an image) imports neither the build's runner and
    steps, the wheel cache nor the verbs: a deployer's image needs none of them."""
    build_side = {"runner", "steps", "cache", "cli"}
    reaches = {m: sorted(t for t in graph[m] if unit(t) in build_side)
               for m in graph if unit(m) == "deploy"}
    assert {m: t for m, t in reaches.items() if t} == {}
    assert {"deploy.subject", "deploy.runtime.gpus", "deploy.runtime.engine", "deploy.strategies", "deploy.smoke", "deploy.bench",
            "deploy.host", "deploy.serve.plan", "deploy.serve.docker", "deploy.serve.kube", "deploy.runtime.hostenv", "deploy.warm.restore",
            "deploy.gpuhost"} <= set(graph)


def test_the_runtime_stands_below_the_warm_layer(graph):
    """deploy/runtime/ (the engine, the GPUs, the image's paths, a GPU host's environment) never imports deploy/warm/:
    the warm layer is made and restored on the runtime, not the other way round (scripts/gpu-host-run's route,
    deploy/gpuhost.py, takes both)."""
    reaches = {m: sorted(t for t in graph[m] if unit(t) == "deploy" and t.startswith("deploy.warm"))
               for m in graph if m.startswith("deploy.runtime")}
    assert {m: t for m, t in reaches.items() if t} == {}
    assert {"deploy.runtime.hostenv", "deploy.warm.restore"} <= graph["deploy.gpuhost"]


# The runtime room's own floor: the cache setting and watch (deploy/runtime/caches.py) and the image's paths
# (imagepaths.py), which smoke, bench, warm and serve take (the room as a whole: test_the_deployers_rooms_...; it
# never imports deploy/warm/: test_the_runtime_stands_below_the_warm_layer).
VERB_ROOMS = ("deploy.smoke", "deploy.bench", "deploy.warm", "deploy.serve")


def test_the_cache_setting_and_the_image_paths_import_no_verbs_room(graph):
    """deploy/runtime/caches.py and imagepaths.py import nothing of smoke, bench, warm or serve, and caches.py nothing
    of the engine that uses its watch."""
    def inside(module: str, room: str) -> bool:
        return module == room or module.startswith(room + ".")

    for m in ("deploy.runtime.caches", "deploy.runtime.imagepaths"):
        assert m in graph
        assert sorted(t for t in graph[m] if any(inside(t, room) for room in VERB_ROOMS)) == [], m
    assert "deploy.runtime.engine" not in graph["deploy.runtime.caches"]
    assert "deploy.runtime.caches" in graph["deploy.runtime.engine"]


# The image's own room (builder/image/): its contract (labels, launch line), its record (ledger), its reuse, its OCI
# archive and its publication. The build's steps and the deployer's side both stand on it.
IMAGE_CONTRACT = {"image.labels", "image.launchline"}


def test_the_image_room_stands_below_the_build_and_the_deployer(graph):
    """builder/image/ imports neither the build's runner and steps, the verbs, nor the deployer's side."""
    above = {"runner", "steps", "cli", "deploy"}
    reaches = {m: sorted(t for t in graph[m] if unit(t) in above) for m in graph if unit(m) == "image"}
    assert {m: t for m, t in reaches.items() if t} == {}
    assert {"image.labels", "image.launchline", "image.ledger", "image.reuse", "image.oci", "image.publish"} <= set(graph)


# deploy/warm/ makes an image (the cold image plus one layer) and pushes it beside its cold image: it takes the
# image's archive and its publication, as the build's image and publish steps do
WARM_TAKES = {"image.oci", "image.publish", "image.attest", "image.provenance", "image.signing"}  # its publication: attested


def test_the_deployer_takes_only_the_images_contract(graph):
    """deploy/ reads an image through its contract (labels, launch line): never its record, reuse or publication
    (deploy/warm/, which makes and pushes the warm image, takes its archive and publication too); and the render
    (the build's side of the contract) imports nothing of deploy/."""
    taken = {m: sorted(t for t in graph[m] if unit(t) == "image" and t not in IMAGE_CONTRACT | {"image"}
                       and not (m.startswith("deploy.warm") and t in WARM_TAKES))
             for m in graph if unit(m) == "deploy"}
    assert {m: t for m, t in taken.items() if t} == {}
    assert not [t for t in graph["render"] if unit(t) == "deploy"]


def private_reaches(package: Path) -> list[str]:
    """`from X import _name` (and `X._name`) of another module of the package: a private name used outside its
    module."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    top = package.name
    found = []
    for name, path in modules.items():
        here = name.split(".") if name else []
        if path.name != "__init__.py":
            here = here[:-1]
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> module of the package it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1] if node.level > 1 else here
                    target = ".".join([*base, *([node.module] if node.module else [])])
                elif (node.module or "").startswith(top + ".") or node.module == top:
                    target = (node.module or "")[len(top) + 1:]
                else:
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}" if target else a.name
                    if sub in modules:
                        aliases[a.asname or a.name] = sub
                    elif a.name.startswith("_") and not a.name.startswith("__") and target != name:
                        found.append(f"{name}: from {target or top} import {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                if node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != name:
                    found.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_the_private_reach_reader_sees_both_forms(tmp_path):
    pkg = tmp_path / "builder"
    (pkg / "smoke").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "smoke" / "__init__.py").write_text("")
    (pkg / "smoke" / "layers.py").write_text("def _get(): pass\ndef _own(): return _get()\n")
    (pkg / "run.py").write_text("from .smoke import layers\nfrom .smoke.layers import _get\nlayers._find\n")
    assert private_reaches(pkg) == ["run: from smoke.layers import _get", "run: smoke.layers._find"]


def test_no_module_reaches_for_another_modules_private_name():
    assert private_reaches(PACKAGE) == []


def test_only_the_cli_entry_installs_signal_handlers():
    """SIGINT and SIGTERM are cli/app.py's (exit 130 / 143): a verb that installed its own would turn a SIGTERM
    into another exit code."""
    installs = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "signal" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "signal":
                installs.append(module_name(path, PACKAGE))
    assert sorted(set(installs)) == ["cli.app"]


# -- one docker client per side: the docker CLI through builder/docker.py, the SDK in deploy/runtime/engine.py ----------
SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _names_docker(node: ast.AST | None) -> bool:
    """Whether an argv's first element is the docker CLI: the string "docker", or a name or attribute called
    `docker` (the `--docker` binary, `opts.docker`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.split(" ")[0] == "docker"
    if isinstance(node, ast.Name):
        return node.id == "docker"
    if isinstance(node, ast.Attribute):
        return node.attr == "docker"
    return False


def _first_of(node: ast.AST, lists: dict[str, ast.AST]) -> ast.AST | None:
    """The first element of an argv expression: a list or tuple literal, a concatenation, or a local name bound
    to one of those (by the nearest enclosing function's assignments)."""
    if isinstance(node, ast.Name) and node.id in lists:
        node = lists[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _first_of(node.left, lists)
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts and not isinstance(node.elts[0], ast.Starred):
        return node.elts[0]
    return None


def docker_spawns(package: Path) -> list[str]:
    """Calls of subprocess.run / Popen / call / check_call / check_output (as `subprocess.X` or a name imported
    from subprocess) whose argv starts with the docker CLI: "module:line"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == "subprocess" for a in n.names if a.name in SPAWNERS}
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
        seen: set[int] = set()
        for scope in scopes:
            lists = {t.id: n.value for n in ast.walk(scope) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)}
            for node in ast.walk(scope):
                if not isinstance(node, ast.Call) or not node.args or id(node) in seen:
                    continue
                f = node.func
                spawns = (isinstance(f, ast.Attribute) and f.attr in SPAWNERS and isinstance(f.value, ast.Name)
                          and f.value.id == "subprocess") or (isinstance(f, ast.Name) and f.id in imported)
                if spawns:
                    seen.add(id(node))
                    if _names_docker(_first_of(node.args[0], lists)):
                        found.append(f"{module_name(path, package)}:{node.lineno}")
    return found


def test_the_docker_spawn_reader_sees_literals_names_and_imported_spawners(tmp_path):
    pkg = tmp_path / "builder"
    pkg.mkdir()
    (pkg / "a.py").write_text("import subprocess\n"
                              "def f(docker='docker'):\n    subprocess.run([docker, 'run', 'x'])\n"
                              "def g(opts):\n    argv = [opts.docker, 'commit']\n    subprocess.Popen(argv)\n"
                              "def h():\n    subprocess.run(['nvidia-smi'])\n    subprocess.run(['docker-credential-x', 'get'])\n")
    (pkg / "b.py").write_text("from subprocess import run as sh\nsh(['docker'] + ['rm', '-f', 'c'])\n")
    assert docker_spawns(pkg) == ["a:3", "a:6", "b:2"]


def test_only_docker_py_runs_the_docker_cli():
    """Every docker / buildx command goes through builder/docker.py, which logs its argv (`builder --debug`) and
    raises CommandError (argv, exit code, output tail) for a failure: no module runs the docker CLI itself."""
    assert [s for s in docker_spawns(PACKAGE) if not s.startswith("docker:")] == []


def test_only_the_deployers_engine_uses_the_docker_sdk(graph):
    """The deployer's side talks to the daemon through the docker SDK, its client made in one place
    (deploy/runtime/client.py `docker_client`), its types used by the launchers (engine.py); the build side through
    the docker CLI (builder/docker.py)."""
    users = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import) and any(a.name == "docker" or a.name.startswith("docker.") for a in node.names):
                users.append(module_name(path, PACKAGE))
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "docker":
                users.append(module_name(path, PACKAGE))
    assert sorted(set(users)) == ["deploy.runtime.client", "deploy.runtime.engine"]
    made = [module_name(p, PACKAGE) for p in sorted(PACKAGE.rglob("*.py"))
            if re.search(r"docker(_sdk)?\.from_env\(", p.read_text())]
    assert made == ["deploy.runtime.client"]


def test_the_files_the_package_runs_from_its_own_tree_are_where_the_code_looks():
    """A module moved into a room finds what it mounts or reads beside it: smoke's probe (mounted into every
    image's L0-L2 and L3 containers), rehearse's programs, the templates, the fetch plans (a probe path that
    pointed into deploy/runtime/smoke/ after the move made docker mount an empty directory: every L0 failed)."""
    from builder import deps, rehearse, templates
    from builder.deploy.runtime import engine

    assert engine.PROBE.is_file() and engine.PROBE.name == "probe.py"
    assert rehearse.PROGRAMS.is_dir() and templates.TEMPLATE_DIR.is_dir() and deps.PLAN_DIR.is_dir()


# The deployer's rooms (builder/deploy/) and what each may take of the others: runtime/ is their floor (where an engine
# runs and what its caches hold), the proof and the measure (smoke/, bench/) run engines, serve/ prints how to run
# one, warm/ boots through smoke's L3 and packs what the boot wrote; gpuhost.py assembles a GPU host's run as a verb
# does. The loose modules (subject, strategies, runflags, host) are the rooms' common ground.
DEPLOY_ROOMS = {
    "runtime": set(),
    "smoke": {"runtime"},
    "bench": {"runtime", "smoke"},
    "serve": {"runtime"},
    "warm": {"runtime", "smoke"},
    "gpuhost": {"runtime", "smoke", "warm"},  # scripts/gpu-host-run's route: a host's environment, a restore, a boot
}


def test_the_deployers_rooms_import_only_the_rooms_below_them(graph):
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "deploy" and parts[1] in DEPLOY_ROOMS else None

    assert {room(m) for m in graph} - {None} == set(DEPLOY_ROOMS)
    wrong = {m: sorted(t for t in graph[m] if room(t) not in (None, room(m)) and room(t) not in DEPLOY_ROOMS[room(m)])
             for m in graph if room(m)}
    assert {m: t for m, t in wrong.items() if t} == {}
    # the loose modules stand below every room but runtime/ (subject reads an image through the daemon's client)
    loose = {m: sorted(t for t in graph[m] if room(t) not in (None, "runtime"))
             for m in graph if m.startswith("deploy.") and room(m) is None}
    assert {m: t for m, t in loose.items() if t} == {}


@pytest.mark.parametrize("room", ["image", "deploy", "deploy/runtime", "deploy/serve", "deploy/warm"])
def test_each_room_says_what_it_holds_and_what_it_may_not_import(room):
    """A room's docstring names every module in it (a module added without a word fails here) and says what it may
    not import, as the rules above hold it."""
    import ast as ast_mod

    folder = PACKAGE / room
    doc = ast_mod.get_docstring(ast_mod.parse((folder / "__init__.py").read_text())) or ""
    modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if m not in doc] == []
    assert "import" in doc and "tests/unit/project/test_layers.py" in doc
