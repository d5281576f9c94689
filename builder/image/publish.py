"""publish: push runtime images by digest, then move the aliases, then record what was published.

The publish step (builder/steps/publish.py) pushes each cell's OCI archive — the very image its smoke ran, byte
for byte — to REGISTRY/ENGINE:<full tag> with `skopeo copy --preserve-digests`, and checks that the registry
serves it under the digest the build made. Only when every cell of the run is pushed and checked does
`finish` move the aliases (ENGINE:VERSION, ENGINE:latest-cuXYZ): so a failure anywhere leaves every alias where
it was, and no alias ever names a digest that is not in the registry. Then images.json records each published
cell (tag, digest, wheel keys, smoke results) and the `docker pull REPO@sha256:…` lines are printed.

Credentials: BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD, else the docker login of the registry host
(config.json `auths`, `credHelpers`, `credsStore`). They reach skopeo through an in-memory auth file
(builder/docker.py), never a command line, a log, a file on disk, an image or images.json.
Transient registry errors (refused or reset connections, timeouts, 429, 5xx) are retried with exponential
backoff; anything else (401, a digest the registry would change) fails at once.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from .. import docker, redact
from ..errors import CommandError, EnvironmentProblem, UserError
from ..imageref import ImageRef
from ..registry_api import Client, RegistryPath, Unusable

IMAGES_FORMAT = 1
TRANSIENT = re.compile(
    r"connection refused|connection reset|broken pipe|i/o timeout|handshake timeout|timed out|timeout exceeded|"
    r"unexpected EOF|: EOF\b|too many requests|\b429\b|\b50[0234]\b|bad gateway|service unavailable|"
    r"gateway timeout|internal server error|temporary failure|no route to host|server misbehaving",
    re.IGNORECASE)
NOT_TRANSIENT = re.compile(r"unauthorized|authentication required|denied|manifest invalid|name unknown|"
                           r"preserve.digests|cannot preserve|no such host", re.IGNORECASE)


class PublishError(Exception):
    """A push or alias move that failed (after its retries): fails the cell, or stops the aliases."""


@dataclass(frozen=True)
class Target:
    """Where and how `builder publish` pushes: the registry path (its endpoint carries the credentials given for its
    host, which never appear in repr, logs or files) and publish's own settings."""

    where: RegistryPath  # images go to PATH/ENGINE:TAG
    images_json: Path
    attempts: int = 5
    backoff: float = 2.0  # seconds before the first retry; doubled each time, at most MAX_BACKOFF
    aliases: bool = True
    # the image's SBOM and SLSA provenance attached as referrers before its tag is pushed (builder/image/attest.py);
    # --no-attestations: none
    attestations: bool = True
    cyclonedx: bool = False  # --sbom-format cyclonedx: the SBOM in CycloneDX 1.5 too (the `sbom` extra)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    @property
    def registry(self) -> str:
        return self.where.path

    @property
    def host(self) -> str:
        return self.where.host

    @property
    def tls_verify(self) -> bool:
        return self.where.tls_verify

    @property
    def credentials(self) -> tuple[str, str] | None:
        return self.where.credentials

    @property
    def credentials_from(self) -> str:
        return self.where.credentials_from

    def repository(self, engine: str) -> str:
        return self.where.repository(engine)

    def auth(self) -> dict[str, tuple[str, str]] | None:
        return {self.host: self.credentials} if self.credentials else None


MAX_BACKOFF = 60.0


def make_target(registry: str, images_json: Path, attempts: int = 5, backoff: float = 2.0,
                aliases: bool = True, attestations: bool = True, cyclonedx: bool = False) -> Target:
    """A Target for REGISTRY (HOST[:PORT]/PATH, registry_api.RegistryPath), with the credentials the environment
    or docker login has for its host. Plain HTTP only for a loopback registry."""
    where = RegistryPath.parse(registry, "--registry")
    if not 1 <= attempts <= 100:
        raise UserError(f"--retries: from 0 to 99, got {attempts - 1}")
    return Target(where=where, images_json=images_json, attempts=attempts, backoff=backoff, aliases=aliases,
                  attestations=attestations, cyclonedx=cyclonedx)


def transient(output: str) -> bool:
    return bool(TRANSIENT.search(output)) and not NOT_TRANSIENT.search(output)


