"""The engine's environment on a GPU host without Docker (scripts/gpu-host-run, docs/gpu-hosts.md): the runtime
image's stage, made on the host from a carry bundle.

- The carry bundle: its parts arrive over several calls (`stash` keeps them in the store, BUILDER_CARRY_STORE),
  are joined in the order of their numbers, checked against SHA256SUMS, unpacked (tarfile's data filter) and
  pip-installed into site-<name> of the store; py-<name> is the interpreter wrapper that puts it on the path. A new
  bundle under an installed name is installed in its place; a failure leaves the installed one as it was.
- The spec (scripts/gpu-host/<name>.toml, carried beside the parts): schema.CARRY_SPEC, its [serve] table what a
  run reads (schema.CARRY_SPEC_SERVED).
- The venv at the image's prefix (--image-paths): made from this host's interpreter, the bundles' files copied in,
  this host's packages linked beside them, CUDA_HOME linked to its toolkit; kept between boots as an image's venv
  is (a stamp says what it was made from), its files' times set back to a warm layer's.

Refusals are builder's errors, one line each: UserError (exit 2) for a bad name, spec or store, Failed (1) for a
bundle that does not check out, EnvironmentProblem (3) for what this host lacks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ... import files, grammar, schema
from ...errors import EnvironmentProblem, Failed, UserError
from ...image.launchline import ImagePaths

STORE_VARIABLE = "BUILDER_CARRY_STORE"
DEFAULT_STORE = "/tmp/builder-carry"
VENV_STAMP = ".gpu-host-run-venv.json"  # what the venv at the image's prefix was made from
PART = re.compile(r"part-([0-9]{2,6})")  # what gpu-host-bundle writes: part-00, ..., part-99, part-100, ...
MAX_SUMS = 1 << 20  # no SHA256SUMS of gpu-host-bundle comes near this


def checked_name(name: str, what: str = "bundle") -> str:
    """The cell/bundle name grammar (builder/grammar.py): one path component, nothing a shell reads."""
    try:
        return grammar.bundle_name(name)
    except ValueError as exc:
        raise UserError(f"{what} name {name!r} {exc}") from None


@dataclass(frozen=True)
class Store:
    """The store (BUILDER_CARRY_STORE: the parts, the installed bundles, their interpreters) and the checkout whose
    .carry/ holds the parts carried in this call and scripts/gpu-host/ the specs."""

    path: Path
    checkout: Path
    named: bool = True  # False: BUILDER_CARRY_STORE was set empty

    @classmethod
    def from_env(cls, checkout: Path) -> "Store":
        value = os.environ.get(STORE_VARIABLE, DEFAULT_STORE)
        return cls(Path(value).absolute(), Path(checkout), bool(value.strip()))

    def carried(self, name: str) -> Path:
        return self.checkout / ".carry" / checked_name(name)

    def stored(self, name: str) -> Path:
        return self.path / checked_name(name)

    def python(self, name: str) -> Path:
        return self.path / f"py-{checked_name(name)}"

    def marker(self, name: str) -> Path:
        """The sha256 of the bundle installed under `name` (a new bundle under the same name is installed anew)."""
        return self.path / f"installed-{checked_name(name)}.sha256"

    def site(self, name: str) -> Path:
        return self.path / f"site-{checked_name(name)}"


# -- the carry bundle ------------------------------------------------------------------------------------------
def store_dir(store: Store, name: str) -> Path:
    """The store's directory of `name`, made: the store (and <store>/<name>) must be directories or creatable ones."""
    if not store.named:
        raise UserError(f"{STORE_VARIABLE} is empty: name the store directory (or unset it: {DEFAULT_STORE})")
    dest = store.stored(name)
    for path, what in ((store.path, STORE_VARIABLE), (dest, f"the store's {name}")):
        files.check_kind(path, what, "directory")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{STORE_VARIABLE}: cannot make {dest}: {exc.strerror}") from None
    return dest


def stash(store: Store, name: str) -> None:
    """The parts carried in this call (.carry/<name>/) copied into the store."""
    dest = store_dir(store, name)
    for p in sorted(store.carried(name).glob("*")):
        if p.is_file() and not p.is_symlink():
            tmp = dest / f".{p.name}.part"  # a copy stopped half-way is never taken for the part
            try:
                shutil.copy2(p, tmp)
                os.replace(tmp, dest / p.name)
            finally:
                tmp.unlink(missing_ok=True)
            print(f"stashed {p.name} ({p.stat().st_size >> 20} MiB)", file=sys.stderr)
    print("store:", ", ".join(sorted(q.name for q in dest.iterdir())), file=sys.stderr)


