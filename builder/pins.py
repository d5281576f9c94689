"""Runtime pins: the exact dependency set of a cell's runtime, resolved before anything is installed.

A cell without a pins file has its runtime dependencies resolved first (steps/image.py: the Dockerfile's
runtime-resolve stage, pip's `inspect` of the venv the install starts from and its `install --dry-run --report`
of the install's request): every distribution the runtime will hold but the cell's own wheels, torch included,
each with the sha256 of every file the index has for that release (`--hash=sha256:...`; the index's answer, else
the file pip's report names) and with the extras the resolved closure asks of it (`nvidia-cutlass-dsl[cu13]==4.8.0`:
vLLM 0.33.0's nvidia-cudnn-frontend requires `nvidia-cutlass-dsl[cu13]`, and pip's --require-hashes refuses a
requirement with an extra that the file does not pin). The extras are read from the distributions' own
Requires-Dist, markers evaluated in the venv's environment, from the extras the runtime asks for (the engine's
install_extras, runtime_jit's pip requirements) to a fixpoint. The image, the first build's as every later one's,
installs from the hash-locked requirements file those lines make with the cell's own audited wheels and their
hashes (`pip install --require-hashes`): the same files, byte for byte, or the build stops — so the first build and
every later build of an unchanged cell have one content key and one digest. After the first build the image's own
installed set is checked against the pins (`complete`), then they are written to runtime-pins/<cell-id>.txt next to
the matrix (commit it, like a lock file). A pins file without hashes (written by hand, or for a release the index
does not list) is used as constraints instead. Delete the file (or `build --refresh-pins`) to resolve again.

The file's second header line names the image it was first installed into and that image's content key.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import docker, redact
from .errors import BuilderError, UserError
from .resolve import Cell

DIR_NAME = "runtime-pins"
BUILD_REPORT = ".build-requirements.json"  # pip's --report of the build requirements, exported next to the wheel
BUILD_PINS_IN_CONTEXT = "build-pins"  # the build context's folder of build pins, <package>.txt (dockerfiles/macros.j2)
FILE_IN_CONTEXT = "runtime-pins.txt"  # a pins file of versions only: constraints
HASHED_IN_CONTEXT = "runtime-requirements.txt"  # (its name is also in dockerfiles/stages/runtime.j2)


def own_names(cell: Cell) -> set[str]:
    """The distributions the cell installs from its own audited wheels: never pinned from the index."""
    return {canonicalize_name(p.recipe.pypi) for p in cell.packages} | {canonicalize_name(p.name) for p in cell.packages}


# Run in the image: every installed distribution's name, version and Requires-Dist, and the marker environment
INSTALLED_SCRIPT = r"""
import json, os, platform, sys
from importlib import metadata
impl = sys.implementation
iv = "%d.%d.%d" % impl.version[:3] + ("" if impl.version.releaselevel == "final" else impl.version.releaselevel[0] + str(impl.version.serial))
env = {"implementation_name": impl.name, "implementation_version": iv, "os_name": os.name,
       "platform_machine": platform.machine(), "platform_release": platform.release(), "platform_system": platform.system(),
       "platform_version": platform.version(), "python_full_version": platform.python_version(),
       "platform_python_implementation": platform.python_implementation(), "python_version": ".".join(platform.python_version_tuple()[:2]),
       "sys_platform": sys.platform}
