"""What a deployer works on: an image, by its reference. `read` finds its config and labels in the local daemon,
else in its registry without pulling (the registry API: manifest, then the config blob), else in a saved JSON
of them (`docker image inspect` output, an OCI image config, skopeo's summary). `Subject.plan` is the engine
recipe and the cell the image was built as, from the built-in engine data by the engine and version its labels
name — no matrix needed; a matrix is used only where one is given (smoke L0 then holds the image to that plan),
and the build's smoke step passes its own cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import files as files_mod
from .. import grammar, schema
from ..image import labels as labels_mod
from ..errors import EnvironmentProblem, UserError
from ..imageref import ImageRef

LOCAL, REGISTRY, FILE = "local image", "registry (not pulled)", "file"


@dataclass(frozen=True)
class Subject:
    ref: str
    source: str  # LOCAL, REGISTRY or FILE
    config: dict = field(default_factory=dict)  # the image config's "config": Env, Labels, Entrypoint, Cmd
    digest: str = ""  # NAME@sha256:... (local: its first RepoDigest, else its id)
    image_id: str = ""  # a local image's ID: exactly the image read (its tag may move after)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("Labels") or {})

    @property
    def env(self) -> dict[str, str]:
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in self.config.get("Env") or [])

    @property
    def entrypoint(self) -> list[str] | None:
        return self.config.get("Entrypoint")

    @property
    def local(self) -> bool:
        return self.source == LOCAL

    @property
    def strategies(self) -> tuple[str, ...]:
        """What the image was built and smoke-tested for (its io.builder.strategies label)."""
        return tuple(labels_mod.strategies(self.labels))

    def engine(self) -> tuple[str, str]:
        engine, version = labels_mod.engine(self.labels)
        if not engine or not version:
            raise UserError(f"{self.ref}: no {labels_mod.ENGINE} / {labels_mod.ENGINE_VERSION} labels: not an image "
                            "builder made")
        return engine, version

    def recipe(self, kn=None):
        """The engine recipe of the built-in engine data (or of `kn`) for the engine version the labels name."""
        from ..engines import load_knowledge

        return (kn or load_knowledge()).recipe(*self.engine())

    def plan(self, kn=None, matrix=None, sel=None):
        """The cell this image was built as: the matrix's cell its io.builder.cell label names when a matrix is
        given (in the selection `sel`, else any profile), else one made from the labels and the engine data."""
        label = labels_mod.cell(self.labels)
        if not label:
            raise UserError(f"{self.ref} carries no {labels_mod.CELL} label: it was not built by builder")
        if matrix is not None:
            from ..matrix import Selection

            cell, _ = find_cell(matrix, sel or Selection(), label)
            if cell is None:
                raise UserError(f"{self.ref} is labelled cell {label}, which {matrix.path} does not have")
            return cell
        return cell_from_labels(self.ref, self.labels, kn)


def cell_from_labels(ref: str, labels: dict[str, str], kn=None):
    """The cell an image's labels describe (engine, versions, CUDA, torch, Python, archs, strategies, each
    package's version and source), its recipes and JIT facts from the engine data: what smoke and bench hold
    the image to when no matrix is given."""
    from .. import archs as archs_mod
    from ..engines import load_knowledge
    from ..matrix import Profile
    from ..resolve import Cell, Package, Source

    kn = kn or load_knowledge()
    engine, version = Subject(ref, FILE, {"Labels": labels}).engine()
    missing = [k for k in (labels_mod.CUDA, labels_mod.PYTHON, labels_mod.ARCHS) if not labels.get(k)]
    if missing:
        raise UserError(f"{ref}: no {', '.join(missing)} label: not an image builder made")
    cell_id = labels_mod.cell(labels) or ""
    archs = tuple(archs_mod.parse(labels[labels_mod.ARCHS], f"{ref}: label {labels_mod.ARCHS}"))
    cuda, python = labels[labels_mod.CUDA], labels[labels_mod.PYTHON]
    eng = kn.recipe(engine, version)
    packages, sources = [], {}
    names = [engine] + [n for n in labels_mod.packages(labels) if n != engine]
    for name in names:
        facts = labels_mod.package_facts(labels, name)
        r = eng if name == engine else kn.recipe(name, facts["version"])
        kind = "index" if facts["source"].startswith("index:") else "sdist"
        if kind == "index":
            sources[name] = "index"
        packages.append(Package(recipe=r, source=Source(kind=kind), archs=archs, cuda=cuda))
    prebuilt = labels_mod.jit_prebuilt(labels)
    profile = Profile(name="image", cuda=cuda, os="", python=python, torch=labels.get(labels_mod.TORCH) or None,
                      flash_attn=None, engines={engine: version}, strategies=tuple(labels_mod.strategies(labels)),
                      archs=archs, base_images={}, sources=sources, jit={engine: "prebuilt"} if prebuilt else {})
    jit = kn.runtime_jit(cuda) if eng.runtime_jit else None
    serve_jit = tuple(kn.serve_jit(name, python) for name in eng.serve_jit)
    jit_modules = kn.jit_modules_of(eng, profile.strategies)
    parsed = ImageRef.parse(ref)
    image, tag = parsed.name, parsed.tag
    return Cell(id=cell_id, engine=engine, version=version, profile=profile, torch=labels.get(labels_mod.TORCH, ""),
                archs=archs, packages=tuple(packages), strategies=profile.strategies, base_devel="", base_runtime="",
                image=image, tag=tag, runtime_jit=jit, serve_jit=serve_jit, jit_modules=jit_modules,
                jit_prebuilt=prebuilt, compile_caches=kn.compile_caches_of(eng),
                cache_root=kn.cache_root_of(eng), warm_allowance=eng.warm_allowance)


# -- reading -------------------------------------------------------------------------------------------------
def config_from_json(ref: str, data) -> dict:
    """docker image inspect (a list of one, or one object), an OCI image config ({"config": {...}}), or skopeo
    inspect's summary ({"Labels": ..., "Env": ...}) → the config, checked by its shape (schema.IMAGE_CONFIG)."""
    if isinstance(data, list):
        if len(data) != 1:
            raise UserError(f"{ref}: an inspect list of {len(data)} images; give one image per file")
        data = data[0]
    if not isinstance(data, dict):
        raise UserError(f"{ref}: not an image config (expected a JSON object, got {schema.noun_of(data)})")
    config = next((data[k] for k in ("Config", "config") if data.get(k) is not None), data)
    schema.check(f"{ref}: image config", config, schema.IMAGE_CONFIG)
    return config


