"""The GPU-host route as scripts: scripts/gpu-host-bundle (repacks the engine wheel without the members a spec
strips, checks the set's requirements against each other, splits one tar into parts with SHA256SUMS) and
scripts/gpu-host-run (joins the parts that arrived over several calls, checks every sha256, installs, writes
the interpreter wrapper). Exercised here on small wheels made in the test; no network."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers import load_script as load


def wheel(dest: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {**files, f"{info}/METADATA": meta, f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in members) + f"{info}/RECORD,,\n"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in {**members, f"{info}/RECORD": record}.items():
            z.writestr(k, v)
    return path


def test_repack_leaves_out_the_stripped_members_and_their_record_lines(tmp_path):
    bundle = load("gpu-host-bundle")
    w = wheel(tmp_path, "eng", "1.0", {"eng/__init__.py": "", "eng/_fa2_C.abi3.so": "x" * 1000, "eng/keep.so": "y"})
    (tmp_path / "out").mkdir()
    out, removed = bundle.repack(w, ["eng/_fa2_C*.so"], tmp_path / "out")
    assert removed == ["eng/_fa2_C.abi3.so"]
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        record = z.read("eng-1.0.dist-info/RECORD").decode()
    assert "eng/_fa2_C.abi3.so" not in names and "eng/keep.so" in names
    assert "_fa2_C" not in record and "eng/keep.so" in record


def test_the_bundle_refuses_a_wheel_set_whose_requirements_do_not_hold(tmp_path):
    bundle = load("gpu-host-bundle")
    a = wheel(tmp_path, "aaa", "1.0", {"aaa/__init__.py": ""}, ("bbb>=2", "ccc>=9; python_version < '3.0'"))
    b = wheel(tmp_path, "bbb", "1.5", {"bbb/__init__.py": ""})
    assert bundle.conflicts([a, b], "3.12") == [f"{a.name} requires bbb>=2, the bundle has bbb 1.5"]
    b2 = wheel(tmp_path, "bbb", "2.1", {"bbb/__init__.py": ""})
    assert bundle.conflicts([a, b2], "3.12") == []


def test_run_joins_parts_from_several_calls_checks_every_sha256_and_installs(tmp_path):
    store = tmp_path / "store"
    name = "unit-bundle-test"
    w = wheel(tmp_path, "purepkg", "1.0", {"purepkg/__init__.py": "VALUE = 42\n"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(w, arcname=f"wheels/{w.name}")
    blob = buf.getvalue()
    parts_dir = store / name
    parts_dir.mkdir(parents=True)
    sums = [f"{hashlib.sha256(blob).hexdigest()}  bundle.tar"]
    size = len(blob) // 3 + 1
    for i in range(0, len(blob), size):  # as if stashed by earlier calls
        p = parts_dir / f"part-{i // size:02d}"
        p.write_bytes(blob[i:i + size])
        sums.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}")
    (parts_dir / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    env = {**os.environ, "BUILDER_CARRY_STORE": str(store)}
    run = lambda: subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-host-run"), "install", name],
                                 capture_output=True, text=True, env=env, timeout=300)
    good = (parts_dir / "part-01").read_bytes()
    (parts_dir / "part-01").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    bad = run()
    assert bad.returncode != 0 and "part-01: sha256 differs" in bad.stderr
    (parts_dir / "part-01").write_bytes(good)
    (parts_dir / "part-02").unlink()
    missing = run()
    assert missing.returncode != 0 and "parts part-02 have not arrived" in missing.stderr
    (parts_dir / "part-02").write_bytes(blob[2 * size:])
    ok = run()
    assert ok.returncode == 0, ok.stderr
    py = store / f"py-{name}"
    out = subprocess.run([str(py), "-c", "import purepkg; print(purepkg.VALUE)"], capture_output=True, text=True)
    assert out.stdout.strip() == "42", out.stderr


# -- names, the wrapper, the store: no shell built from values, no path out of .carry/ or the store --------------
def bundle_parts(store: Path, name: str, blob: bytes, size: int) -> list[Path]:
    """The store as gpu-host-bundle's parts and SHA256SUMS of `blob` make it (part-00, ..., part-99, part-100)."""
    d = store / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("part-*"):
        old.unlink()
    sums, parts = [f"{hashlib.sha256(blob).hexdigest()}  bundle.tar"], []
    for i in range(0, len(blob), size):
        p = d / f"part-{i // size:02d}"
        p.write_bytes(blob[i:i + size])
        sums.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}")
        parts.append(p)
    (d / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return parts


def wheel_tar(tmp: Path, value: str, padding: int = 0) -> bytes:
    w = wheel(tmp, "purepkg", "1.0", {"purepkg/__init__.py": f"VALUE = {value!r}\n", "purepkg/pad.txt": "x" * padding})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(w, arcname=f"wheels/{w.name}")
    return buf.getvalue()


def gpu_host_run(*args: str, store: Path, root: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "scripts" / "gpu-host-run"), *args], capture_output=True,
                          text=True, timeout=300, cwd=root,
                          env={**os.environ, "BUILDER_CARRY_STORE": str(store), "PYTHONPATH": str(REPO), **(env or {})})


