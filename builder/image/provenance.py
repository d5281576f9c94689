"""The SLSA provenance v1 of a cell's image (https://slsa.dev/spec/v1.0/provenance), made by publish from what the
build itself used, and checked by `builder verify` against a matrix.lock.

    buildDefinition.buildType            BUILD_TYPE: a cell of a builder matrix, built by BuildKit
    buildDefinition.externalParameters   the cell (id, engine, version, CUDA, torch, Python, archs, strategies) and
                                         every package it compiles: version, source (git repository + tag + commit,
                                         or sdist / index file + sha256), arch knobs, the fetch plan's sources by commit
    buildDefinition.internalParameters   the rendered Dockerfile's sha256, the build arguments, the layer compression,
                                         the content key (steps/image.py: every input of the runtime build)
    buildDefinition.resolvedDependencies base images by digest, sources by commit or sha256, the fetch plans shipped
                                         with builder, the cell's wheels and the runtime pins file, each by sha256
    runDetails                           builder's version, BuildKit's, where it ran, when

What level this claims (SLSA Build track): L1 always (the provenance exists, made by the build); signed by a key that
only CI holds, L2 in spirit (a hosted build platform signs it) — but the builds are not isolated from one another
(one BuildKit cache and one wheelhouse serve every cell, a compile step may reach an sccache backend), so never L3.
`LEVEL` says so in the provenance itself, and docs/deployers.md explains it.
"""

from __future__ import annotations

import os

from .. import __version__
from . import attest

BUILD_TYPE = "https://builder.invalid/buildtypes/cell/v1"  # a URI naming this build's shape; not fetched by anyone
WARM_BUILD_TYPE = "https://builder.invalid/buildtypes/warm/v1"  # `builder warm`: the cold image plus a boot's caches
LEVEL = ("SLSA Build L1: provenance made by the build; L2 only where a hosted CI holds the signing key; not L3: "
         "builds share one BuildKit cache and wheelhouse, and a compile may reach a shared object cache")


def builder_id(environ=None) -> str:
    """Who ran the build: the CI run where one is said (GitHub Actions' variables), else this host's builder."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env.get('GITHUB_RUN_ID', '')}"
    return "urn:builder:local"


def source_of(source) -> dict:
    """A package source (resolve.Source) as recorded: what the lock pins it by."""
    keep = {"sdist": ("url", "filename", "sha256"), "git": ("repository", "tag", "commit", "subdir"),
            "index": ("url", "filename", "sha256"), "local": ("sha256",)}[source.kind]
    return {"kind": source.kind, **{k: getattr(source, k) for k in keep if getattr(source, k)}}


def _dependency(name: str, source: dict) -> dict:
    if source["kind"] == "git":
        return {"name": name, "uri": f"git+{source['repository']}@{source.get('tag') or source.get('commit', '')}",
                "digest": {"gitCommit": source.get("commit", "")}}
    return {"name": name, "uri": source.get("url") or f"{source['kind']}:{source.get('filename', name)}",
            "digest": {"sha256": source.get("sha256", "")}}


def predicate(cell: dict, packages: list[dict], content: dict, fetchplans: dict[str, str], *, started: str,
              finished: str, versions: dict[str, str], invocation: str = "", environ=None) -> dict:
    """The provenance predicate. `cell`: the cell's facts; `packages`: [{name, version, source (source_of), archs,
    deps: {source: commit}}]; `content`: the image step's content record (steps/image.py content_key's inputs);
    `fetchplans`: {file name: sha256} of the fetch plans the cell's packages were pinned with."""
    deps = []
    for arg, base in sorted((content.get("bases") or {}).items()):
        deps.append({"name": arg, "uri": f"docker://{base['ref']}", "digest": {"sha256": base["digest"].split(":")[-1]}})
    for p in packages:
        deps.append(_dependency(p["name"], p["source"]))
        for dep, commit in sorted(p.get("deps", {}).items()):
            deps.append({"name": f"{p['name']}/{dep}", "uri": f"fetchplan:{p['name']}-{p['version']}/{dep}",
                         "digest": {"gitCommit": commit}})
    for name, sha in sorted(fetchplans.items()):
        deps.append({"name": name, "uri": f"builder:data/fetchplans/{name}", "digest": {"sha256": sha}})
    for name, sha in sorted((content.get("wheels") or {}).items()):
        deps.append({"name": name, "uri": f"wheel:{name}", "digest": {"sha256": sha}})
    pins = content.get("runtime_pins")
    if isinstance(pins, dict):
        deps += [{"name": n, "uri": f"runtime-pins:{n}", "digest": {"sha256": s}} for n, s in sorted(pins.items())]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"cell": cell, "packages": packages},
            "internalParameters": {"dockerfile_sha256": content.get("dockerfile", ""),
                                   "build_args": content.get("build_args") or {}, "layers": content.get("layers") or {},
                                   "target": content.get("target", "")},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": builder_id(environ), "version": {"builder": __version__, **versions}},
            "metadata": {"invocationId": invocation, "startedOn": started, "finishedOn": finished},
            "byproducts": [{"name": "slsa-level", "content": attest.b64(LEVEL.encode()), "mediaType": "text/plain"}],
        },
    }