def read_sums(store: Store, name: str) -> tuple[str, list[tuple[str, str]]]:
    """(the whole bundle's sha256, [(part, sha256)] in the order of their numbers) from SHA256SUMS."""
    path = store.stored(name) / "SHA256SUMS"
    try:
        text = files.read_text(path, "SHA256SUMS")
    except UserError as exc:
        raise Failed(f"{name}: {exc}: carry the bundle, then stash") from None
    if len(text) > MAX_SUMS:
        raise Failed(f"{path}: {len(text)} characters: not a SHA256SUMS of gpu-host-bundle")
    whole, parts = None, {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line)
        part = PART.fullmatch(m[2]) if m else None
        if m and m[2] == "bundle.tar" and whole is None:
            whole = m[1]
        elif part and int(part[1]) not in parts:
            parts[int(part[1])] = (m[2], m[1])
        else:
            raise Failed(f"{path}: line {n} is not '<sha256>  part-NN' or '<sha256>  bundle.tar' (once each): {line[:80]!r}")
    if whole is None or not parts:
        raise Failed(f"{path}: names no bundle.tar or no part")
    numbers = sorted(parts)
    if numbers != list(range(len(numbers))):
        raise Failed(f"{path}: the parts are not numbered 0 to {len(numbers) - 1} without a gap")
    return whole, [parts[i] for i in numbers]


def install(store: Store, name: str) -> None:
    """Stash, then join, check and pip-install the bundle of `name` (unless it is the one installed)."""
    stash(store, name)
    whole, parts = read_sums(store, name)
    py, marker = store.python(name), store.marker(name)
    if py.is_file() and marker.is_file() and marker.read_text().strip() == whole:
        print(f"{name}: bundle {whole[:16]} already installed", file=sys.stderr)
        return
    if py.is_file():
        print(f"{name}: the store holds another bundle under this name than the installed one: installing bundle "
              f"{whole[:16]} in its place", file=sys.stderr)
    src = store.stored(name)
    missing = [p for p, _ in parts if not (src / p).is_file()]
    if missing:
        raise Failed(f"{name}: parts {', '.join(missing)} have not arrived (carry them, then stash)")
    for p, digest in parts:  # a part of an earlier bundle of the same name, or a damaged one
        if files.sha256_file(src / p) != digest:
            raise Failed(f"{name}/{p}: sha256 differs from SHA256SUMS (a part of another bundle of this name, or "
                         "damaged: carry it again, then stash)")
    wheels = _install_site(store, name, whole, [p for p, _ in parts])
    site = store.site(name)
    # every value quoted: a store path with a space or a `$(...)` in it is a path, not shell text
    py.write_text(f"#!/bin/sh\nexport PYTHONPATH={shlex.quote(str(site))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                  f"export PATH={shlex.quote(str(site / 'bin'))}:\"$PATH\"\n"
                  f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    py.chmod(0o755)
    marker.write_text(whole + "\n")
    print(f"{name}: {wheels} wheels installed in {site}; interpreter {py}", file=sys.stderr)


def _install_site(store: Store, name: str, whole: str, parts: list[str]) -> int:
    """The parts joined, checked, unpacked and pip-installed into site-<name> (the old one, its interpreter and
    marker removed): everything in temporary places first, so that a failure or an interrupt leaves the installed
    bundle as it was. How many wheels."""
    src, tar_path = store.stored(name), store.path / f".{name}.tar.new"
    unpacked, site, new_site = store.path / f".{name}.new-files", store.site(name), store.path / f".{name}.new-site"
    try:
        with open(tar_path, "wb") as out:
            for p in parts:
                with open(src / p, "rb") as part:
                    shutil.copyfileobj(part, out, 1 << 20)
        if files.sha256_file(tar_path) != whole:
            raise Failed(f"{name}: the joined bundle's sha256 differs from SHA256SUMS")
        for old in (unpacked, new_site):
            shutil.rmtree(old, ignore_errors=True)
        try:
            with tarfile.open(tar_path) as tar:
                tar.extractall(unpacked, filter="data")  # no member outside `unpacked`, no link out, no device
        except tarfile.FilterError as exc:
            raise Failed(f"{name}: the bundle's member {exc.tarinfo.name!r} is refused: {exc}") from None
        except (tarfile.TarError, EOFError) as exc:
            raise Failed(f"{name}: the joined bundle is not a tar gpu-host-bundle writes ({exc})") from None
        wheels = sorted(str(w) for w in (unpacked / "wheels").glob("*.whl"))
        if not wheels:
            raise Failed(f"{name}: the bundle holds no wheel (wheels/*.whl)")
        res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                              str(new_site), *wheels])
        if res.returncode:
            raise Failed(f"{name}: pip install of the bundle's {len(wheels)} wheels failed (exit {res.returncode}; "
                         "its words above)")
        store.python(name).unlink(missing_ok=True)
        store.marker(name).unlink(missing_ok=True)
        shutil.rmtree(site, ignore_errors=True)
        os.replace(new_site, site)
    finally:
        tar_path.unlink(missing_ok=True)
        for tmp in (unpacked, new_site):
            shutil.rmtree(tmp, ignore_errors=True)
    return len(wheels)


