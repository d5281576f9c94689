"""Issue 34, item 1: a registry credential is bound to the host it was given for, and sent only after that host
asks (a 401). BUILDER_REGISTRY_USER / _PASSWORD go to BUILDER_REGISTRY_HOST when it is set, else only to the
registry the command was given (the matrix's, publish's --registry, the wheel cache's remote); nothing goes
before a 401; a bearer realm on another host over plain http never sees them; skopeo's auth file holds only the
hosts its arguments name.

The impostor is a logging registry on 127.0.0.1 (tests/hostile.py, a test double: no real registry steals
passwords on demand) that records every request's Authorization header; the positive case is a real registry
with htpasswd auth (tests/conftest.py auth_registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from builder import registry_api

from tests import hostile
from tests.helpers import REPO

SECRET = f"impostor-bait-{uuid.uuid4().hex[:12]}"
ENV = {"BUILDER_REGISTRY_USER": "ci", "BUILDER_REGISTRY_PASSWORD": SECRET}


def cli(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "BUILDER_REMOTE_TIMEOUT": "5",
                                            "DOCKER_CONFIG": str(cwd / "dc"), **env})


def _gpus_file(tmp: Path) -> Path:
    path = tmp / "gpus.json"
    path.write_text(json.dumps([{"index": 0, "name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0",
                                 "brand": "NVIDIA"}]))
    return path


def deploy_verbs(host: str, tmp: Path) -> dict[str, list[str]]:
    (tmp / "model").mkdir(exist_ok=True)
    (tmp / "model" / "config.json").write_text("{}")  # enough of a checkpoint to be looked at: nothing runs
    image = f"{host}/team/vllm:cred-{uuid.uuid4().hex[:8]}"
    return {
        "serve": ["serve", image, "--strategy", "MTP2", "--model", str(tmp / "model")],
        "doctor --host": ["doctor", "--host", image, "--gpus-file", str(_gpus_file(tmp))],
        "smoke": ["smoke", image, "--layers", "L0", "--model", str(tmp / "model"), "--out-dir", str(tmp / "s")],
        "bench": ["bench", "run", image, "--model", str(tmp / "model"), "--out-dir", str(tmp / "b"), "--gpus", "none"],
    }


CHALLENGES = {
    "basic": 'Basic realm="impostor"',
    "bearer, realm on another host over http": 'Bearer realm="http://localhost:{port}/token",service="x"',
    "bearer, realm on the impostor itself": 'Bearer realm="http://{self}/token",service="x"',
}


@pytest.mark.parametrize("bound", ["unbound", "bound elsewhere"])
@pytest.mark.parametrize("challenge", sorted(CHALLENGES))
def test_deployer_verbs_never_hand_the_password_to_an_image_registry_it_was_not_given_for(tmp_path, challenge, bound):
    """serve, doctor --host, smoke and bench of an image in the impostor's registry, with BUILDER_REGISTRY_USER /
    _PASSWORD set (unbound: no BUILDER_REGISTRY_HOST; bound elsewhere: it names another host): the impostor
    asks (401) and never gets the password; each verb ends with one line naming the refusal, no traceback."""
    (tmp_path / "dc").mkdir()
    env = {**ENV, **({"BUILDER_REGISTRY_HOST": "127.0.0.1:1"} if bound != "unbound" else {})}
    with hostile.impostor() as (realm_host, realm_seen):
        port = realm_host.rsplit(":", 1)[1]
        with hostile.impostor(CHALLENGES[challenge].replace("{port}", port)) as (host, seen):
            for name, argv in deploy_verbs(host, tmp_path).items():
                before = len(seen)
                proc = cli(argv, tmp_path, env)
                out = proc.stdout + proc.stderr
                assert "Traceback" not in out, f"{name}:\n{out[-3000:]}"
                assert proc.returncode in (2, 3), f"{name}: exit {proc.returncode}\n{out[-2000:]}"
                assert len(seen) > before, f"{name} never asked the impostor: the test proves nothing\n{out[-2000:]}"
                assert host in out and ("refused" in out or "token" in out), f"{name}:\n{out[-2000:]}"
    assert not hostile.carried(seen, SECRET), hostile.carried(seen, SECRET)
    assert not hostile.carried(realm_seen, SECRET), hostile.carried(realm_seen, SECRET)
    assert not any(auth.lower().startswith("basic") for _, _, auth in seen + realm_seen), seen + realm_seen


def test_reuse_from_another_registry_never_gets_the_password(tmp_path, monkeypatch):
    """--reuse-from a registry other than the matrix's: the endpoint carries no credentials (its own docker login
    only), so the impostor's 401 is answered with none; the matrix's own registry host keeps them."""
    from builder import matrix as matrix_mod
    from builder.image import reuse
    from builder.options import _reuse_path

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("BUILDER_REGISTRY_HOST", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    m = matrix_mod.load(REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml")
    own = _reuse_path(m, "registry")
    assert own.credentials == ("ci", SECRET)  # the matrix's registry: the command's own
    with hostile.impostor() as (host, seen):
        other = _reuse_path(m, f"{host}/team")
        assert other.credentials is None
        with reuse.Client(other) as client, pytest.raises(reuse.Unusable, match="refused an anonymous read") as caught:
            client.image(other.repository("vllm"), "t")
        assert caught.value.cause == "credentials"
    assert seen and not hostile.carried(seen, SECRET)


def test_publish_to_a_registry_the_credentials_are_not_bound_to_sends_nothing(tmp_path):
    """publish --registry IMPOSTOR with BUILDER_REGISTRY_HOST naming another host: refused before anything is
    built (exit 3), the password never sent."""
    (tmp_path / "dc").mkdir()
    from tests.hardening import cases as hc

    hc.make_fixture(tmp_path)
    with hostile.impostor() as (host, seen):
        proc = cli(["publish", "--matrix", str(tmp_path / "fx" / "matrix.toml"), "--registry", f"{host}/x", "--retries", "0",
                    "--work-dir", str(tmp_path / "w"), "--log-dir", str(tmp_path / "l"),
                    "--images-json", str(tmp_path / "i.json")], tmp_path, {**ENV, "BUILDER_REGISTRY_HOST": "127.0.0.1:1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3 and "Traceback" not in out and "nothing was built" in out, out[-2000:]
    assert seen and not hostile.carried(seen, SECRET), seen


@pytest.mark.pure
def test_nothing_is_sent_before_a_401_and_a_basic_challenge_gets_the_hosts_own_credentials():
    """A client holding credentials for the impostor's host (given for it) sends its first request anonymously,
    and answers the Basic challenge once; every later request carries them (the host asked)."""
    with hostile.impostor() as (host, seen):
        where = registry_api.Endpoint(host, tls_verify=False, credentials=("ci", SECRET), credentials_from="test")
        with registry_api.Client(where) as client, pytest.raises(registry_api.Unusable, match="refused the credentials"):
            client.manifest(f"{host}/team/vllm", "t")
    assert [auth for _, _, auth in seen][0] == ""
    assert len(seen) == 2 and hostile.carried(seen[1:], SECRET)


@pytest.mark.pure
@pytest.mark.parametrize("realm,gets_them", [("http://localhost:{port}/token", False),
                                              ("http://{self}/token", True)])
def test_a_token_realm_gets_the_credentials_only_on_the_same_host_or_over_https(realm, gets_them):
    with hostile.impostor() as (realm_host, realm_seen):
        challenge = f'Bearer realm="{realm}",service="x"'.replace("{port}", realm_host.rsplit(":", 1)[1])
        with hostile.impostor(challenge) as (host, seen):
            where = registry_api.Endpoint(host, tls_verify=False, credentials=("ci", SECRET), credentials_from="test")
            with registry_api.Client(where) as client, pytest.raises(registry_api.Unusable):
                client.manifest(f"{host}/team/vllm", "t")
    tokens = [s for s in seen + realm_seen if s[1].startswith("/token")]
    assert tokens, seen + realm_seen
    assert bool(hostile.carried(tokens, SECRET)) == gets_them, tokens
    assert seen[0][2] == ""  # the first request: anonymous


@pytest.mark.pure
def test_skopeos_auth_file_holds_only_the_hosts_its_arguments_name():
    from builder import docker

    assert docker._docker_hosts(["copy", "oci-archive:/a.tar", "docker://127.0.0.1:5000/x/y:t"]) == {"127.0.0.1:5000"}
    assert docker._docker_hosts(["inspect", "docker://ghcr.io/a/b@sha256:" + "a" * 64]) == {"ghcr.io"}


# -- a credential helper that floods, or whose error holds the secret ---------------------------------------------
HELPER_MODES = {  # what the stand-in docker-credential-flood does → what builder's one line says
    "20 MB of output": ("head -c 20000000 /dev/zero | tr '\\0' a\n", "printed more than 256 KiB"),
    "20 MB of errors": ("head -c 20000000 /dev/zero | tr '\\0' a >&2\nexit 1\n", "printed more than 256 KiB"),
    "the secret in its error": (f"echo 'cannot unlock the keychain for {SECRET}' >&2\nexit 1\n",
                                "its message is withheld"),
}


@pytest.mark.parametrize("mode", sorted(HELPER_MODES))
def test_a_credential_helper_that_floods_or_names_the_secret_is_refused_in_one_line_at_once(tmp_path, mode):
    """serve, doctor --host and plan --remote read the docker login of their registry through its credential
    helper: one that prints 20 MB stalled them past 60 s (all of it read, then redacted), and one whose error held
    the password had it quoted. Now at most 256 KiB is read (exit 3 at once), and a failing helper's words are
    never quoted."""
    script, says = HELPER_MODES[mode]
    (tmp_path / "dc").mkdir()
    (tmp_path / "dc" / "config.json").write_text('{"credsStore": "flood"}')
    (tmp_path / "bin").mkdir()
    helper = tmp_path / "bin" / "docker-credential-flood"
    helper.write_text("#!/bin/sh\n" + script)
    helper.chmod(0o755)
    from tests.hardening import cases as hc

    hc.make_fixture(tmp_path)
    dead = "127.0.0.1:9"
    verbs = {**{k: v for k, v in deploy_verbs(dead, tmp_path).items() if k in ("serve", "doctor --host")},
             "plan --remote": ["plan", "--matrix", str(tmp_path / "fx" / "matrix.toml"), "--remote", "--cache-remote",
                               f"registry:{dead}/w"]}
    for name, argv in verbs.items():
        took = -time.monotonic()
        proc = cli(argv, tmp_path, {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
        took += time.monotonic()
        out = proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 3 and "Traceback" not in out, f"{name}: exit {proc.returncode}\n{out[-2000:]}"
        assert len(errors) == 1 and "docker-credential-flood" in errors[0] and says in errors[0], f"{name}:\n{out[-2000:]}"
        assert SECRET not in out and "keychain" not in out and len(out) < 4000, f"{name}:\n{out[-2000:]}"
        assert took < 20, f"{name} took {took:.1f} s"