def warm_predicate(of: str, layer: str, facts: dict, *, started: str, finished: str, environ=None) -> dict:
    """The provenance of a warm image (builder/deploy/warm): FROM the cold image `of` (REPO@sha256:...), one layer
    `layer` (its digest) holding what a boot on `facts`' GPU, driver, model and engine arguments compiled, under the
    warm key `facts["key"]` — the same values as the image's io.builder.warm.* labels, which verify compares."""
    claim = {"of": of, "layer": layer, **{k: facts.get(k) for k in ("key", "strategy", "gpu", "gpu-arch", "driver",
                                                                     "engine", "model", "model-config-sha256",
                                                                     "engine-args", "captured-on")}}
    repo, _, digest = of.partition("@")
    return {
        "buildDefinition": {"buildType": WARM_BUILD_TYPE, "externalParameters": {"warm": claim},
                            "resolvedDependencies": [{"name": "cold image", "uri": f"docker://{repo}",
                                                      "digest": {"sha256": digest.split(":")[-1]}}]},
        "runDetails": {"builder": {"id": builder_id(environ), "version": {"builder": __version__}},
                       "metadata": {"startedOn": started, "finishedOn": finished},
                       "byproducts": [{"name": "warm layer", "digest": {"sha256": layer.split(":")[-1]}}]},
    }


def packages_of(doc: dict) -> list[dict]:
    """The packages a provenance statement says the image compiled (externalParameters.packages), [] when none."""
    params = ((doc.get("predicate") or {}).get("buildDefinition") or {}).get("externalParameters") or {}
    got = params.get("packages")
    return [p for p in got if isinstance(p, dict)] if isinstance(got, list) else []


def against_lock(doc: dict, lock) -> list[str]:
    """What a provenance says was built that the lock (lockfile.Lock) does not pin: one line per difference."""
    from ..errors import UserError

    out = []
    for p in packages_of(doc):
        name, version, source = p.get("name", ""), p.get("version", ""), p.get("source") or {}
        if source.get("kind") == "local":  # a directory of the matrix's own: no lock pins it
            continue
        try:
            locked = lock.get(name, version)
        except UserError:
            out.append(f"{name}=={version}: built, but {lock.path.name} has no entry for it")
            continue
        kind = source.get("kind")
        if kind == "git":
            want = locked.git.get("commit", "")
            if want != source.get("commit"):
                out.append(f"{name}=={version}: built from commit {source.get('commit', '')[:12] or 'none'}, "
                           f"{lock.path.name} pins {want[:12] or 'none'}")
        elif kind == "sdist":
            want = locked.sdist.get("sha256", "")
            if want != source.get("sha256"):
                out.append(f"{name}=={version}: built from an sdist of sha256 {source.get('sha256', '')[:12]}, "
                           f"{lock.path.name} pins {want[:12] or 'none'}")
        for dep, commit in sorted((p.get("deps") or {}).items()):
            want = (locked.deps.get(dep) or {}).get("commit", "")
            if want and want != commit:
                out.append(f"{name}=={version}: its fetch-plan source {dep} at {commit[:12]}, {lock.path.name} pins "
                           f"{want[:12]}")
    return out