def is_file_ref(ref: str) -> bool:
    return ref.endswith(".json") or Path(ref).exists()


def read(ref: str, client=None, what: str = "IMAGE", files: bool = True) -> Subject:
    """The image REF: a JSON file of its config (with `files`), else the local daemon's (through `client`, the
    docker SDK client, made here when not given; no daemon is no local image), else its registry's (nothing
    pulled)."""
    path = Path(ref)
    if files and is_file_ref(ref):
        if not path.exists() and not path.is_symlink():
            raise UserError(f"{ref}: no such file")
        data = files_mod.load_json(path, "image config (JSON)")
        first = data[0] if isinstance(data, list) and len(data) == 1 else data
        digests = first.get("RepoDigests") if isinstance(first, dict) else None  # docker image inspect's
        digest = digests[0] if isinstance(digests, list) and digests and isinstance(digests[0], str) else ""
        return Subject(ref, FILE, config_from_json(ref, data), digest)
    grammar.check(grammar.image_ref, ref, what)  # neither a file nor an image reference: no docker call
    ImageRef.parse(ref, what)  # nor a malformed digest (sha256 is 64 lowercase hex digits)
    found = read_local(ref, client)
    if found is None:
        found = read_registry(ref)
    if found is None:
        raise UserError(f"{ref}: not a local image, not readable from its registry and not a JSON file of its config "
                        f"(docker image inspect {ref} > image.json on a host that has it)")
    return found


def read_local(ref: str, client=None) -> Subject | None:
    from .runtime import engine

    if client is None:
        try:
            client = engine.docker_client()
        except EnvironmentProblem:
            return None
    img = engine.local_image(client, ref)
    if img is None:
        return None
    attrs = img.attrs or {}
    return Subject(ref, LOCAL, dict(attrs.get("Config") or {}), (attrs.get("RepoDigests") or [img.id])[0], img.id)


def pinned(found: Subject, client, say=lambda s: None) -> str:
    """What smoke and bench run: exactly the image that was read, never what its tag names by then. A local image
    by its ID; one read from its registry pulled by the digest read (NAME@sha256:..., ImageRef.with_digest) and
    run by the ID that pull gave: a tag moved between the read and the run changes nothing."""
    from .runtime import engine

    if found.local:
        return found.image_id or found.digest
    say(f"{found.ref}: read from its registry; pulling {found.digest} to run it")
    engine.pull(client, found.digest)
    img = engine.local_image(client, found.digest)
    if img is None:
        raise EnvironmentProblem(f"{found.digest}: pulled, yet the daemon has no image of that digest")
    return img.id