def _first_error(output: str) -> str:
    lines = [l.strip() for l in output.strip().splitlines() if l.strip()]
    fatal = [l for l in lines if "fatal" in l.lower() or "error" in l.lower()]
    text = (fatal or lines or ["no output"])[-1]
    m = re.search(r'msg="(.*)"', text)
    return (m.group(1) if m else text)[:300]


def retrying(what: str, fn: Callable[[], object], target: Target, say: Callable[[str], None]):
    """fn() with up to target.attempts tries on transient registry errors; PublishError when it gives up."""
    for attempt in range(1, target.attempts + 1):
        try:
            return fn()
        except (CommandError, Unusable) as exc:
            output = exc.output if isinstance(exc, CommandError) else str(exc)
            why = _first_error(output)
            if not transient(output):
                raise PublishError(f"{what}: {why}") from None
            if attempt == target.attempts:
                raise PublishError(f"{what}: {why} (gave up after {attempt} attempts)") from None
            delay = min(target.backoff * 2 ** (attempt - 1), MAX_BACKOFF)
            say(f"{what}: transient registry error ({why}); attempt {attempt + 1} of {target.attempts} in {delay:g}s")
            target.sleep(delay)
    raise AssertionError("unreachable")


def _bounded(args: list[str], size: int = 0, requests: int = 1) -> list[str]:
    """skopeo ARGS under builder's bound for a program talking to a remote (net.subprocess_seconds): skopeo's
    own --command-timeout, and the same (plus a little) for the process."""
    from .. import net

    return [args[0], "--command-timeout", f"{net.subprocess_seconds(size, requests):.0f}s", *args[1:]]


def _seconds(args: list[str]) -> float:
    return float(args[args.index("--command-timeout") + 1].removesuffix("s")) + 30


def served_digest(ref: str, target: Target, say: Callable[[str], None]) -> str:
    """The digest the registry serves for REF (a tag or @digest): the sha256 of its manifest's exact bytes, read
    through the registry API client (skopeo only copies bytes); "" when the registry has no such manifest."""
    parsed = ImageRef.parse(ref)

    def read() -> str:
        with Client(target.where) as client:
            return client.digest(parsed.name, parsed.reference) or ""

    return retrying(f"inspect {ref}", read, target, say)


def push_archive(archive: Path, repository: str, tag: str, digest: str, all_images: bool, target: Target,
                 say: Callable[[str], None], log=None) -> str:
    """Copy an OCI archive to REPOSITORY:TAG keeping its digest; check the registry serves that digest under
    the tag and by digest. Returns the digest."""
    dest = f"{repository}:{tag}"
    with tempfile.TemporaryDirectory(prefix="builder-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        args = _bounded(docker.skopeo_copy_args(f"oci-archive:{archive}", f"docker://{dest}",
                                                dest_tls_verify=target.tls_verify, all_images=all_images,
                                                digestfile=digestfile), size=archive.stat().st_size, requests=20)
        if log is not None:
            log.write(f"$ skopeo {' '.join(args)}\n")
            log.flush()
        retrying(f"push {dest}", lambda: docker.skopeo(args, credentials=target.auth(), timeout=_seconds(args)),
                 target, say)
        pushed = digestfile.read_text().strip() if digestfile.exists() else ""
    if pushed and pushed != digest:
        raise PublishError(f"push {dest}: the registry stored {pushed}, not the built {digest}")
    for ref in (f"{repository}@{digest}", dest):
        served = served_digest(ref, target, say)
        if served != digest:
            raise PublishError(f"after the push {ref} serves {served}, not the built {digest}")
    return digest


def move_alias(repository: str, alias: str, digest: str, all_images: bool, target: Target,
               say: Callable[[str], None]) -> None:
    """Point REPOSITORY:ALIAS at DIGEST — only after checking the registry serves DIGEST — and check it does."""
    source = f"{repository}@{digest}"
    if served_digest(source, target, say) != digest:
        raise PublishError(f"alias {alias}: {source} is not in the registry; the alias stays where it was")
    args = _bounded(docker.skopeo_copy_args(f"docker://{source}", f"docker://{repository}:{alias}",
                                            src_tls_verify=target.tls_verify, dest_tls_verify=target.tls_verify,
                                            all_images=all_images), requests=20)
    retrying(f"alias {repository}:{alias}", lambda: docker.skopeo(args, credentials=target.auth(), timeout=_seconds(args)),
             target, say)
    served = served_digest(f"{repository}:{alias}", target, say)
    if served != digest:
        raise PublishError(f"alias {repository}:{alias} serves {served} after the move, not {digest}")


