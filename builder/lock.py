"""`builder lock`: read each package's own metadata once and record it in matrix.lock.

Torch pins and companion versions are never hand-typed: they come from the engine's published wheel
metadata (Requires-Dist), and every sdist is recorded with its sha256. Git sources record the commit a tag
points at, when the git host is reachable; otherwise the entry says so and builds refuse it unless told.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import docker
from .engines import Knowledge, load_knowledge
from .errors import UserError
from .imageref import ImageRef
from .lockfile import LOCK_FORMAT, Lock
from .pypi import SimpleIndex

def resolve_git_commit(repository: str, tag: str) -> tuple[str, str]:
    """(commit, "") or ("", reason) — a tag is only a pin once we know the commit it names."""
    code, stdout, stderr = docker.git_ls_remote(repository, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}")
    if code != 0:
        return "", f"git ls-remote {repository} failed: {stderr.strip().splitlines()[-1] if stderr.strip() else code}"
    refs = dict(reversed(line.split("\t")) for line in stdout.splitlines() if "\t" in line)
    commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}", "")
    return (commit, "") if commit else ("", f"tag {tag} not found in {repository}")


def index_wheels(index: SimpleIndex, project: str, version: str, required: bool = True) -> list[dict]:
    """The release's Linux wheels, each with the sha256 the index lists: what a profile that takes the package
    from the index (profiles.<name>.source) may install; resolve picks the one the cell's Python and OS take.
    Each also records the torch its own metadata pins ("" for none) and its Requires-Python: what `plan` can know
    of a `source = "auto"` choice before any download. `required`: none is an error ("index"), else [] ("auto":
    the release is compiled)."""
    from .pypi import IndexError_

    try:
        files = [f for f in index.release_files(project, version) if f.is_wheel and f.sha256
                 and ("linux" in f.filename or f.filename.endswith("-none-any.whl"))]
    except (IndexError_, UserError):  # no such project or release on the index (a 404): nothing published there
        if required:
            raise
        files = []
    if not files and required:
        raise UserError(f"{project} {version}: the index publishes no Linux wheel with a sha256; it cannot be taken "
                        "from the index (remove it from the profile's source table to build it)")
    wheels = []
    for f in sorted(files, key=lambda f: f.filename):
        meta = index.file_metadata(f)
        wheels.append({"filename": f.filename, "url": f.url, "sha256": f.sha256, "torch": meta.pin("torch") or "",
                       "requires_python": meta.requires_python or ""})
    return wheels


def torch_cuda(index: SimpleIndex, version: str) -> dict | None:
    """The CUDA major the index's torch `version` is built for, with the requirement that says so, read from the
    metadata of its Linux x86_64 wheel (PEP 658, else the wheel's zip by HTTP ranges): plan refuses a cell whose CUDA
    has another major. None for a torch that requires no CUDA wheels."""
    wheels = sorted((f for f in index.release_files("torch", version)
                     if f.is_wheel and "manylinux" in f.filename and "x86_64" in f.filename),
                    key=lambda f: (not f.has_metadata, f.filename))
    if not wheels:
        return None
    found = index.file_metadata(wheels[0]).cuda_major()
    return {"major": found[0], "from": found[1]} if found else None


def lock_package(kn: Knowledge, index: SimpleIndex, name: str, version: str, consumer_tag: str = "",
                 wheels: bool = False, auto: bool = False) -> dict:
    """One lock entry, read from the index (and the git host for git sources); with `wheels` (or `auto`), the
    release's published Linux wheels too (`auto`: none is no error)."""
    r = kn.recipe(name, version)
    entry: dict = {}
    if wheels or auto:
        entry["wheels"] = index_wheels(index, r.pypi, version, required=not auto)
    if r.torch_pin in ("metadata",) or r.torch_pin.startswith("via:") or r.companions:
        meta = index.metadata(r.pypi, version)
        entry["requires_python"] = meta.requires_python or ""
        pins = {}
        for comp in r.companions:
            # a companion its metadata does not pin (SGLang 0.3.x's flashinfer) has its version in the engine data
            pin = meta.pin(kn.recipe_pypi(comp), r.pin_extras) or dict(r.companion_versions).get(comp)
            if pin is None:
                raise UserError(f"{name} {version}: its metadata pins no exact {comp} version")
            pins[comp] = pin
        if r.torch_pin == "metadata":
            torch = meta.pin("torch", r.pin_extras)
            if torch is None:
                raise UserError(f"{name} {version}: its metadata pins no exact torch version")
            entry["torch"] = torch
            cuda = torch_cuda(index, torch)
            if cuda is not None:
                entry["torch_cuda"] = cuda
        if pins:
            entry["pins"] = pins
    if r.source == "sdist":
        sd = index.sdist(r.pypi, version)
        if sd is None:
            raise UserError(f"{name} {version}: no sdist on the index; it needs a git source")
        entry["sdist"] = {"filename": sd.filename, "url": sd.url, "sha256": sd.sha256}
    else:
        tag = consumer_tag if r.git_tag == "from:sglang" else r.git_tag
        commit, why = resolve_git_commit(r.git_repository, tag)
        entry["git"] = {"repository": r.git_repository, "tag": tag, "commit": commit}
        if why:
            entry["git"]["unresolved"] = why
    return entry


def _download(index: SimpleIndex, url: str, sha256: str, filename: str) -> Path:
    """A file the index lists (an sdist, a wheel) in the user cache, verified against the sha256 the index lists:
    streamed to disk under the download cap (builder/download.py), not read whole as a document."""
    import requests

    from .files import sha256_file
    from .download import fetch_pinned
    from .net import with_timeouts

    path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "builder" / "sdists" / sha256 / filename
    if path.is_file() and sha256_file(path) == sha256:
        return path
    with with_timeouts(requests.Session()) as session:
        return fetch_pinned(session, url, path, sha256)


def refresh_fetch_plan(index: SimpleIndex, name: str, version: str, sdist: dict, echo=print) -> Path:
    """Read the external sources the sdist's own CMake files download, into data/fetchplans/."""
    from . import deps

    known = deps.committed_plan(name, version)
    if known is not None and known.get("sdist", {}).get("sha256") == sdist["sha256"]:
        return deps.plan_path(name, version)
    path = _download(index, sdist["url"], sdist["sha256"], sdist["filename"])
    doc = deps.read_plan_from_sdist(path, name, version)
    target = deps.commit_plan(doc, name, version)
    if doc.get("unresolved"):
        echo(f"  {name} {version}: fetch plan UNPINNED ({doc['unresolved']}); wrote {target.name} saying so")
    echo(f"wrote fetch plan {target.name}: {len(doc['sources'])} external sources")
    return target


def refresh_fetch_plan_git(name: str, version: str, git: dict, subdir: str, echo=print, *, cuda: str = "") -> Path | None:
    """Read the external sources a git source's CMake files download, at the locked commit, into
    data/fetchplans/ (None, said on `echo`, when the commit is unknown or cannot be fetched). `lock` and `build`
    (when it pins a tag itself) both come here. A CMake form the reader cannot resolve still writes the plan
    file: it says "unresolved" with the file and line, and that one package is UNPINNED."""
    import tempfile

    from . import deps

    commit = git.get("commit", "")
    if not commit:
        echo(f"  {name} {version}: fetch plan not read: the commit of {git.get('tag', '?')} is unknown")
        return None
    known = deps.committed_plan(name, version)
    if known is not None and known.get("git", {}).get("commit") == commit \
            and known.get("cuda", "") == _short_cuda(cuda):
        return deps.plan_path(name, version)
    with tempfile.TemporaryDirectory(prefix="builder-plan-") as tmp:
        code, why = docker.git_fetch_commit(git["repository"], commit, Path(tmp))
        if code != 0:
            echo(f"  {name} {version}: fetch plan not read: cannot fetch {git['repository']} {commit} ({why})")
            return None
        doc = deps.read_plan_from_tree(Path(tmp), name, version, repository=git["repository"], commit=commit,
                                       subdir=subdir, cuda=_short_cuda(cuda))
    target = deps.commit_plan(doc, name, version)
    if doc.get("unresolved"):
        echo(f"  {name} {version}: fetch plan UNPINNED ({doc['unresolved']}); wrote {target.name} saying so")
    else:
        echo(f"wrote fetch plan {target.name}: {len(doc['sources'])} external sources")
    return target


def _short_cuda(cuda: str) -> str:
    """"13.0.3" -> "13.0": what CMake's CUDA_VERSION holds."""
    return ".".join(cuda.split(".")[:2]) if cuda else ""


def lock_dep_tags(name: str, version: str, echo=print) -> dict:
    """Commits for the sources an engine's CMake names by tag (the fetch plan says which)."""
    from . import deps

    out = {}
    for source, repository, tag in deps.tags_to_pin(name, version):
        commit, why = resolve_git_commit(repository, tag)
        out[source] = {"repository": repository, "tag": tag, "commit": commit}
        if why:
            out[source]["unresolved"] = why
            echo(f"  {name} {version}: CMake dependency {source} {tag} UNPINNED ({why})")
    return out


def base_image_digest(ref: str) -> tuple[str, str, str]:
    """(digest, where it was read, "") or ("", "", why not) for a base image: the registry's manifest digest (the
    registry API client, builder/registry_api.py: the sha256 of exactly the bytes the tag names, an index for a
    multi-platform image), else the local daemon's (a local base, or one pulled earlier). A pinned FROM then never
    moves."""
    from . import registry_api

    parsed = ImageRef.parse(ref, "base image")
    if parsed.digest:
        return parsed.digest, "the reference itself", ""
    try:
        with registry_api.Client(registry_api.endpoint(parsed.api_host)) as client:
            digest = client.digest(f"{parsed.api_host}/{parsed.api_repository}", parsed.reference)
        if digest:
            return digest, f"registry {parsed.host}", ""
        why = "the registry has no such image"
    except registry_api.Unusable as exc:
        why = str(exc)[:200]
    local = docker.repo_digest(ref)
    if local:
        return local, "the local Docker daemon", ""
    return "", "", f"not in its registry ({why}) nor in the local Docker daemon"


def lock_base_images(lock: Lock, refs: list[str], echo=print) -> Lock:
    """Record the digest of every base image the selected profiles build FROM."""
    table = lock.data.setdefault("base_images", {})
    for ref in sorted(set(refs)):
        digest, where, why = base_image_digest(ref)
        table[ref] = {"digest": digest, "from": where} if digest else {"digest": "", "unresolved": why}
        echo(f"locked base {ref}@{digest} (from {where})" if digest else f"base {ref} UNPINNED: {why}")
    lock.data["base_images"] = dict(sorted(table.items()))
    return lock


def run_lock(raw_matrix: dict, lock: Lock, index_url: str, echo=print, kn: Knowledge | None = None,
             profiles: tuple[str, ...] = (), engines: tuple[str, ...] = ()) -> Lock:
    """Read metadata for every package version the matrix names (and their companions), or only those of the
    given profiles / engines; entries already in `lock` for the rest are kept."""
    kn = kn or load_knowledge()
    index = SimpleIndex(index_url)
    todo: list[tuple[str, str, str, str]] = []  # (name, version, consumer tag, the profile's CUDA)
    from_index: set[str] = set()  # packages some selected profile takes from the index: their wheels are recorded
    auto: set[str] = set()  # packages some selected profile takes from the index or compiles (source = "auto")
    for prof_name, prof in raw_matrix.get("profiles", {}).items():
        if profiles and prof_name not in profiles:
            continue
        from_index |= {pkg for pkg, choice in prof.get("source", {}).items() if choice == "index"}
        auto |= {pkg for pkg, choice in prof.get("source", {}).items() if choice == "auto"}
        selected = [(e, v) for e, v in prof.get("engines", {}).items() if not engines or e in engines]
        for eng, ver in selected:
            todo.append((eng, ver, "", str(prof.get("cuda", ""))))
        if prof.get("flash_attn") and selected:
            todo.append(("flash-attn", prof["flash_attn"], "", str(prof.get("cuda", ""))))
    packages = lock.data.setdefault("packages", {})
    done: set[str] = set()
    while todo:
        name, version, consumer_tag, cuda = todo.pop(0)
        key = f"{name}=={version}"
        if key in done:
            continue
        done.add(key)
        r = kn.recipe(name, version)
        if r.source == "local":
            if name in from_index or name in auto:  # an in-house package whose wheels a private index publishes
                packages[key] = {"wheels": index_wheels(index, r.pypi, version, required=name in from_index)}
                echo(f"locked {key} wheels from the index")
            continue  # else pinned by content hash at plan time, nothing on an index to read
        entry = lock_package(kn, index, name, version, consumer_tag, wheels=name in from_index, auto=name in auto)
        packages[key] = entry
        if r.fetch_plan and "sdist" in entry:
            refresh_fetch_plan(index, name, version, entry["sdist"], echo)
            entry["deps"] = lock_dep_tags(name, version, echo)
        elif r.fetch_plan and "git" in entry:
            if refresh_fetch_plan_git(name, version, entry["git"], r.subdir_at(entry["git"]["tag"]), echo, cuda=cuda):
                entry["deps"] = lock_dep_tags(name, version, echo)
        note = f"torch {entry['torch']}" if "torch" in entry else ""
        if entry.get("git", {}).get("unresolved"):
            note += f" UNPINNED ({entry['git']['unresolved']})"
        echo(f"locked {key} {note}".rstrip())
        for comp, comp_version in entry.get("pins", {}).items():
            todo.append((comp, comp_version, r.git_tag, cuda))
    lock.data["index"] = index_url
    lock.data["format"] = LOCK_FORMAT
    lock.data["packages"] = dict(sorted(packages.items()))
    return lock


def pin_git_sources(cells: list, echo=print) -> list:
    """Cells whose git sources (and CMake dependencies) the lock knows only by tag, pinned to the commit the
    tag names now.

    `build` calls this so a host that reaches the git host builds from a verified commit even before
    `builder lock` has recorded it; where the tag cannot be resolved the source stays unpinned (and build
    refuses it unless --allow-unpinned).
    """
    from . import deps

    resolved: dict[tuple[str, str], str] = {}

    def resolve(repository: str, tag: str) -> str:
        if (repository, tag) not in resolved:
            commit, why = resolve_git_commit(repository, tag)
            resolved[(repository, tag)] = commit
            echo(f"{repository} {tag}: " + (f"resolved to {commit} (run `builder lock` to record it)"
                                            if commit else f"cannot resolve ({why})"))
        return resolved[(repository, tag)]

    out = []
    for cell in cells:
        packages = []
        for pkg in cell.packages:
            src = pkg.source
            if src.kind == "git" and not src.commit:
                commit = resolve(src.repository, src.tag)
                if commit:
                    pkg = dataclasses.replace(pkg, source=dataclasses.replace(src, commit=commit))
            if pkg.recipe.fetch_plan and not pkg.from_index and pkg.source.kind == "git" and pkg.source.commit:
                # the commit is known now: its fetch plan is read the way `builder lock` reads it (same code)
                refresh_fetch_plan_git(pkg.name, pkg.version, {"repository": pkg.source.repository,
                                                               "tag": pkg.source.tag, "commit": pkg.source.commit},
                                       pkg.source.subdir, echo, cuda=pkg.cuda)
            if pkg.recipe.fetch_plan and not pkg.from_index:
                pins = dict(pkg.deps_pins)
                for source, repository, tag in deps.tags_to_pin(pkg.name, pkg.version):
                    if source not in pins and (commit := resolve(repository, tag)):
                        pins[source] = commit
                pkg = dataclasses.replace(pkg, deps_pins=tuple(sorted(pins.items())))
            packages.append(pkg)
        out.append(dataclasses.replace(cell, packages=tuple(packages)))
    return out
