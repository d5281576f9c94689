"""Issue 34: BUILDER_REGISTRY_HOST, the one host BUILDER_REGISTRY_USER / _PASSWORD are bound to
(builder/net.py env_credentials_apply), checked before any verb works: a value that is not HOST[:PORT] is
refused (exit 2, the variable named, nothing written, no docker call), whichever verb is run, and a password
written into it is never echoed. The remotes named (127.0.0.1:9) are never reached."""

from __future__ import annotations

from tests.hardening.cases import DRY, M, PLAN, PUBLISH, SECRET, SERVE, SMOKE, WH, Case

DEAD = "127.0.0.1:9"
VERBS = {
    "build": DRY,
    "publish": [*PUBLISH, "--registry", f"{DEAD}/x", "--retries", "0"],
    "plan": [*PLAN, "--remote", "--cache-remote", f"registry:{DEAD}/w"],
    "pull": ["wheels", "pull", *M, *WH, "--cache-remote", f"registry:{DEAD}/w"],
    "serve": SERVE,
    "smoke": SMOKE,
    "bench": ["bench", "run", f"{DEAD}/builder-test/cuda-ext:1", "--model", "{tmp}", "--gpus", "none"],
    "doctor-host": ["doctor", "--host", f"{DEAD}/builder-test/cuda-ext:1"],
}
BAD_HOSTS = {  # name → BUILDER_REGISTRY_HOST value
    "space": "a b",
    "path": f"{DEAD}/team",
    "scheme": f"https://{DEAD}",
    "port-word": "registry:http",
    "port-out-of-range": "127.0.0.1:70000",
    "port-zero": "127.0.0.1:0",
    "newline": f"{DEAD}\nx",
    "leading-dash": "-registry",
    "credentials": f"ci:{SECRET}@{DEAD}",
}

CASES: list[Case] = [
    Case(f"cred-registry-host-{name}-{verb}", "credentials", argv, env={"BUILDER_REGISTRY_HOST": value,
                                                                        "BUILDER_REGISTRY_USER": "ci",
                                                                        "BUILDER_REGISTRY_PASSWORD": SECRET},
         expect=("BUILDER_REGISTRY_HOST", "is not a registry host"))
    for name, value in BAD_HOSTS.items() for verb, argv in VERBS.items()
]
