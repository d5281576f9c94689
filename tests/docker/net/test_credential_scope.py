"""Issue 34, item 1: a registry credential is bound to the host it was given for, and sent only after that host

The Docker half of tests/unit/net/test_credential_scope.py: its docstring says the rest."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from builder import net, registry_api


def _push_image(client: registry_api.Client, repository: str, tag: str, labels: dict) -> str:
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                      "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    digest = client.upload(repository, cfg)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": registry_api.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest,
                                      "size": len(cfg)}, "layers": []}).encode()
    resp = client.send("PUT", client.url(repository, "manifests", tag), repository, push=True, data=manifest,
                       headers={"Content-Type": registry_api.OCI_MANIFEST})
    resp.close()
    assert resp.status_code == 201, resp.status_code
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_the_credentials_still_work_against_their_own_host(auth_registry, monkeypatch, tmp_path):
    """The real registry with htpasswd: BUILDER_REGISTRY_HOST names it, so a deployer's read of an image there
    gets in (after its 401) and reads the digest; unbound, the same read is refused in one line naming the
    credentials, not a vague "not readable"."""
    from builder.deploy import subject
    from builder.errors import EnvironmentProblem

    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("BUILDER_REGISTRY_USER", auth_registry.user)
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", auth_registry.password)
    monkeypatch.delenv("BUILDER_REGISTRY_HOST", raising=False)
    repository, tag = f"{auth_registry.host}/cred/img", f"t{uuid.uuid4().hex[:8]}"
    where = registry_api.RegistryPath.parse(f"{auth_registry.host}/cred", "--registry")  # given: its own
    with registry_api.Client(where) as client:
        digest = _push_image(client, repository, tag, {"io.builder.engine": "vllm"})
    ref = f"{repository}:{tag}"
    with pytest.raises(EnvironmentProblem, match=r"access refused \(credentials\)") as caught:
        subject.read_registry(ref)
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("BUILDER_REGISTRY_HOST", auth_registry.host)
    found = subject.read_registry(ref)
    assert found is not None and found.digest == f"{repository}@{digest}" and found.labels["io.builder.engine"] == "vllm"
    assert net.registry_credentials(auth_registry.host)[0] == (auth_registry.user, auth_registry.password)