def value_of(py: Path) -> str:
    out = subprocess.run([str(py), "-c", "import purepkg; print(purepkg.VALUE)"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_run_joins_more_than_a_hundred_parts_in_the_order_of_their_numbers(tmp_path):
    store, name = tmp_path / "store", "unit-many-parts"
    blob = wheel_tar(tmp_path, "many")
    parts = bundle_parts(store, name, blob, len(blob) // 104 + 1)
    assert len(parts) >= 101 and sorted(p.name for p in parts)[:3] == ["part-00", "part-01", "part-02"]
    assert sorted(p.name for p in parts).index("part-100") < sorted(p.name for p in parts).index("part-11")  # by name: wrong
    ok = gpu_host_run("install", name, store=store)
    assert ok.returncode == 0, ok.stderr
    assert value_of(store / f"py-{name}") == "many"


def test_a_new_bundle_under_an_installed_name_is_installed_not_ignored(tmp_path):
    store, name = tmp_path / "store", "unit-reinstall"
    old = wheel_tar(tmp_path, "old")
    bundle_parts(store, name, old, len(old) // 2 + 1)
    assert gpu_host_run("install", name, store=store).returncode == 0
    assert value_of(store / f"py-{name}") == "old"
    again = gpu_host_run("install", name, store=store)
    assert again.returncode == 0 and "already installed" in again.stderr
    # what the route says of its bundle goes to stderr: stdout is the verb's own (snapshot --json on a GPU host
    # came back as the install's lines followed by the JSON)
    assert again.stdout == ""
    new = wheel_tar(tmp_path, "new", padding=5000)
    parts = bundle_parts(store, name, new, len(new) // 3 + 1)
    kept = parts[1].read_bytes()
    parts[1].write_bytes(old[:len(kept)])  # the old bundle's part where the new one's has not arrived yet
    early = gpu_host_run("install", name, store=store)
    assert early.returncode == 1 and "part-01: sha256 differs" in early.stderr, early.stderr
    assert value_of(store / f"py-{name}") == "old"  # the installed bundle is left as it was
    parts[1].write_bytes(kept)
    done = gpu_host_run("install", name, store=store)
    assert done.returncode == 0 and "installing bundle" in done.stderr and done.stdout == "", done.stdout + done.stderr
    assert value_of(store / f"py-{name}") == "new"


def test_the_wrapper_quotes_a_store_path_with_a_space_and_shell_text(tmp_path):
    marker = tmp_path / "injected"
    store = tmp_path / f"my store $(touch {marker}) `touch {marker}`"
    name = "unit-quoted-store"
    blob = wheel_tar(tmp_path, "quoted")
    bundle_parts(store, name, blob, len(blob) // 2 + 1)
    ok = gpu_host_run("install", name, store=store)
    assert ok.returncode == 0, ok.stderr
    assert value_of(store / f"py-{name}") == "quoted"
    assert not marker.exists()


BAD_NAMES = ["$(touch {marker})", "`touch {marker}`", "a;touch {marker}", "../escape", "..", ".", "a/b", "/abs",
             "a b", "a\nb", "", "-rf", "x" * 200, "a|b", "a&b", "a>b", "'quoted'", "\"dq\"", "naïve", "a\\b"]


def _gpu_host_bad_inputs() -> list[tuple[str, list[str], str]]:
    """(script, its arguments with {marker}, what the message names): every one exits 2, runs nothing, makes nothing
    outside .carry/ or the store (and no marker: no shell text ran)."""
    out = []
    for i, n in enumerate(BAD_NAMES):
        out.append(("gpu-host-run", ["install", n], "name"))
        out.append(("gpu-host-bundle", [n], "name"))
        if i % 2 == 0:
            out.append(("gpu-host-run", ["stash", n], "name"))
            out.append(("gpu-host-run", ["bench", n, "--strategy", "none"], "name"))
        else:
            out.append(("gpu-host-run", ["smoke", n], "name"))
            out.append(("gpu-host-run", ["bench", "vllm-0.26.0", "--client", n], "name"))
            out.append(("gpu-host-run", ["bench", "vllm-0.26.0", "--with", n], "name"))
    for v in ("0", "-1", "-58", "abc", "1.5", "", "1e3", "99999", "0x10", " "):
        out.append(("gpu-host-bundle", ["vllm-0.26.0", "--part-mib", v], "--part-mib"))
    # layer CAPTURE OUT: what is no capture, a part size or time that is none, too few arguments
    out += [("gpu-host-run", ["layer", "nocapture", "o"], "not a warm capture"),
            ("gpu-host-run", ["layer", "nocapture"], ""),
            ("gpu-host-run", ["layer", "nocapture", "o", "p"], "layer:"),
            ("gpu-host-run", ["layer", "nocapture", "o", "--bogus"], "layer:")]
    for v in ("0", "-1", "abc", "1.5", "", "99999", "0x10", "$(touch {marker})"):
        out.append(("gpu-host-run", ["layer", "nocapture", "o", "--part-mib", v], "--part-mib"))
    for v in ("-1", "x", "1" * 40, "1e9", "7258118401"):
        out.append(("gpu-host-run", ["layer", "nocapture", "o", "--epoch", v], "--epoch"))
    out += [("gpu-host-run", ["bench", "vllm-0.26.0", "--client"], "--client needs"),
            ("gpu-host-run", ["smoke", "vllm-0.26.0", "--with"], "--with needs"),
            ("gpu-host-run", ["install"], ""),
            ("gpu-host-bundle", ["no-such-spec-anywhere"], "no spec")]
    return out


GPU_HOST_BAD = _gpu_host_bad_inputs()


@pytest.fixture(scope="module")
def script_root(tmp_path_factory) -> Path:
    """A checkout of the two scripts and the specs in a temp dir: ROOT there, so .carry/ and anything a bad name
    could make outside it are in view (builder itself is imported from the checkout)."""
    root = tmp_path_factory.mktemp("root")
    shutil.copytree(REPO / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("script, args, expect", GPU_HOST_BAD, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(GPU_HOST_BAD)])
def test_gpu_host_scripts_refuse_bad_names_and_part_sizes_and_run_no_shell_text(script, args, expect, script_root,
                                                                               tmp_path):
    marker = tmp_path / "injected"
    store = tmp_path / "store"
    args = [a.replace("{marker}", str(marker)) for a in args]
    before = _tree(script_root)
    res = subprocess.run([sys.executable, str(script_root / "scripts" / script), *args], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**os.environ, "BUILDER_CARRY_STORE": str(store), "PYTHONPATH": str(REPO),
                              "PIP_NO_INDEX": "1"})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    if expect:
        assert expect in res.stderr and "error" in res.stderr, res.stderr
    assert not marker.exists(), "shell text in a value ran"
    assert _tree(script_root) == before and not store.exists() and not (tmp_path.parent / "escape").exists()


def test_bundle_then_run_end_to_end_from_local_wheels_in_parts_of_one_mib(script_root, tmp_path):
    """gpu-host-bundle on a spec of one local wheel (pip finds it in a folder: no index) with --part-mib 1, then
    gpu-host-run stash + install from the .carry/ it wrote; a bad name or part size writes nothing."""
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "purepkg", "1.0", {"purepkg/__init__.py": "VALUE = 'e2e'\n",
                                    "purepkg/blob.bin": os.urandom(5 << 19).hex()[: 5 << 19]})
    (script_root / "scripts" / "gpu-host" / "unit-e2e.toml").write_text(
        'python = "3.11"\nplatforms = ["any"]\nwheels = ["purepkg==1.0"]\n'
        '[serve]\ncell = "stand-in-engine-1.0.0-cu130-py311-sm80.90"\nengine_args = ""\n')
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    made = subprocess.run([sys.executable, str(script_root / "scripts" / "gpu-host-bundle"), "unit-e2e", "--part-mib", "1",
                           "--cache", str(tmp_path / "cache")], capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    parts = sorted((script_root / ".carry" / "unit-e2e").glob("part-*"))
    assert [p.name for p in parts] == ["part-00", "part-01", "part-02"] and all(p.stat().st_size <= 1 << 20 for p in parts)
    store = tmp_path / "store"
    ok = gpu_host_run("install", "unit-e2e", store=store, root=script_root)
    assert ok.returncode == 0, ok.stderr
    assert value_of(store / "py-unit-e2e") == "e2e"


# -- the spec through schema.py, the route in the package, one error tree --------------------------------------
@pytest.mark.pure
def test_every_spec_of_scripts_gpu_host_is_a_carry_spec_and_a_served_one_has_serve():
    from builder import schema
    from builder.deploy.runtime import hostenv

    specs = sorted((REPO / "scripts" / "gpu-host").glob("*.toml"))
    assert len(specs) >= 4
    for p in specs:
        data = hostenv.read_spec(p, schema.CARRY_SPEC)
        if "serve" in data:
            assert hostenv.read_spec(p, schema.CARRY_SPEC_SERVED)["serve"]["cell"]


BAD_SPECS = {  # text -> what the one-line message names; `served`: as a run reads it (only [serve] needed)
    ('python = "3.12"\nplatforms = ["any"]\nwheels = ["a==1"]\nwheel = []\n', False): "unknown key 'wheel'",
    ('python = "3.12"\nplatforms = []\nwheels = []\n', False): "platforms: expected a non-empty list",
    ('python = "3"\nplatforms = ["any"]\nwheels = []\n', False): "python: '3' is not a Python version",
    ('python = "3.12"\nplatforms = ["any"]\nwheels = ["a (\\n"]\n', False): "wheels[0]:",
    ('python = "3.12"\nplatforms = ["any"]\nwheels = []\n[repack]\n"a==1" = "x"\n', False): 'repack."a==1": expected a list',
    ('python = "3.12"\nplatforms = ["any"]\nwheels = []\n[serve]\ncell = "c"\n', False): "serve: missing key 'engine_args'",
    ('python = "3.12"\nplatforms = ["any"]\nwheels = []\n', True): "missing key 'serve'",
    ('[serve]\ncell = "a b"\nengine_args = ""\n', True): "serve.cell: 'a b' is not a name",
    ('[serve]\ncell = "c"\nengine_args = "\'"\n', True): "serve.engine_args:",
    ('[serve]\ncell = "c"\nengine_args = ""\nenv = ["1A=x"]\n', True): "serve.env[0]: '1A=x' is not a NAME=VALUE",
    ('[serve\n', True): "the spec is not TOML",
}


@pytest.mark.pure
@pytest.mark.parametrize("text, served, says", [(*k, v) for k, v in BAD_SPECS.items()],
                         ids=[f"spec-{i}" for i in range(len(BAD_SPECS))])
def test_a_bad_spec_is_refused_in_one_line_through_the_schema(text, served, says):
    from builder import schema
    from builder.deploy.runtime import hostenv
    from builder.errors import EXIT_BAD_INPUT, UserError

    with pytest.raises(UserError) as caught:
        hostenv.parse_spec(text, "x/spec.toml", schema.CARRY_SPEC_SERVED if served else schema.CARRY_SPEC)
    message = str(caught.value)
    assert says in message and message.startswith("x/spec.toml: ") and "\n" not in message, message
    assert caught.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.pure
def test_gpu_host_run_is_a_shim_over_the_package_and_both_scripts_use_builders_files_and_errors():
    """The route is builder/deploy/gpuhost.py (the environment deploy/runtime/hostenv.py, --restore
    deploy/warm/restore.py): the script finds its checkout and calls it. Neither script defines what builder/files.py
    has, nor an error class of its own (builder's errors: 2 bad input, 3 the environment, 1 failed)."""
    import ast

    run = (REPO / "scripts" / "gpu-host-run").read_text()
    assert len(run.splitlines()) <= 20
    for script in ("gpu-host-run", "gpu-host-bundle"):
        tree = ast.parse((REPO / "scripts" / script).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & {"check_kind", "read_text", "sha256_file", "sha256_stream", "sha256", "_kind",
                              "checked_spec"}, script
        assert not [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)], f"{script}: a class of its own"
    assert "gpuhost.main(" in run


def test_layer_packs_a_capture_made_at_the_image_paths_into_parts_and_refuses_any_other(script_root, tmp_path):
    """scripts/gpu-host-run layer: the capture's tree as the warm layer's tar at the capture's cache root, cut into
    parts of --part-mib with SHA256SUMS (what restore.join and --restore DIR read); a capture made at this host's own
    paths (no --image-paths) or an OUT that holds files is refused, and nothing is written."""
    import json

    from builder.deploy.warm import restore as restore_mod

    cap = tmp_path / "cap"
    (cap / "tree" / "triton" / "k1").mkdir(parents=True)
    (cap / "tree" / "triton" / "k1" / "k.cubin").write_bytes(os.urandom(1_500_000))
    (cap / "tree" / "vllm").mkdir()
    (cap / "tree" / "vllm" / "a.py").write_text("x = 1\n")
    os.utime(cap / "tree" / "vllm" / "a.py", (1_700_000_000, 1_700_000_000))
    facts = {"cache_root": "/opt/jit-cache", "captured-on": "process", "layout": {"prefix": "/opt/venv"}}
    (cap / "warm.json").write_text(json.dumps(facts))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script_root / "scripts" / "gpu-host-run"), "layer", *args],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    res = run(str(cap), str(tmp_path / "out"), "--part-mib", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 files" in res.stdout and "time 1700000000" in res.stdout and "2 part(s)" in res.stdout, res.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["SHA256SUMS", "part-00", "part-01"]
    with tarfile.open(restore_mod.join(tmp_path / "out")) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"opt", "opt/jit-cache", "opt/jit-cache/triton", "opt/jit-cache/triton/k1",
                            "opt/jit-cache/triton/k1/k.cubin", "opt/jit-cache/vllm", "opt/jit-cache/vllm/a.py"}
    assert {m.mtime for m in members.values()} == {1_700_000_000}
    res = run(str(cap), str(tmp_path / "out"))  # OUT holds the parts already
    assert res.returncode == 2 and "not empty" in res.stderr, res.stderr
    facts["layout"] = None
    (cap / "warm.json").write_text(json.dumps(facts))
    res = run(str(cap), str(tmp_path / "out2"))
    assert res.returncode == 2 and "--image-paths" in res.stderr and not (tmp_path / "out2").exists(), res.stderr
