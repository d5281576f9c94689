"""Round three of the bad-input table (issue 28), remotes and secrets: odd DOCKER_CONFIG files, credentials and
tokens in every place a URL or a registry is accepted (matrix defaults, cache remotes, the compile cache, flags,
environment variables), and remote specs and limits. Each case runs through the same judge as
tests/hardening/cases.py (the expected exit code, the words of the one-line message, no traceback, nothing written,
no docker call before a refusal, and the password marker SECRET in no output).

What a docker config.json holds wrong is bad input (exit 2, the file and the key named); a config that cannot
be read at all (a directory, a FIFO, no permission, an I/O error, a credential helper that is missing or fails)
is the environment (exit 3). Credentials are read before any request, so a refusal needs no registry: the
remotes named here (127.0.0.1:9, nothing listens) are never reached.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from tests.hardening.cases import (DRY, LOCK, M, PLAN, PUBLISH, SECRET, WH, Case, add_default, directory, fifo, loop,
                                   proc_mem, set_key, unreadable)

DEAD = "127.0.0.1:9"  # nothing listens there: a case that reaches the network would say "does not answer"
REMOTE = ["--cache-remote", f"registry:{DEAD}/w"]
KEY = "e" * 64
CONFIG = "dc/config.json"  # DOCKER_CONFIG=dc, relative to the case's directory (the CLI runs there)
ENV = {"DOCKER_CONFIG": "dc"}
B64_SECRET = base64.b64encode(f"bob:{SECRET}".encode()).decode()


def wheelhouse_entry(path: Path) -> None:
    """A wheelhouse holding one entry, demo key eee…, that `wheels push` would send."""
    from builder.cache import file_records
    from builder.cache.local import Wheelhouse

    from tests.helpers import a_wheel

    with tempfile.TemporaryDirectory() as out:
        whl = a_wheel(Path(out))
        Wheelhouse(path).store("demo", KEY, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]},
                                                     "compiled": False})


def config(text: str | bytes) -> dict:
    return {"dc": directory, CONFIG: text}


def big_config(path: Path) -> None:
    path.write_text('{"auths": {}, "x": "' + "a" * (17 << 20) + '"}')


def helper(name: str, script: str) -> Callable[[Path], None]:
    """bin/docker-credential-NAME, a shell script (a stand-in for a credential helper)."""

    def make(path: Path) -> None:
        path.mkdir()
        exe = path / f"docker-credential-{name}"
        exe.write_text("#!/bin/sh\n" + script)
        exe.chmod(0o755)

    return make


def _path_with(bin_dir: str) -> dict:
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


# verbs that read the registry credentials: publish (before the build), the registry cache remote (before its
# first request) through plan --remote, wheels pull and wheels push
VERBS = {
    "publish": [*PUBLISH, "--registry", f"{DEAD}/x", "--retries", "0"],
    "plan": [*PLAN, "--remote", *REMOTE],
    "pull": ["wheels", "pull", *M, *WH, *REMOTE],
    "push": ["wheels", "push", *M, *WH, *REMOTE, "--key", f"demo:{KEY}"],
}

# config.json text → the words the refusal must say (exit 2: what it holds)
BAD_CONFIGS = {
    "not-json": ("{auths: x", ("config.json", "not JSON")),
    "empty": ("", ("config.json", "not JSON")),
    "truncated": ('{"auths": {"127.0.0.1:9": {"auth": "', ("config.json", "not JSON")),
    "not-utf8": (b'{"auths": {"\xff\xfe": {}}}', ("config.json", "not UTF-8")),
    "nested": ("[" * 100000 + "]" * 100000, ("config.json", "nested too deeply")),
    "list": ("[]", ("config.json", "JSON object expected", "a list")),
    "string": ('"auths"', ("config.json", "JSON object expected", "a string")),
    "number": ("42", ("config.json", "JSON object expected", "a number")),
    "null": ("null", ("config.json", "JSON object expected", "null")),
    "auths-list": ('{"auths": []}', ("config.json", "auths must be an object", "a list")),
    "auths-string": ('{"auths": "127.0.0.1:9"}', ("config.json", "auths must be an object")),
    "auths-number": ('{"auths": 1}', ("config.json", "auths must be an object")),
    "entry-string": ('{"auths": {"127.0.0.1:9": "bob:pw"}}', ("config.json", "auths.127.0.0.1:9 must be an object")),
    "entry-list": ('{"auths": {"127.0.0.1:9": []}}', ("config.json", "auths.127.0.0.1:9 must be an object")),
    "other-entry-number": ('{"auths": {"ghcr.io": 7}}', ("config.json", "auths.ghcr.io must be an object")),
    "auth-number": ('{"auths": {"127.0.0.1:9": {"auth": 12345}}}', ("config.json", "auths.127.0.0.1:9.auth must be a string")),
    "auth-list": ('{"auths": {"127.0.0.1:9": {"auth": ["x"]}}}', ("config.json", ".auth must be a string")),
    "auth-not-base64": ('{"auths": {"127.0.0.1:9": {"auth": "not base64!"}}}', ("config.json", "is not base64")),
    "auth-bad-padding": ('{"auths": {"127.0.0.1:9": {"auth": "Ym9iOnB3P"}}}', ("config.json", "is not base64")),
    "auth-no-colon": (json.dumps({"auths": {DEAD: {"auth": base64.b64encode(b"bobpw").decode()}}}),
                      ("config.json", "no user:password")),
    "auth-no-user": (json.dumps({"auths": {DEAD: {"auth": base64.b64encode(f":{SECRET}".encode()).decode()}}}),
                     ("config.json", "no user:password")),
    "auth-not-utf8": (json.dumps({"auths": {DEAD: {"auth": base64.b64encode(b"bob:\xff\xfe").decode()}}}),
                      ("config.json", "is not base64")),
    "username-number": ('{"auths": {"127.0.0.1:9": {"username": 1, "password": "x"}}}', ("config.json", ".username must be a string")),
    "password-list": ('{"auths": {"127.0.0.1:9": {"username": "bob", "password": ["x"]}}}',
                      ("config.json", ".password must be a string")),
    "identitytoken-object": ('{"auths": {"127.0.0.1:9": {"identitytoken": {}}}}', ("config.json", ".identitytoken must be a string")),
    "cred-helpers-list": ('{"credHelpers": ["x"]}', ("config.json", "credHelpers must be an object")),
    "cred-helpers-string": ('{"credHelpers": "desktop"}', ("config.json", "credHelpers must be an object")),
    "cred-helper-number": ('{"credHelpers": {"127.0.0.1:9": 3}}', ("config.json", "credHelpers.127.0.0.1:9 must name")),
    "cred-helper-path": ('{"credHelpers": {"127.0.0.1:9": "../../bin/sh"}}', ("config.json", "credHelpers.127.0.0.1:9 must name")),
    "cred-helper-space": ('{"credHelpers": {"127.0.0.1:9": "a b"}}', ("config.json", "must name a credential helper")),
    "cred-helper-empty-other": ('{"credHelpers": {"ghcr.io": ""}}', ("config.json", "credHelpers.ghcr.io must name")),
    "creds-store-number": ('{"credsStore": 1}', ("config.json", "credsStore must name")),
    "creds-store-path": ('{"credsStore": "/bin/sh"}', ("config.json", "credsStore must name")),
    "creds-store-object": ('{"credsStore": {}}', ("config.json", "credsStore must name")),
    "secret-in-bad-entry-name": (json.dumps({"auths": {f"https://bob:{SECRET}@127.0.0.1:9": []}}),
                                 ("config.json", "must be an object")),
}
# the configs `wheels push` gets too (its remote opens as pull's does: a handful suffices)
PUSHED = ("not-json", "list", "auths-list", "auth-not-base64", "cred-helper-path", "secret-in-bad-entry-name")
# what cannot be read at all (exit 3)
UNREADABLE_CONFIGS = {
    "is-a-directory": ({"dc": directory, CONFIG: directory}, ENV, ("config.json", "is a directory")),
    "fifo": ({"dc": directory, CONFIG: fifo}, ENV, ("config.json", "not a regular file")),
    "eio": ({"dc": directory, CONFIG: proc_mem}, ENV, ("config.json", "cannot read the docker credentials")),
    "symlink-loop": ({"dc": directory, CONFIG: loop}, ENV, ("config.json", "cannot read the docker credentials")),
    "docker-config-is-a-file": ({"dc": "x"}, ENV, ("config.json", "cannot read the docker credentials")),
    "helper-missing": (config('{"credHelpers": {"127.0.0.1:9": "nonexistent-helper"}}'), ENV,
                       ("docker-credential-nonexistent-helper", "is not installed")),
    "store-missing": (config('{"credsStore": "nonexistent-store"}'), ENV,
                      ("docker-credential-nonexistent-store", "credsStore", "is not installed")),
    "helper-fails": ({**config('{"credsStore": "odd"}'), "bin": helper("odd", "echo 'keychain locked' >&2\nexit 5\n")},
                     {**ENV, **_path_with("bin")}, ("docker-credential-odd", "failed (exit 5)", "message is withheld")),
    "helper-not-json": ({**config('{"credsStore": "odd"}'), "bin": helper("odd", "echo hello\n")},
                        {**ENV, **_path_with("bin")}, ("docker-credential-odd", "answered no JSON")),
    "helper-list": ({**config('{"credsStore": "odd"}'), "bin": helper("odd", "echo '[1]'\n")},
                    {**ENV, **_path_with("bin")}, ("docker-credential-odd", "answered no")),
    "helper-echoes-secret": ({**config('{"credsStore": "odd"}'),
                              "bin": helper("odd", f"echo 'https://bob:{SECRET}@127.0.0.1:9 refused' >&2\nexit 1\n")},
                             {**ENV, **_path_with("bin")}, ("docker-credential-odd", "failed (exit 1)")),
}


def _docker_config_cases() -> list[Case]:
    out = []
    for verb, args in VERBS.items():
        extra = {"wh": wheelhouse_entry} if verb == "push" else {}
        for name, (text, expect) in BAD_CONFIGS.items():
            if verb == "push" and name not in PUSHED:
                continue
            out.append(Case(f"r3-docker-config-{name}-{verb}", "docker-config", args, files={**config(text), **extra},
                            env=ENV, expect=expect))
        if verb in ("publish", "plan"):
            for name, (files, env, expect) in UNREADABLE_CONFIGS.items():
                out.append(Case(f"r3-docker-config-{name}-{verb}", "docker-config", args, code=3, files={**files, **extra},
                                env=env, expect=expect,
                                # a credential helper is a program: looked up and run before the answer
                                needs_programs=name.startswith(("helper-", "store-"))))
    out.append(Case("r3-docker-config-too-big-publish", "docker-config", VERBS["publish"], files={"dc": directory, CONFIG: big_config},
                    env=ENV, expect=("config.json", "more than a docker config.json holds")))
    out.append(Case("r3-docker-config-unreadable-publish", "docker-config", VERBS["publish"], code=3, as_nobody=True,
                    files={"dc": directory, CONFIG: unreadable("{}")}, env=ENV, expect=("config.json", "Permission denied")))
    return out


# -- credentials and tokens in every place a URL or a registry is accepted -------------------------------------
CACHE = "\n[defaults.cache]\n"


def cache(line: str) -> Callable[[str], str]:
    return lambda text: text + CACHE + line + "\n"


MATRIX_SECRETS = {  # matrix edit → the key the refusal names
    "index-userinfo": (add_default(f'index = "https://bob:{SECRET}@pypi.example/simple"'), ("defaults.index",)),
    "index-token-query": (add_default(f'index = "https://pypi.example/simple?token={SECRET}"'), ("defaults.index", "?query")),
    "index-long-userinfo": (add_default(f'index = "https://bob:{SECRET * 4}@pypi.example/simple/with/a/long/path"'),
                            ("defaults.index",)),
    "index-password-only": (add_default(f'index = "https://:{SECRET}@pypi.example/simple"'), ("defaults.index",)),
    "registry-userinfo": (set_key("registry", f'"bob:{SECRET}@127.0.0.1:5000/builder-test"'), ("defaults.registry",)),
    "registry-url-userinfo": (set_key("registry", f'"https://bob:{SECRET}@127.0.0.1:5000/builder-test"'), ("defaults.registry",)),
    "registry-query": (set_key("registry", f'"127.0.0.1:5000/builder-test?token={SECRET}"'), ("defaults.registry",)),
    "mirrors-value-userinfo": (add_default(f'mirrors = {{ "builder-local/cuda" = "bob:{SECRET}@mirror.example/cuda" }}'),
                               ("defaults.mirrors",)),
    "mirrors-value-url": (add_default(f'mirrors = {{ "builder-local/cuda" = "https://bob:{SECRET}@mirror.example/cuda" }}'),
                          ("defaults.mirrors",)),
    "mirrors-key-userinfo": (add_default(f'mirrors = {{ "bob:{SECRET}@mirror.example/cuda" = "mirror.example/cuda" }}'),
                             ("defaults.mirrors",)),
    "mirrors-list": (add_default(f'mirrors = ["https://bob:{SECRET}@mirror.example/simple"]'), ("defaults.mirrors",)),
    "remote-registry-userinfo": (cache(f'remotes = ["registry:bob:{SECRET}@127.0.0.1:9/w"]'), ("remotes",)),
    "remote-index-userinfo": (cache(f'remotes = ["index:http://bob:{SECRET}@127.0.0.1:9/simple"]'), ("no credentials",)),
    "remote-index-token-query": (cache(f'remotes = ["index:http://127.0.0.1:9/simple?token={SECRET}"]'), ("no ?query",)),
    "remote-table-url-userinfo": (cache(f'remotes = [{{ kind = "index", url = "http://bob:{SECRET}@127.0.0.1:9/simple" }}]'),
                                  ("no credentials",)),
    "remote-table-upload-userinfo": (cache('remotes = [{ kind = "index", url = "http://127.0.0.1:9/simple", '
                                           f'upload = "http://bob:{SECRET}@127.0.0.1:9/" }}]'), ("upload",)),
    "remote-table-registry-userinfo": (cache(f'remotes = [{{ kind = "registry", url = "bob:{SECRET}@127.0.0.1:9/w" }}]'),
                                       ("remotes",)),
    "compile-redis-userinfo": (cache(f'compile = "redis://bob:{SECRET}@127.0.0.1:6379/0"'), ("compile", "no credentials")),
    "compile-redis-password-only": (cache(f'compile = "redis://:{SECRET}@127.0.0.1:6379"'), ("compile", "no credentials")),
    "compile-redis-query": (cache(f'compile = "redis://127.0.0.1:6379/0?password={SECRET}"'), ("compile", "no ?query")),
    "compile-s3-query": (cache(f'compile = "s3://bucket/prefix?secret={SECRET}&region=x"'), ("compile", "no ?query")),
    "compile-webdav-userinfo": (cache(f'compile = "webdav+https://bob:{SECRET}@dav.example/cache"'), ("compile",)),
    "compile-unknown-scheme-query": (cache(f'compile = "ftp://cache.example/?token={SECRET}"'), ("compile", "unknown backend")),
    "compile-port-query": (cache(f'compile = "redis://127.0.0.1:99999/0?password={SECRET}"'), ("compile",)),
    "dist-userinfo": (cache(f'dist = "http://bob:{SECRET}@127.0.0.1:10600"'), ("dist",)),
    "dist-token-query": (cache(f'dist = "http://127.0.0.1:10600?token={SECRET}"'), ("dist",)),
}

FLAG_SECRETS = {  # argv → the flag the refusal names
    "publish-registry-userinfo": ([*PUBLISH, "--registry", f"bob:{SECRET}@{DEAD}/x"], ("--registry",)),
    "publish-registry-url-userinfo": ([*PUBLISH, "--registry", f"https://bob:{SECRET}@{DEAD}/x"], ("--registry",)),
    "publish-registry-query": ([*PUBLISH, "--registry", f"{DEAD}/x?token={SECRET}"], ("--registry",)),
    "publish-registry-long": ([*PUBLISH, "--registry", f"bob:{SECRET * 5}@{DEAD}/x/" + "y" * 80], ("--registry",)),
    "lock-index-userinfo": ([*LOCK, "--index", f"https://bob:{SECRET}@pypi.example/simple"], ("--index",)),
    "lock-index-query": ([*LOCK, "--index", f"https://pypi.example/simple?token={SECRET}"], ("--index",)),
    "lock-index-long": ([*LOCK, "--index", f"https://bob:{SECRET * 5}@pypi.example/" + "s" * 90], ("--index",)),
    "plan-remote-registry-userinfo": ([*PLAN, "--remote", "--cache-remote", f"registry:bob:{SECRET}@{DEAD}/w"], ("--cache-remote",)),
    "plan-remote-index-query": ([*PLAN, "--remote", "--cache-remote", f"index:http://{DEAD}/simple?token={SECRET}"],
                                ("--cache-remote", "no ?query")),
    "plan-remote-index-long": ([*PLAN, "--remote", "--cache-remote", f"index:http://bob:{SECRET * 5}@{DEAD}/" + "s" * 90],
                               ("--cache-remote",)),
    "pull-remote-index-userinfo": (["wheels", "pull", *M, *WH, "--cache-remote", f"index:https://bob:{SECRET}@{DEAD}/simple"],
                                   ("--cache-remote", "no credentials")),
    "push-remote-registry-userinfo": (["wheels", "push", *M, *WH, "--cache-remote", f"registry:bob:{SECRET}@{DEAD}/w"],
                                      ("--cache-remote",)),
    "build-remote-registry-userinfo": ([*DRY, "--cache-remote", f"registry:bob:{SECRET}@{DEAD}/w"], ("--cache-remote",)),
    "build-layer-cache-userinfo": ([*DRY, "--layer-cache", f"bob:{SECRET}@{DEAD}/cache"], ("--layer-cache",)),
    "build-layer-cache-url": ([*DRY, "--layer-cache", f"https://bob:{SECRET}@{DEAD}/cache"], ("--layer-cache",)),
    "doctor-registry-url-userinfo": (["doctor", "--registry", f"https://bob:{SECRET}@{DEAD}"], ("--registry",)),
    "doctor-registry-query": (["doctor", "--registry", f"{DEAD}?token={SECRET}"], ("--registry",)),
    "serve-image-userinfo": (["serve", f"bob:{SECRET}@{DEAD}/x/y:1", "--strategy", "MTP2", "--model", "{tmp}"], ("IMAGE",)),
    "smoke-target-userinfo": (["smoke", f"bob:{SECRET}@{DEAD}/x/y:1", *M], ("smoke",)),
}

ENV_SECRETS = {  # environment → (argv, what the refusal names)
    "layer-cache-userinfo": ({"BUILDER_LAYER_CACHE": f"bob:{SECRET}@{DEAD}/cache"}, DRY, ("--layer-cache",)),
    "layer-cache-query": ({"BUILDER_LAYER_CACHE": f"{DEAD}/cache?token={SECRET}"}, DRY, ("--layer-cache",)),
    "ca-bundle-url": ({"BUILDER_CA_BUNDLE": f"https://bob:{SECRET}@ca.example/ca.pem"}, DRY, ("--ca-bundle",)),
    "registry-password-without-user": ({"BUILDER_REGISTRY_PASSWORD": SECRET}, VERBS["publish"], ("BUILDER_REGISTRY_USER",)),
    "registry-password-and-bad-registry": ({"BUILDER_REGISTRY_USER": "bob", "BUILDER_REGISTRY_PASSWORD": SECRET},
                                           [*PUBLISH, "--registry", f"{DEAD}/X"], ("--registry",)),
    "index-password-without-user": ({"BUILDER_INDEX_PASSWORD": SECRET},
                                    ["wheels", "pull", *M, *WH, "--cache-remote", f"index:http://{DEAD}/simple"],
                                    ("BUILDER_INDEX_USER",)),
}


def _secret_cases() -> list[Case]:
    out = []
    for name, (edit, expect) in MATRIX_SECRETS.items():
        out.append(Case(f"r3-secret-matrix-{name}-plan", "secret", PLAN, matrix=edit, expect=expect))
    for name in ("index-userinfo", "registry-userinfo", "mirrors-value-userinfo", "compile-redis-query", "remote-index-userinfo"):
        edit, expect = MATRIX_SECRETS[name]
        out.append(Case(f"r3-secret-matrix-{name}-build", "secret", DRY, matrix=edit, expect=expect))
    for name, (argv, expect) in FLAG_SECRETS.items():
        out.append(Case(f"r3-secret-flag-{name}", "secret", argv, expect=expect))
    for name, (env, argv, expect) in ENV_SECRETS.items():
        out.append(Case(f"r3-secret-env-{name}", "secret", argv, env=env, expect=expect))
    out.append(Case("r3-secret-env-compile-cache-user-without-password", "secret", DRY, env={"BUILDER_COMPILE_CACHE_USER": SECRET},
                    matrix=cache('compile = "redis://127.0.0.1:6379"'), expect=("BUILDER_COMPILE_CACHE_PASSWORD",)))
    # a docker login whose password is the marker, and a config.json otherwise wrong: never echoed
    login = json.dumps({"auths": {DEAD: {"auth": B64_SECRET}}, "credHelpers": {"ghcr.io": 5}})
    out.append(Case("r3-secret-docker-login-and-bad-helper", "secret", VERBS["publish"], files=config(login), env=ENV,
                    expect=("credHelpers.ghcr.io",)))
    plain = json.dumps({"auths": {DEAD: {"username": "bob", "password": SECRET}, "x": []}})
    out.append(Case("r3-secret-docker-login-plain-and-bad-entry", "secret", VERBS["plan"], files=config(plain), env=ENV,
                    expect=("auths.x must be an object",)))
    return out


# -- remote specs and limits the earlier rounds did not try ------------------------------------------------------
BAD_SPECS = {
    "index-fragment": ("index:http://127.0.0.1:9/simple#x", ("--cache-remote",)),
    "index-no-host": ("index:http:///simple", ("--cache-remote",)),
    "index-port-zero": ("index:http://127.0.0.1:0/simple", ("--cache-remote",)),
    "index-javascript": ("index:javascript:alert(1)", ("--cache-remote",)),
    "index-file": ("index:file:///etc/passwd", ("--cache-remote",)),
    "registry-port-zero": ("registry:127.0.0.1:0/w", ("--cache-remote",)),
    "registry-scheme": ("registry:https://127.0.0.1:9/w", ("--cache-remote",)),
    "registry-query": ("registry:127.0.0.1:9/w?x=1", ("--cache-remote",)),
    "registry-traversal": ("registry:127.0.0.1:9/../w", ("--cache-remote",)),
    "registry-space": ("registry:127.0.0.1:9/a b", ("--cache-remote",)),
    "registry-only-host": ("registry:127.0.0.1:9", ("--cache-remote",)),
    "kind-uppercase": ("REGISTRY:127.0.0.1:9/w", ("--cache-remote",)),
}
LIMITS = {  # environment variable → values refused
    "BUILDER_REMOTE_MAX_DOWNLOAD_BYTES": ("x", "0", "-1", "nan", "1e99", "1.5"),
    "BUILDER_REMOTE_MAX_BYTES": ("inf", "0x10", ""),
    "BUILDER_REMOTE_TIMEOUT": ("1e308", "-inf", " "),
}


def _remote_cases() -> list[Case]:
    out = []
    for name, (spec, expect) in BAD_SPECS.items():
        out.append(Case(f"r3-remote-spec-{name}-pull", "remote", ["wheels", "pull", *M, *WH, "--cache-remote", spec], expect=expect))
        out.append(Case(f"r3-remote-spec-{name}-push", "remote", ["wheels", "push", *M, *WH, "--cache-remote", spec],
                        files={"wh": wheelhouse_entry}, expect=expect))
    for var, values in LIMITS.items():
        for v in values:
            for verb, argv in (("pull", VERBS["pull"]), ("lock", [*LOCK]), ("doctor", ["doctor", "--registry", DEAD])):
                out.append(Case(f"r3-remote-limit-{var.lower()}-{v!r}-{verb}", "remote", argv, env={var: v}, expect=(var,)))
    out.append(Case("r3-remote-matrix-table-no-url-push", "remote", ["wheels", "push", *M, *WH],
                    matrix=cache('remotes = [{ kind = "index" }]'), files={"wh": wheelhouse_entry}, expect=("remotes",)))
    out.append(Case("r3-remote-matrix-table-url-number", "remote", [*PLAN, "--remote"],
                    matrix=cache('remotes = [{ kind = "registry", url = 5 }]'), expect=("remotes",)))
    out.append(Case("r3-remote-matrix-table-push-string", "remote", [*PLAN, "--remote"],
                    matrix=cache('remotes = [{ kind = "registry", url = "127.0.0.1:9/w", push = "yes" }]'), expect=("push",)))
    return out


CASES: list[Case] = [*_docker_config_cases(), *_secret_cases(), *_remote_cases()]