# -- aliases -----------------------------------------------------------------------------------------------
def _version(v: str):
    try:
        return (1, Version(v))
    except InvalidVersion:
        return (0, v)


def standard(cell, m) -> bool:
    """A cell built with its profile's own archs (not an --arch variant): only those carry aliases."""
    archs = cell.profile.archs or tuple(m.defaults["archs"])
    return tuple(sorted(cell.archs)) == tuple(sorted(archs))


def alias_claims(cells: list, m, every: list | None = None) -> dict[str, list[str]]:
    """cell id → the aliases it moves: VERSION for the standard cell of an engine version (the default profile
    first, then matrix order), latest-cuXYZ for the standard cell of the newest version of an engine with that
    CUDA in the whole matrix (`every`: all its cells). A cell that is not the chosen one claims nothing."""
    order = list(m.profiles)
    default = m.defaults.get("profile")

    def rank(c):
        return (c.profile.name != default, order.index(c.profile.name) if c.profile.name in order else len(order))

    pool = [c for c in (every if every is not None else cells) if standard(c, m)]
    pool += [c for c in cells if standard(c, m) and c.id not in {p.id for p in pool}]
    chosen: dict[str, str] = {}
    by_version: dict[tuple[str, str], list] = {}
    by_cuda: dict[tuple[str, str], list] = {}
    for c in pool:
        by_version.setdefault((c.engine, c.version), []).append(c)
        by_cuda.setdefault((c.engine, c.profile.cuda_tag), []).append(c)
    for (engine, version), group in by_version.items():
        chosen[f"{engine}:{version}"] = min(group, key=rank).id
    for (engine, cuda_tag), group in by_cuda.items():
        newest = max(_version(c.version) for c in group)
        best = min((c for c in group if _version(c.version) == newest), key=rank)
        chosen[f"{engine}:latest-{cuda_tag}"] = best.id
    claims: dict[str, list[str]] = {c.id: [] for c in cells}
    for name, cell_id in sorted(chosen.items()):
        if cell_id in claims:
            claims[cell_id].append(name.split(":", 1)[1])
    return claims


# -- images.json -------------------------------------------------------------------------------------------
def load_images(path: Path) -> dict:
    if not path.exists():
        return {"format": IMAGES_FORMAT, "images": {}, "aliases": {}, "warm": {}}
    try:
        data = json.loads(path.read_text())
    except RecursionError:
        raise UserError(f"{path}: not a readable images.json (nested too deeply); move it away or fix it") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable images.json ({exc}); move it away or fix it") from None
    if not isinstance(data, dict) or data.get("format") != IMAGES_FORMAT:
        raise UserError(f"{path}: not an images.json of format {IMAGES_FORMAT}")
    for part in ("images", "aliases", "warm"):  # warm: REPO:TAG of each warm image `builder warm --push` pushed
        if not isinstance(data.get(part, {}), dict):
            raise UserError(f"{path}: its {part!r} is not a table; move it away or fix it")
        data.setdefault(part, {})
    return data


def write_images(path: Path, data: dict) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".images-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_warm(path: Path, ref: str, entry: dict) -> None:
    """List the warm image REF (REPO:TAG, pushed by `builder warm --push`) in images.json's `warm` table: the file
    read, that one entry set, written again (the cells and aliases publish wrote kept as they are)."""
    data = load_images(path)
    data["warm"][ref] = entry
    write_images(path, data)