def read_registry(ref: str) -> Subject | None:
    """The config of REF from its registry (the manifest, the linux/amd64 manifest of an index, then the config
    blob; builder/registry_api.py): no layer is fetched, nothing is pulled. None when the registry has no such
    image; a registry that answers but cannot be read is EnvironmentProblem (exit 3) in one line naming the cause
    (credentials refused, a timeout, HTTP 5xx, a digest mismatch, too large, not JSON, the wrong shape: what
    registry_api.Unusable says); a docker login that cannot be read is an error of its own."""
    from .. import registry_api

    parsed = ImageRef.parse(ref)
    where = registry_api.endpoint(parsed.api_host)  # a docker config that does not read: its own error, not "no image"
    try:
        with registry_api.Client(where) as client:
            found = client.image(f"{parsed.api_host}/{parsed.api_repository}", parsed.reference, platform="linux/amd64")
        if found is None:
            return None
        try:
            config = config_from_json(ref, found.config)
        except UserError as exc:  # the registry served it: its answer, not the user's input
            raise registry_api.Unusable(str(exc), "shape") from None
    except registry_api.Unusable as exc:
        cause = registry_api.CAUSES.get(exc.cause, exc.cause)
        raise EnvironmentProblem(f"{ref}: not a local image, and its registry {parsed.host} could not be read: {cause} "
                                 f"({registry_api.first_line(exc)})") from None
    return Subject(ref, REGISTRY, config, str(parsed.with_digest(found.digest)))


# -- what smoke and bench are given ----------------------------------------------------------------------------
def find_cell(m, sel, target: str, what: str = "smoke TARGET"):
    """(cell, None) for a cell id of the matrix (any profile), (None, target) for an image reference."""
    from .. import matrix as matrix_mod
    from .. import resolve

    cells = resolve.select(m, sel)
    by_id = {c.id: c for c in cells}
    if target in by_id:
        return by_id[target], None
    if not sel.profiles:  # the target may be a cell of another profile
        try:
            every = resolve.select(m, matrix_mod.Selection(**{**sel.__dict__, "profiles": ("all",)}))
            by_id.update({c.id: c for c in every})
        except UserError:
            pass
        if target in by_id:
            return by_id[target], None
    if looks_like_image(target):  # an image reference (checked before docker is asked about it)
        grammar.check(grammar.image_ref, target, what)
        return None, target
    raise UserError(f"{target}: neither a cell of {m.path} nor an image reference; cells: {', '.join(sorted(by_id)) or 'none'}")


def looks_like_image(target: str) -> bool:
    return ":" in target or "/" in target


def target(value: str, matrix, sel, launcher: str, matrix_path: str, what: str = "smoke TARGET"):
    """smoke's and bench's TARGET, before any docker call → (cell, image): a cell id of the matrix (cell, None),
    or an image reference (None, image). The process launcher runs a cell."""
    if matrix is not None:
        cell, image = find_cell(matrix, sel, value, what)
    elif looks_like_image(value):
        grammar.check(grammar.image_ref, value, what)
        cell, image = None, value
    else:
        raise UserError(f"{value}: not an image reference, and a cell id needs a matrix ({matrix_path}: no such "
                        "matrix file; use --matrix PATH)")
    if launcher == "process" and image is not None:
        raise UserError(f"--launcher process runs a cell's engine installed on this host; {value} is an image: "
                        "name the cell id instead")
    return cell, image


def open_for(cell, image: str | None, launcher: str, matrix=None, sel=None):
    """smoke's and bench's `target` opened for its launcher → (cell, image, subject, docker client): with the
    docker launcher the image read (daemon, else registry) through one client; (cell, image, None, None) for the
    process launcher."""
    if launcher != "docker":
        return cell, image, None, None
    from .runtime import engine

    client = engine.docker_client()  # exit 3 when the daemon does not answer
    cell, image, found = open_target(cell, image, client, matrix, sel)
    return cell, image, found, client


def open_target(cell, image: str | None, client, matrix=None, sel=None):
    """(cell, image, subject) of a target: the image (the cell's own when a cell id was given) read from the
    daemon, else from its registry (not pulled), and the cell its labels name when only the image was given
    (the matrix's when one is given, else made from the labels and the engine data)."""
    image = image or cell.ref
    found = read_local(image, client) or read_registry(image)
    if found is None:
        raise UserError(f"{image}: no such local image, and its registry does not have it (build it with "
                        "`builder build`, or push it)")
    if cell is None:
        cell = found.plan(matrix.knowledge if matrix is not None else None, matrix, sel)
    return cell, image, found