dists = [{"name": d.metadata["Name"], "version": d.version, "requires": list(d.requires or [])} for d in metadata.distributions()]
print(json.dumps({"env": env, "dists": dists}))
"""


def requested_extras(installed: dict, seeds: dict[str, set[str]]) -> dict[str, set[str]]:
    """{distribution: the extras some installed distribution (or the runtime's own install line, `seeds`) asks of
    it}, followed to a fixpoint: an extra that is asked turns on the requirements its marker names."""
    env = installed["env"]
    requires = {canonicalize_name(d["name"]): d["requires"] for d in installed["dists"]}
    active: dict[str, set[str]] = {canonicalize_name(k): set(v) for k, v in seeds.items()}
    todo = list(requires)
    while todo:
        name = todo.pop()
        for line in requires.get(name, ()):
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if not req.extras:
                continue
            if req.marker is not None:
                try:
                    on = any(req.marker.evaluate({**env, "extra": e}) for e in ("", *sorted(active.get(name, ()))))
                except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                    on = True  # a marker this packaging cannot read: keep the extra, pip decides
                if not on:
                    continue
            target = canonicalize_name(req.name)
            new = set(req.extras) - active.get(target, set())
            if new:
                active.setdefault(target, set()).update(new)
                todo.append(target)  # its own extra-gated requirements may turn on now
    return {k: v for k, v in active.items() if v}


def with_extras(lines: list[str], extras: dict[str, set[str]]) -> list[str]:
    out = []
    for line in lines:
        name, _, version = line.partition("==")
        asked = extras.get(canonicalize_name(name))
        out.append(f"{name}[{','.join(sorted(asked))}]=={version}" if asked else line)
    return out


def constraints(text: str) -> str:
    """A pins file as pip constraints: no hashes are needed there, and extras are not allowed."""
    return "".join(re.sub(r"\[[^\]]*\]", "", line) + "\n" for line in text.splitlines())


# One pin line as builder writes it: name[extras]==version, then --hash=sha256:<hex> for each file of the release.
_PIN = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                  r"==([A-Za-z0-9.+!_-]+)((?:[ \t]+--hash=sha256:\S*)*)", re.ASCII)
_FIX = "delete it, or build with --refresh-pins, to resolve again"


def read(path: Path, need_hashes: bool = False) -> tuple[str, bool]:
    """(the text of a pins file, whether it is hash-locked), every line checked first: a pins file holds
    name==version pins, each with its --hash=sha256 in a hash-locked file, and nothing else. A pip option
    (--index-url, -r, -e, --trusted-host, an inline --install-option) would reach pip; a file cut short would
    install less than it says: both are refused (UserError, naming the line), as is a file whose header
    announces hashes its lines lack. `need_hashes`: build pins, which are hash-locked or nothing."""
    from . import files

    text = files.read_text(path, "pins file")
    if text and not text.endswith("\n"):
        raise UserError(f"{path}: ends in the middle of a line: cut short? ({_FIX})")
    header = " ".join(l for l in text.splitlines() if l.lstrip().startswith("#"))
    lines = [(n, l.strip()) for n, l in enumerate(text.splitlines(), 1) if l.strip() and not l.lstrip().startswith("#")]
    if not lines:
        # builder writes a file without pins for an image whose packages are all its own wheels: its header then
        # records the sha256 of no pin lines; any other empty file was cut short
        if (m := _ORIGIN.search(text)) and m[3] == lines_digest(""):
            return text, False
        raise UserError(f"{path}: holds no pin ({_FIX})")
    locked = []
    for n, line in lines:
        where = f"{path}: line {n}: {redact.describe(line)}"
        m = _PIN.fullmatch(line)
        if line.startswith("-") or (m is None and re.search(r"(^|\s)-", line)):
            raise UserError(f"{where} carries a pip option; a pins file holds name==version pins only ({_FIX})")
        if m is None:
            raise UserError(f"{where} is not a pin like name==1.0 (with --hash=sha256:<64 hex> when hash-locked) ({_FIX})")
        try:
            Version(m[3])
        except InvalidVersion:
            raise UserError(f"{where}: {m[3]!r} is not a version ({_FIX})") from None
        digests = re.findall(r"--hash=sha256:(\S*)", m[4])
        bad = [d for d in digests if not re.fullmatch(r"[0-9a-f]{64}", d)]
        if bad:
            raise UserError(f"{where}: {redact.describe(bad[0])} is not a sha256 (64 lowercase hex digits): cut short? "
                            f"({_FIX})")
        locked.append(bool(digests))
    says_locked = "hash-locked" in header
    if (any(locked) or says_locked or need_hashes) and not all(locked):
        n = lines[locked.index(False)][0]
        why = ("the file announces hash-locked pins" if says_locked else "build pins are hash-locked" if need_hashes
               else "the other lines carry hashes")
        raise UserError(f"{path}: line {n} carries no --hash=sha256, and {why}: cut short or edited? ({_FIX})")
    return text, all(locked)


def hashed(text: str) -> bool:
    return "--hash=sha256:" in text


def with_hashes(lines: list[str], index) -> tuple[list[str], str]:
    """Each `name==version` with `--hash=sha256:...` for every file the index lists for that release (any of
    them may be the one pip picks), or ([], why) when one release is not on the index."""
    out = []
    for line in lines:
        name, _, version = line.partition("==")
        name = name.partition("[")[0]
        try:
            digests = sorted({f.sha256 for f in index.release_files(name, version) if f.sha256})
        except UserError as exc:
            return [], str(exc)
        if not digests:
            return [], f"{name} {version}: the index lists no sha256"
        out.append(line + "".join(f" --hash=sha256:{d}" for d in digests))
    return out, ""


def requirements(pins_text: str, wheels: list[tuple[str, str]]) -> str:
    """The hash-locked requirements file the runtime stage installs: the pinned releases and the cell's own
    wheels (file in the build context, sha256)."""
    lines = [l for l in pins_text.splitlines() if l.strip() and not l.startswith("#")]
    return "".join(f"{l}\n" for l in lines) + "".join(f"/wheels/{name} --hash=sha256:{sha}\n" for name, sha in wheels)


def pin_lines(text: str) -> list[str]:
    return [l.strip() for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]


def lines_digest(text: str) -> str:
    """The sha256 of a pins file's pin lines (comments and blank lines left out)."""
    return hashlib.sha256("".join(f"{l}\n" for l in pin_lines(text)).encode()).hexdigest()


_ORIGIN = re.compile(r"^# read from image (sha256:[0-9a-f]{64}) \(content key ([0-9a-f]{64})\); "
                     r"pin lines sha256:([0-9a-f]{64})$", re.M)


def origin_line(digest: str, key: str, lines_sha: str) -> str:
    return f"# read from image {digest} (content key {key}); pin lines sha256:{lines_sha}\n"


def origin(text: str) -> tuple[str, str] | None:
    """(image digest, its content key) the pins were read from, when the header says so and no pin line changed
    since; None otherwise."""
    m = _ORIGIN.search(text)
    if m is None or m.group(3) != lines_digest(text):
        return None
    return m.group(1), m.group(2)


def complete(lines: list[str], installed: dict, cell: Cell, image: str) -> None:
    """The pins hold every installed distribution but the cell's own wheels, each at its installed version, and
    nothing else: the image was installed from exactly them. Checked against the image's own installed set
    (importlib.metadata); BuilderError naming what differs (the pins file is then not written)."""
    pinned = {canonicalize_name(l.partition("==")[0].partition("[")[0]): l.partition("==")[2].split()[0]
              for l in lines}
    have = {canonicalize_name(d["name"]): d["version"] for d in installed["dists"] if d.get("name")}
    own = own_names(cell)
    missing = sorted(f"{n}=={v}" for n, v in have.items() if n not in own and pinned.get(n) != v)
    extra = sorted(f"{n}=={v}" for n, v in pinned.items() if have.get(n) != v)
    if missing or extra:
        raise BuilderError(f"{image} does not hold what its runtime pins name: "
                           + "; ".join(filter(None, [missing and f"installed but not pinned: {', '.join(missing)}",
                                                     extra and f"pinned but not installed: {', '.join(extra)}"]))
                           + " (no pins file written)")


def seeds(cell: Cell) -> dict[str, set[str]]:
    """The extras the runtime's own install line asks for: the engine's install_extras, runtime_jit's pip lines."""
    out: dict[str, set[str]] = {}
    if cell.engine_recipe.install_extras:
        out[cell.engine_recipe.pypi] = set(cell.engine_recipe.install_extras)
    for line in (cell.runtime_jit or {}).get("pip", ()):
        req = Requirement(line)
        if req.extras:
            out.setdefault(req.name, set()).update(req.extras)
    return out


def from_resolve(report: dict, venv: dict, cell: Cell, index_url: str | None = None) -> tuple[list[str], str]:
    """The pin lines of a resolve (the runtime-resolve stage's files): `venv`, pip's `inspect` of the venv the
    install starts from, and `report`, pip's --dry-run --report of the install's request (what it would add or
    replace). Every distribution the runtime will hold but the cell's own wheels, each `name[extras]==version`, with
    `--hash=sha256:...` for every file the index lists for the release (any of them may be the one pip picks on
    another host), else for the file the report names; returns (lines, why) where why says, when the lines carry no
    hashes, why not (they are then constraints). BuilderError when the resolve's files are not what pip writes."""
    try:
        env = report["environment"]
        held = {canonicalize_name(d["metadata"]["name"]): d for d in venv["installed"]}
        held.update({canonicalize_name(d["metadata"]["name"]): d for d in report["install"]})
    except (KeyError, TypeError) as exc:
        raise BuilderError(f"the runtime's resolve wrote no pip report / inspect this builder reads ({exc!r})") from None
    installed = {"env": env, "dists": [{"name": d["metadata"]["name"], "version": d["metadata"]["version"],
                                        "requires": list(d["metadata"].get("requires_dist") or [])}
                                       for d in held.values()]}
    own = own_names(cell)
    everything = sorted(f"{n}=={d['metadata']['version']}" for n, d in held.items() if n not in own)
    names = [line.partition("==")[0] for line in everything]  # canonical already: the keys of `held`
    lines = with_extras(everything, requested_extras(installed, seeds(cell)))
    why = "no index to read hashes from"
    if index_url:
        from .pypi import SimpleIndex

        locked, why = with_hashes(lines, SimpleIndex(index_url))
        if locked:
            return locked, ""
    # the index cannot say: the very file of each release that pip took here, when its report names them all
    taken = [(((held[n].get("download_info") or {}).get("archive_info") or {}).get("hashes") or {}).get("sha256")
             for n in names]
    if all(taken):
        return [f"{line} --hash=sha256:{sha}" for line, sha in zip(lines, taken)], ""
    return lines, why


def text_of(cell: Cell, lines: list[str], why: str, source: tuple[str, str] | None = None) -> str:
    """The pins file of `lines` (`why`: why they carry no hashes; `source`: the image digest and content key they
    were first installed as, named in the header)."""
    header = (f"# Written by `builder build` from the resolve of {cell.id}'s first build; "
              + ("hash-locked requirements for every build.\n" if hashed("".join(lines)) else
                 "nothing to pin: every distribution is the cell's own wheels.\n" if not lines else
                 f"constraints for every build (no hashes: {why}).\n"))
    body = "".join(f"{line}\n" for line in lines)
    if source is not None:
        header += origin_line(*source, lines_digest(body))
    return header + body


def in_context(text: str, locked: bool, wheels: list[tuple[str, str]]) -> tuple[str, str]:
    """(file name, content) of the pins in the runtime build's wheels context: hash-locked requirements with the
    cell's own `wheels` (name, sha256), or constraints of versions only. The first build and every later one make
    this file the same way from the same pins, so the same pins give the same context and content key."""
    if locked:
        return HASHED_IN_CONTEXT, requirements(text, wheels)
    return FILE_IN_CONTEXT, constraints("".join(f"{l}\n" for l in pin_lines(text)))


def write(path: Path, text: str) -> None:
    """Write a pins file whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(text)
    tmp.rename(path)


def check_image(image: str, lines: list[str], cell: Cell, docker_bin: str = "docker") -> None:
    """The image holds exactly what the pin `lines` name (but the cell's own wheels), each at its pinned version:
    `complete` against what the image's importlib.metadata lists."""
    installed = json.loads(docker.run_in_image(image, "python", "-c", INSTALLED_SCRIPT, docker=docker_bin))
    complete(lines, installed, cell, image)


# -- build requirements ---------------------------------------------------------------------------------------
def build_pins_file(pins_dir: Path, cell_id: str, package: str) -> Path:
    """Where a package's hash-locked build requirements are recorded: beside the cell's runtime pins."""
    return pins_dir / f"{cell_id}.build-{package}.txt"


def from_report(report: dict) -> tuple[list[str], str]:
    """`name==version --hash=sha256:...` for every distribution pip's installation report says it installed (the
    hash of the very file it took), or ([], why) when one has no hash (a local directory, a VCS checkout)."""
    out = []
    for item in report.get("install", []):
        meta = item.get("metadata") or {}
        name, version = canonicalize_name(meta.get("name", "")), meta.get("version", "")
        sha = (((item.get("download_info") or {}).get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if not name or not version:
            return [], "pip's report names a distribution without a name or version"
        if not sha:
            return [], f"{name} {version}: pip's report has no sha256 for it ({(item.get('download_info') or {}).get('url')})"
        out.append(f"{name}=={version} --hash=sha256:{sha}")
    return sorted(out), ""


def record_build(report_path: Path, dest: Path, cell: Cell, package: str) -> tuple[int, str]:
    """Write the build pins of `package` from pip's report (then removed); returns how many, or (0, why) when
    nothing was written."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        return 0, f"pip's report is unreadable: {exc}"
    finally:
        report_path.unlink(missing_ok=True)
    lines, why = from_report(report)
    if why:
        return 0, why
    if not lines:
        return 0, "the build tools already met every build requirement"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_text(f"# Written by `builder build` from the build requirements pip installed to compile {package} for "
                   f"{cell.id}; hash-locked for the next compiles (pip --require-hashes --no-deps).\n"
                   + "".join(f"{line}\n" for line in lines))
    tmp.rename(dest)
    return len(lines), ""