def image_entry(outcome, plan, pushed: dict, aliases: list[str], epoch: str | None) -> dict:
    cell = outcome.cell
    plan = getattr(outcome, "plan", None) or plan  # the routes build chose for `source = "auto"` packages
    routes = {r.subject: r.artifacts for r in outcome.results if r.step == "route" and r.passed}
    wheels = {}
    for r in outcome.results:
        if r.step == "compile" and r.passed:
            pkg = next(p for p in cell.packages if p.name == r.subject)
            wheels[r.subject] = {"version": pkg.version, "key": plan.keys.get(r.subject, ""),
                                 "files": r.artifacts.get("wheels", []), "reused": bool(r.artifacts.get("reused"))}
            if r.subject in routes:
                wheels[r.subject]["route"] = routes[r.subject]
    image = next((r.artifacts for r in outcome.results if r.step == "image" and r.passed), {})
    return {
        "cell": cell.id,
        "image": f"{pushed['repository']}:{cell.tag}",
        "repository": pushed["repository"],
        "tag": cell.tag,
        "digest": pushed["digest"],
        "manifest": image.get("manifest", pushed["digest"]),
        "attestations": image.get("attestations", []),
        # the SBOM and provenance publish attached (builder/image/attest.py): what `builder verify` reads
        "referrers": pushed.get("referrers", []),
        "pull": f"docker pull {pushed['repository']}@{pushed['digest']}",
        "aliases": aliases,
        "engine": cell.engine,
        "version": cell.version,
        "cuda": cell.cuda,
        "torch": cell.torch,
        "python": cell.python,
        "archs": list(cell.archs),
        "source_date_epoch": epoch,
        "wheels": wheels,
        "smoke": [r.to_json() for r in outcome.results if r.step == "smoke"],
    }


@dataclass
class Summary:
    published: list[str]  # cell ids pushed
    failed: list[str]  # cell ids not pushed, with their reason
    aliases: dict[str, str]  # REPO:ALIAS → digest, moved
    aliases_held: str  # why the aliases did not move ("" when they did, or none were due)
    pulls: list[str]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.aliases_held


def finish(outcomes, plans, target: Target, claims: dict[str, list[str]], say: Callable[[str], None],
           epoch: str | None = None) -> Summary:
    """After every cell ran: move the aliases only if every cell was pushed, then write images.json (the cells
    that were pushed, the aliases that moved) and say the pull lines."""
    by_id = {p.cell.id: p for p in plans}
    pushed: dict[str, dict] = {}
    failed: list[str] = []
    for o in outcomes:
        r = next((r for r in o.results if r.step == "publish"), None)
        if r is not None and r.passed:
            pushed[o.cell.id] = r.artifacts
        else:
            why = r.reason if r is not None else (o.error or "did not reach publish")
            failed.append(f"{o.cell.id}: {why.splitlines()[0] if why else 'not published'}")
    for p in plans[len(outcomes):]:
        failed.append(f"{p.cell.id}: not run")
    moved: dict[str, str] = {}
    held = ""
    due = {cid: names for cid, names in claims.items() if names and cid in by_id} if target.aliases else {}
    if due and failed:
        held = (f"aliases not moved ({', '.join(f'{n}' for names in due.values() for n in names)}): "
                f"{len(failed)} cell(s) were not published, and an alias moves only when the whole run is in the registry")
        say(held)
    elif due:
        for o in outcomes:
            for name in due.get(o.cell.id, []):
                art = pushed[o.cell.id]
                try:
                    move_alias(art["repository"], name, art["digest"], bool(art.get("index")), target, say)
                except PublishError as exc:
                    held = f"alias {art['repository']}:{name} not moved: {exc}"
                    say(held)
                    break
                moved[f"{art['repository']}:{name}"] = art["digest"]
                say(f"alias {art['repository']}:{name} → {art['digest']}")
            if held:
                break
    data = load_images(target.images_json)
    for o in outcomes:
        if o.cell.id in pushed:
            repo = pushed[o.cell.id]["repository"]
            names = [n for n in claims.get(o.cell.id, []) if f"{repo}:{n}" in moved]
            data["images"][o.cell.id] = image_entry(o, by_id[o.cell.id], pushed[o.cell.id], names, epoch)
            held_names = [n for n in (due.get(o.cell.id) or []) if n not in names]
            if held_names:  # what each alias still names (the digest an earlier run moved it to; null: never moved)
                data["images"][o.cell.id]["aliases_not_moved"] = {
                    f"{repo}:{n}": (data["aliases"].get(f"{repo}:{n}") or {}).get("digest") for n in held_names}
    for ref, digest in moved.items():
        data["aliases"][ref] = {"digest": digest, "cell": next(c for c, a in pushed.items() if ref.startswith(a["repository"] + ":") and a["digest"] == digest)}
    if pushed:
        write_images(target.images_json, data)
        say(f"wrote {target.images_json}")
    pulls = [f"docker pull {a['repository']}@{a['digest']}" for a in pushed.values()]
    return Summary(published=list(pushed), failed=failed, aliases=moved, aliases_held=held, pulls=pulls)