# -- the spec --------------------------------------------------------------------------------------------------
def parse_spec(text: str, shown: str, shape: schema.Table = schema.CARRY_SPEC) -> dict:
    """A spec's text parsed and checked against `shape` (schema.CARRY_SPEC as gpu-host-bundle reads it,
    CARRY_SPEC_SERVED as a run does); a UserError (one line, exit 2) naming the file (`shown`) otherwise."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise UserError(f"{shown}: the spec is not TOML ({exc})") from None
    schema.check(f"{shown}: not a usable spec", data, shape)
    return data


def read_spec(path: Path, shape: schema.Table = schema.CARRY_SPEC) -> dict:
    """A spec file (a regular UTF-8 file: files.read_text) parsed and checked (parse_spec)."""
    return parse_spec(files.read_text(path, "TOML spec"), str(path), shape)


def spec(store: Store, name: str) -> dict:
    """The spec of `name` that a run reads: carried, stored, or in scripts/gpu-host/, the first there; its [serve]
    has cell (a cell name), engine_args (one shell-quoted string) and env (NAME=VALUE strings)."""
    for p in (store.carried(name) / "spec.toml", store.stored(name) / "spec.toml",
              store.checkout / "scripts" / "gpu-host" / f"{name}.toml"):
        if os.path.lexists(p):
            return read_spec(p, schema.CARRY_SPEC_SERVED)
    raise UserError(f"no spec for {name}")


# -- the venv at the image's prefix ----------------------------------------------------------------------------
def image_venv(store: Store, names: list[str], paths: ImagePaths, not_newer_than: int | None = None,
               slim: str | None = None) -> Path:
    """A venv at the image's prefix made from this interpreter: the installed bundles' files copied into its
    site-packages (console scripts pointed at its python), then every entry of this interpreter's own site-packages
    that the bundles do not provide linked in (torch and the rest of the host, reached at the image's paths), and
    CUDA_HOME linked to this host's toolkit; its python. Made anew only when the bundles, this interpreter, its
    packages or the toolkit changed: otherwise the one made before is kept with its files' times, as an image's
    venv is between two boots (made anew, its files would be newer than what FlashInfer's ninja built from them,
    and rebuilt).
    `not_newer_than` (a warm layer's time): the venv's own files get no later time than that, as in the image.
    `slim` (the runtime install's slim step as a shell command, render.slim_command): run over the venv once its
    files are in, as the image's install does; a venv made with it is another venv than one made without."""
    import sysconfig

    venv, purelib = Path(paths.prefix), Path(paths.purelib)
    host = Path(sysconfig.get_paths()["purelib"])
    toolkit = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    stamp = _stamp(store, names, paths, host, toolkit, slim)
    stamp_file = venv / VENV_STAMP
    if not venv.is_symlink() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        print(f"image paths: {venv} kept as made before (the same bundles, interpreter, packages and toolkit)",
              flush=True, file=sys.stderr)
        _clamp_venv(venv, paths, not_newer_than)
        return venv / "bin" / "python"
    if venv.is_symlink() or venv.is_file():
        venv.unlink()
    shutil.rmtree(venv, ignore_errors=True)
    res = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    if res.returncode or not purelib.is_dir():
        raise EnvironmentProblem(f"python -m venv {venv} failed or made no {purelib} (this host's Python is not the "
                                 f"image's {purelib.parent.name}?)")
    python = venv / "bin" / "python"
    for n in names:
        _copy_site(store.site(n), venv, purelib, python)
    linked = _link_host(host, purelib)
    if slim is not None:
        _slim(slim, purelib, python)
    if paths.cuda_home:
        _link_toolkit(Path(paths.cuda_home), toolkit)
    _clamp_venv(venv, paths, not_newer_than)
    stamp_file.write_text(stamp)  # last: a venv left half-made by a failure is made anew next time
    print(f"image paths: {venv} ({', '.join(names)} copied in, {linked} entries of {host} linked), "
          f"CUDA_HOME {paths.cuda_home or '-'}", flush=True, file=sys.stderr)
    return python


def _own_bytes(root: Path) -> tuple[int, int]:
    """(files, bytes) under `root`, links not followed and a hard-linked file counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return len(seen), total


def _slim(command: str, purelib: Path, python: Path) -> None:
    """The runtime's slim step over the venv's own files (the host's, linked in, are not followed), its figures."""
    before = _own_bytes(purelib)
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", command], env=env)
    if res.returncode:
        raise EnvironmentProblem(f"the slim step exited {res.returncode} over {purelib} (its command: {command})")
    after = _own_bytes(purelib)
    print(f"slim: {purelib}: {before[0]} files, {before[1]:,} bytes -> {after[0]} files, {after[1]:,} bytes "
          f"(the bundles' own files; the host's linked packages are not slimmed)", flush=True, file=sys.stderr)


def _stamp(store: Store, names: list[str], paths: ImagePaths, host: Path, toolkit: Path, slim: str | None = None) -> str:
    """What the venv is made from: the installed bundles, this interpreter and its packages, the toolkit, the slim
    step it went through."""
    markers = {n: store.marker(n) for n in names}
    return json.dumps({"bundles": {n: m.read_text().strip() if m.is_file() else "" for n, m in markers.items()},
                       "python": sys.executable, "host": str(host), "prefix": str(Path(paths.prefix)),
                       "purelib": str(Path(paths.purelib)),
                       "host_entries": sorted(set(os.listdir(host)) - {"__pycache__"}),  # bytecode a boot wrote
                       "cuda_home": paths.cuda_home, "toolkit": str(toolkit), "slim": slim}, sort_keys=True)


def _copy_site(site: Path, venv: Path, purelib: Path, python: Path) -> None:
    """An installed bundle's files copied into the venv (what is there already kept), its console scripts pointed
    at the venv's python."""
    for entry in sorted(site.iterdir()):
        if entry.name == "bin":
            for script in sorted(entry.iterdir()):
                target = venv / "bin" / script.name
                if target.exists() or not script.is_file():
                    continue
                data = script.read_bytes()
                if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                    data = f"#!{python}".encode() + b"\n" + data.split(b"\n", 1)[1]
                target.write_bytes(data)
                target.chmod(0o755)
            continue
        target = purelib / entry.name
        if target.exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True)
        else:
            shutil.copy2(entry, target)


def _canonical(dist_info: str) -> str:
    return re.sub(r"[-_.]+", "-", dist_info.split("-")[0]).lower()


def _link_host(host: Path, purelib: Path) -> int:
    """Every entry of this host's site-packages that the venv lacks linked in (not the dist-info of a package the
    bundles provide); how many."""
    provided = {_canonical(p.name) for p in purelib.glob("*.dist-info")}
    linked = 0
    for entry in sorted(host.iterdir()):
        if entry.name == "__pycache__" or (purelib / entry.name).exists():
            continue
        if entry.name.endswith((".dist-info", ".egg-info")) and _canonical(entry.name) in provided:
            continue
        (purelib / entry.name).symlink_to(entry)
        linked += 1
    return linked


def _link_toolkit(link: Path, toolkit: Path) -> None:
    """The image's CUDA_HOME made a link to this host's toolkit."""
    if not (toolkit / "bin" / "nvcc").is_file():
        raise EnvironmentProblem(f"no nvcc under {toolkit} (set CUDA_HOME): the image's CUDA_HOME {link} links there")
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise EnvironmentProblem(f"{link} exists and is not a link: the image's CUDA_HOME is made a link to {toolkit} "
                                 "here")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(toolkit)


def _clamp_venv(venv: Path, paths: ImagePaths, not_newer_than: int | None) -> None:
    if not_newer_than is None:
        return
    clamped = clamp_times(venv, not_newer_than)
    print(f"image paths: {clamped} files of {venv} set back to the warm layer's time {not_newer_than} (in the "
          "image BuildKit's rewrite-timestamp does the same)", flush=True, file=sys.stderr)
    newer = newer_host_files([Path(paths.purelib) / "torch" / "include",
                              Path(paths.cuda_home or "/nonexistent") / "include"], not_newer_than)
    if newer:  # this host's files, not ours to change: a JIT module including one of them is rebuilt
        print(f"image paths: {len(newer)} header(s) this host provides are newer than the warm layer, e.g. "
              f"{newer[0]}: ninja rebuilds what includes them", flush=True, file=sys.stderr)


def clamp_times(top: Path, when: int) -> int:
    """Give every file and directory under `top` (not following links: the host's own files are not ours) that is
    newer than `when` that time; how many were."""
    n = 0
    for d, dirs, names in os.walk(top):
        for name in [*dirs, *names]:
            p = os.path.join(d, name)
            st = os.lstat(p)
            if not os.path.islink(p) and st.st_mtime > when:
                os.utime(p, (when, when), follow_symlinks=False)
                n += 1
    return n


def newer_host_files(dirs: list[Path], when: int) -> list[str]:
    return sorted(str(p) for d in dirs if d.is_dir() for p in d.resolve().rglob("*")
                  if p.is_file() and p.stat().st_mtime > when)
