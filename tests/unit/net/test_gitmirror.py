"""Git mirrors (builder/gitmirror.py): the map's shape, git's insteadOf semantics, refusals that never show a
credential, and a real git server: a tag resolved through the mirror while the upstream URL stays the identity."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import docker, gitmirror, lock, redact
from builder.errors import UserError
from tests.helpers import git_daemon

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("no_git_mirrors")
GH = "https://github.com/"


def test_longest_prefix_wins():
    m = (("https://github.com/", "http://127.0.0.1:9418/gh/"),
         ("https://github.com/sgl-project/", "git://127.0.0.1/sgl/"),
         ("https://gitlab.com/", "file:///srv/git/gitlab/"))
    assert gitmirror.rewrite("https://github.com/vllm-project/vllm", m) == "http://127.0.0.1:9418/gh/vllm-project/vllm"
    assert gitmirror.rewrite("https://github.com/sgl-project/sglang", m) == "git://127.0.0.1/sgl/sglang"
    assert gitmirror.rewrite("https://gitlab.com/a/b.git", m) == "file:///srv/git/gitlab/a/b.git"
    assert gitmirror.rewrite("https://example.com/x", m) == "https://example.com/x"


def test_git_env_is_insteadof_and_git_agrees(tmp_path):
    m = (("https://github.com/", "http://127.0.0.1:1/gh/"), ("https://github.com/sgl-project/", "file:///srv/sgl/"))
    env = gitmirror.git_env(m)
    assert env == {"GIT_CONFIG_COUNT": "2",
                   "GIT_CONFIG_KEY_0": "url.http://127.0.0.1:1/gh/.insteadOf", "GIT_CONFIG_VALUE_0": "https://github.com/",
                   "GIT_CONFIG_KEY_1": "url.file:///srv/sgl/.insteadOf", "GIT_CONFIG_VALUE_1": "https://github.com/sgl-project/"}
    if not shutil.which("git"):
        pytest.skip("no git")
    # git itself reads the map the same way rewrite does (ls-remote --get-url applies insteadOf, asks nothing)
    for url in ("https://github.com/sgl-project/sglang", "https://github.com/NVIDIA/cutlass", "https://x.org/y"):
        out = subprocess.run(["git", "ls-remote", "--get-url", url], capture_output=True, text=True, cwd=tmp_path,
                             env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}, check=True).stdout.strip()
        assert out == gitmirror.rewrite(url, m)


def test_sources_in_order(monkeypatch):
    table = {GH: "http://127.0.0.1:9/t/"}
    assert gitmirror.choose((), env="", table=table) == ((GH, "http://127.0.0.1:9/t/"),)
    assert gitmirror.choose((), env=f"{GH}=git://127.0.0.1/e/", table=table) == ((GH, "git://127.0.0.1/e/"),)
    assert gitmirror.choose((f"{GH}=file:///f/",), env=f"{GH}=git://127.0.0.1/e/", table=table) == ((GH, "file:///f/"),)
    assert gitmirror.choose((), env="", table=None) == ()


SECRET = "hunter2-very-secret"


@pytest.mark.parametrize("value, says", [
    ("github.com=http://m/", "not a URL"),
    (f"{GH}=mirrors/github/", "relative path"),
    (f"{GH}=./mirror", "relative path"),
    (f"{GH}=file://relative/x", "absolute path"),
    (f"{GH}=ftp://m/", "not a URL"),
    (f"{GH}=http://m/\nx", "newline"),
    (f"{GH}\n=http://m/", "newline"),
    (f"{GH}=http:///nohost", "names no host"),
    (f"{GH}=http://m:99999/", "not a URL"),
    (f"{GH}=http://m/?token=" + SECRET, "no ?query"),
    (f"https://u:{SECRET}@github.com/=http://m/", "carries no credentials"),
    (f"{GH}=http://u:{SECRET}@m/ x", "space"),
    ("no-equals-sign", "UPSTREAM=MIRROR"),
])
def test_bad_values_refused_in_one_line_without_secrets(value, says):
    with pytest.raises(UserError) as exc:
        gitmirror.choose((value,))
    text = str(exc.value)
    assert says in text and "\n" not in text and SECRET not in text
    assert exc.value.exit_code == 2


def test_two_mirrors_for_one_upstream_refused():
    with pytest.raises(UserError, match="two mirrors"):
        gitmirror.choose((f"{GH}=http://a/", f"{GH}=http://b/"))


def test_credentials_kept_and_redacted():
    (pair,) = gitmirror.choose((f"{GH}=https://bot:{SECRET}@mirror.example/gh/",))
    assert pair[1] == f"https://bot:{SECRET}@mirror.example/gh/"  # git needs it, for that host only
    gitmirror.activate((pair,))
    assert SECRET not in redact.redact(f"fatal: unable to access 'https://bot:{SECRET}@mirror.example/gh/x/'")
    assert SECRET not in redact.redact(f"the password is {SECRET}")  # remembered as a secret


def test_matrix_table_checked_by_schema(tmp_path):
    from builder import matrix as matrix_mod

    good = tmp_path / "good.toml"
    good.write_text((ROOT / "matrix.toml").read_text().replace(
        "[defaults]", f'[defaults]\ngit_mirrors = {{ "{GH}" = "file:///srv/git/" }}', 1))
    assert matrix_mod.load(good).defaults["git_mirrors"] == {GH: "file:///srv/git/"}
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "matrix.toml").read_text().replace(
        "[defaults]", f'[defaults]\ngit_mirrors = {{ "{GH}" = "http://u:{SECRET}@m/?t=1" }}', 1))
    with pytest.raises(UserError) as exc:
        matrix_mod.load(bad)
    assert "git_mirrors" in str(exc.value) and SECRET not in str(exc.value)


def _everything_keyed(tmp_path, name, table):
    """Every shipped cell's cache keys, labels and rendered Dockerfile, under a matrix with `table` as its mirrors
    (and that map in force)."""
    from builder import matrix as M
    from builder import plan as P
    from builder import render as R
    from builder import resolve

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.toml"
    text = (ROOT / "matrix.toml").read_text()
    if table:
        body = ", ".join(f'"{k}" = "{v}"' for k, v in table.items())
        text = text.replace("[defaults]", f"[defaults]\ngit_mirrors = {{ {body} }}", 1)
    path.write_text(text)
    for extra in ROOT.glob("matrix.lock"):
        shutil.copy(extra, tmp_path / "matrix.lock")
    m = M.load(path)
    gitmirror.activate(gitmirror.choose((), env="", table=m.defaults.get("git_mirrors")))
    cells = resolve.select(m, M.Selection(profiles=("all",)))
    out = {}
    for cell in cells:
        keys = {p.name: P.cache_key(cell, p) for p in cell.packages}
        out[cell.id] = (keys, R.labels(cell, keys), R.render(P.plan_cells([cell], None)[0], m.defaults["index"]))
    return out


def test_two_mirrors_give_one_key_one_label_set_one_dockerfile(tmp_path):
    a = _everything_keyed(tmp_path / "a", "matrix", {GH: "http://127.0.0.1:9418/github/"})
    b = _everything_keyed(tmp_path / "b", "matrix",
                          {GH: f"https://bot:{SECRET}@mirror.example/gh/", "https://gitlab.com/": "file:///srv/git/"})
    none = _everything_keyed(tmp_path / "c", "matrix", {})
    assert a and a == b == none
    assert all("127.0.0.1:9418" not in r and "mirror.example" not in r for _, _, r in b.values())


# --- a real git server -------------------------------------------------------------------------------------------

@pytest.fixture
def served(tmp_path):
    """A bare repository github/acme/widget.git with tag v1.0, served by `git daemon` on 127.0.0.1."""
    if not shutil.which("git"):
        pytest.skip("no git")
    with git_daemon(tmp_path) as info:
        yield info


UPSTREAM = "https://github.com/acme/widget"  # unreachable here: only the mirror answers


def test_tag_resolved_through_git_daemon_mirror(served):
    gitmirror.activate(((GH, f"git://127.0.0.1:{served['port']}/github/"),))
    commit, why = lock.resolve_git_commit(UPSTREAM + ".git", "v1.0")
    assert (commit, why) == (served["commit"], "")  # the tag's commit (peeled), as upstream would say


def test_fetch_plan_tree_fetched_through_file_mirror(served, tmp_path):
    gitmirror.activate(((GH, f"file://{served['srv']}/github/"),))
    dest = tmp_path / "tree"
    dest.mkdir()
    code, why = docker.git_fetch_commit(UPSTREAM + ".git", served["commit"], dest)
    assert (code, why) == (0, "")
    assert (dest / "CMakeLists.txt").read_text() == "project(widget)\n"


def test_lock_cli_refuses_a_bad_git_mirror(tmp_path):
    """`builder lock --git-mirror` in a subprocess: a refused value is exit 2 and one clear line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(gitmirror.ENV, None)
    bad = subprocess.run([sys.executable, "-m", "builder.cli", "lock", "--matrix", str(ROOT / "matrix.toml"),
                          "--git-mirror", f"{GH}=mirror/relative", "--check"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "--git-mirror" in bad.stderr and "relative path" in bad.stderr


def test_build_gets_the_map_as_a_secret_from_the_environment_only(tmp_path):
    """The buildx call names secret "gitmirrors" by environment variable: the map (and a mirror's password) is in no
    argv; the config it holds is git's insteadOf; without mirrors there is no such secret."""
    from types import SimpleNamespace

    from builder.steps import common_build_args

    opts = SimpleNamespace(source_date_epoch="", ca_bundle=None, no_cache=False, builder=None, layer_cache=None)
    ctx = SimpleNamespace(opts=opts, cell=SimpleNamespace(packages=(), id="c"), dockerfile=tmp_path / "D",
                          context_dir=tmp_path)
    assert common_build_args(ctx)["secret_envs"] == ()
    mirror = f"https://bot:{SECRET}@mirror.example/gh/"
    gitmirror.activate(gitmirror.choose((f"{GH}={mirror}",)))
    common = common_build_args(ctx)
    argv = docker.BuildxCall(target="src-x", **common).argv()
    assert ["--secret", f"id=gitmirrors,env={gitmirror.SECRET_ENV}"] == argv[argv.index("--secret"):argv.index("--secret") + 2]
    assert not any("mirror.example" in a or SECRET in a for a in argv)
    assert os.environ[gitmirror.SECRET_ENV] == f'[url "{mirror}"]\n\tinsteadOf = {GH}\n'
    gitmirror.activate(())
    assert gitmirror.SECRET_ENV not in os.environ


def test_git_reads_the_secret_config_as_insteadof(tmp_path):
    """What with-ca exports inside the build (GIT_CONFIG_GLOBAL=the secret) rewrites the upstream URL in git."""
    if not shutil.which("git"):
        pytest.skip("no git")
    m = ((GH, "git://10.0.0.1/gh/"), (GH + "sgl-project/", "file:///srv/sgl/"))
    cfg = tmp_path / "gitmirrors"
    cfg.write_text(gitmirror.gitconfig(m))
    for url in (GH + "sgl-project/sglang", GH + "NVIDIA/cutlass"):
        out = subprocess.run(["git", "ls-remote", "--get-url", url], capture_output=True, text=True, cwd=tmp_path,
                             env={"PATH": os.environ["PATH"], "GIT_CONFIG_GLOBAL": str(cfg)}, check=True).stdout.strip()
        assert out == gitmirror.rewrite(url, m)


def test_rendered_fetches_mount_the_mirror_secret_and_with_ca_reads_it():
    root = ROOT / "dockerfiles"
    assert "GIT_CONFIG_GLOBAL=/run/secrets/gitmirrors" in (root / "macros.j2").read_text()
    both = "RUN --mount=type=secret,id=ca --mount=type=secret,id=gitmirrors \\\n"
    assert (root / "stages/source-git.j2").read_text().count(both) == 3  # fetch by commit / by tag, submodules
    assert both + "    with-ca sh {{ pkg.deps.dir }}/fetch.sh" in (root / "stages/deps.j2").read_text()


@pytest.mark.parametrize("mirror, host_net", [("http://127.0.0.1:9/gh/", True), ("git://localhost/gh/", True),
                                              ("http://[::1]:9/gh/", True), ("http://127.8.0.3:9/gh/", True),
                                              ("https://git.corp.example/gh/", False), ("http://10.0.0.1/gh/", False),
                                              ("http://127.0.0.1.example/gh/", False)])
def test_a_mirror_on_loopback_gives_the_build_the_hosts_network_and_no_other_does(tmp_path, mirror, host_net):
    """A RUN's own loopback is not the host's: only in the host's network namespace does a fetch reach
    scripts/git-host on 127.0.0.1. The compile RUNs say --network=none themselves, so they stay sealed."""
    from types import SimpleNamespace

    from builder.steps import common_build_args

    opts = SimpleNamespace(source_date_epoch="", ca_bundle=None, no_cache=False, builder=None, layer_cache=None)
    ctx = SimpleNamespace(opts=opts, cell=SimpleNamespace(packages=(), id="c"), dockerfile=tmp_path / "D",
                          context_dir=tmp_path)
    assert "--network" not in common_build_args(ctx)["extra"]
    gitmirror.activate(((GH, mirror),))
    extra = common_build_args(ctx)["extra"]
    assert (extra[extra.index("--network"):][:2] == ("--network", "host")) if host_net else "--network" not in extra


def test_an_archive_source_is_downloaded_through_the_map_and_checked_against_its_hash(tmp_path):
    """The deps stage's fetch script asks git for the archive URL under the map (ls-remote --get-url: insteadOf, no
    network), refuses a mirror scheme that serves no archives without printing the mirror, and keeps URL_HASH as
    the check: run here with a file:// mirror holding the archive and with a git:// one."""
    if not shutil.which("git") or not shutil.which("curl"):
        pytest.skip("skipped because git or curl is not installed")
    from builder.fetchplan import render_fetch_script
    from builder.fetchplan.model import ExternalSource

    srv = tmp_path / "srv" / "acme" / "widget" / "archive"
    srv.mkdir(parents=True)
    payload = tmp_path / "payload"
    (payload / "widget-1").mkdir(parents=True)
    (payload / "widget-1" / "a.h").write_text("int a;\n")
    subprocess.run(["tar", "-czf", str(srv / "v1.tar.gz"), "-C", str(payload), "widget-1"], check=True)
    digest = hashlib.sha256((srv / "v1.tar.gz").read_bytes()).hexdigest()

    def run(mirror: str, sha: str) -> subprocess.CompletedProcess:
        source = ExternalSource(name="widget", repository=f"{GH}acme/widget/archive/v1.tar.gz", commit="",
                                override_var="W", override_kind="cmake", subdir=None, reproducible=True, kind="url",
                                url_hash=f"SHA256={sha}")
        script = tmp_path / "fetch.sh"
        script.write_text(render_fetch_script([source], str(tmp_path / "deps")))
        cfg = tmp_path / "gitmirrors"
        cfg.write_text(gitmirror.gitconfig(((GH, mirror),)))
        return subprocess.run(["sh", str(script)], capture_output=True, text=True, cwd=tmp_path,
                              env={"PATH": os.environ["PATH"], "GIT_CONFIG_GLOBAL": str(cfg), "HOME": str(tmp_path)})

    ok = run(f"file://{tmp_path}/srv/", digest)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "deps" / "widget" / "a.h").read_text() == "int a;\n"
    wrong = run(f"file://{tmp_path}/srv/", "0" * 64)
    assert wrong.returncode != 0 and "FAILED" in wrong.stdout + wrong.stderr
    gitonly = run(f"git://{SECRET}.example/gh/", digest)
    assert gitonly.returncode == 1 and "widget: the git mirror maps this archive URL to a git:// URL" in gitonly.stderr
    assert SECRET not in gitonly.stderr + gitonly.stdout