def check_images_json(path: Path) -> None:
    """Before anything is built: images.json can be read (or is absent) and its directory written."""
    from .. import files

    if path.is_dir():
        raise UserError(f"--images-json: {path} is a directory")
    files.writable_dir(path.parent, "--images-json")
    load_images(path)


def check_registry(target: Target, say: Callable[[str], None] = lambda s: None) -> None:
    """The registry answers GET /v2/ like a registry (exit 3 before anything is built, not after), and lets the
    credentials in when it asks for some. A transient failure (refused or reset, a timeout, 429, 5xx) is
    retried like every registry operation (--retries, backoff from 2 s): a registry still coming up is waited for."""
    import requests

    from .. import net
    from ..net import NETWORK_ERRORS, with_timeouts

    scheme = "https" if target.tls_verify else "http"
    url = f"{scheme}://{target.host}/v2/"
    for attempt in range(1, target.attempts + 1):
        session = net.without_netrc(with_timeouts(requests.Session()))
        why = ""
        try:  # anonymously first: the credentials go only to a registry that asks for them (a Basic challenge)
            resp = session.get(url, stream=True)
            body = net.read_document(resp, f"the registry {target.host}: GET /v2/", limit=1 << 20)
            basic = resp.headers.get("WWW-Authenticate", "").lower().startswith("basic")
            if resp.status_code == 401 and basic and target.credentials:
                resp = session.get(url, auth=target.credentials, stream=True)
                body = net.read_document(resp, f"the registry {target.host}: GET /v2/", limit=1 << 20)
            if resp.status_code >= 500 or resp.status_code == 429:
                why = f"HTTP {resp.status_code}"
        except (*NETWORK_ERRORS, net.TooSlow) as exc:  # TooSlow: past its one deadline (a hang, a drip)
            text = redact.redact(str(exc))
            why = "connection refused" if "Connection refused" in text else \
                (text.splitlines()[0][:200] if text else type(exc).__name__)
        finally:
            session.close()
        if not why:
            break
        if attempt == target.attempts:
            raise EnvironmentProblem(f"the registry {target.host} does not answer GET /v2/ ({why}, {attempt} "
                                     "attempts): start it or fix --registry / defaults.registry; nothing was built")
        delay = min(target.backoff * 2 ** (attempt - 1), MAX_BACKOFF)
        say(f"GET /v2/ on {target.host}: transient registry error ({why}); attempt {attempt + 1} of "
            f"{target.attempts} in {delay:g}s")
        target.sleep(delay)
    if resp.status_code not in (200, 401) or not net.speaks_registry_api(resp.headers, body):
        raise EnvironmentProblem(f"{target.host} answers GET /v2/ with HTTP {resp.status_code} and no registry API: "
                                 "is --registry an OCI registry? nothing was built")
    challenge = resp.headers.get("WWW-Authenticate", "")
    if resp.status_code == 401 and challenge.lower().startswith("bearer") and target.credentials:
        from ..registry_api import realm_trusted

        realm = realm_trusted(challenge, target.host)
        if realm:  # skopeo would send the credentials there with its token request
            raise EnvironmentProblem(
                f"the registry {target.host} sends its token requests to {realm}, another host over plain http: "
                f"builder does not hand it the credentials from {target.credentials_from}; nothing was built")
    if resp.status_code == 401 and not challenge.lower().startswith("bearer"):
        # a Basic registry that refuses what we sent (a token registry answers 401 until skopeo gets a token)
        raise EnvironmentProblem(
            f"the registry {target.host} refuses "
            + (f"the credentials from {target.credentials_from}" if target.credentials else "anonymous pushes")
            + " (HTTP 401): docker login, or set BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD; nothing was built")


def check_tools() -> None:
    """skopeo is installed (exit 3 before anything is built, not after)."""
    code, _, err = docker.probe(["skopeo", "--version"], timeout=30)
    if code != 0:
        raise EnvironmentProblem(f"skopeo is not usable ({err.strip() or code}): publishing copies OCI archives "
                                 "with it\nfix: apt-get install skopeo (scripts/setup-docker.sh installs it)")
