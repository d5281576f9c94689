"""`builder snapshot criu`: CRIU for a GPU host without Docker, where the process route (`--launcher process`) runs
it. Such a host rarely has one that works: Ubuntu 24.04 has none new enough, and CRIU 4.1.1 as released cannot dump
a TCP socket on Linux >= 6.16 (builder/data/criu/criu.toml). So BuildKit builds the runtime images' own criu stage
(the same source, checksum and patch) on the base given, sets the binary's RPATH to `$ORIGIN/../lib` so the
libraries it links are found beside it wherever the directory goes, and exports the directory: bin/criu, lib/,
BUILT_ON. Nothing is half-written: the export goes to a temporary directory beside --out, renamed into place whole."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Callable

from ... import docker as docker_mod
from ... import templates
from ...errors import Failed

TEMPLATE = "criu-host.Dockerfile.j2"


def dockerfile(criu: dict) -> str:
    return templates.environment().get_template(TEMPLATE).render(criu=criu, cell={"profile": {"name": "host"}})


def build(base: str, out: Path, ca_bundle: str | None, say: Callable[[str], None]) -> dict:
    """Build and export; the facts of what was made."""
    from ...resolve import criu_data

    criu = criu_data()
    work = out.parent / f".{out.name}.criu-{secrets.token_hex(4)}"  # named before it is made: removed on any exit
    try:
        (work / "context" / "criu").mkdir(parents=True)
        for patch in criu["patch_paths"]:
            shutil.copyfile(patch, work / "context" / "criu" / patch.name)
        (work / "Dockerfile").write_text(dockerfile(criu))
        call = docker_mod.BuildxCall(dockerfile=work / "Dockerfile", context=work / "context", target="out",
                                     build_args=(("BASE_DEVEL_IMAGE", base),),
                                     secrets=(("ca", ca_bundle),) if ca_bundle else (),
                                     output=docker_mod.csv_options(type="local", dest=str(work / "tree")))
        say(f"building CRIU {criu['version']} on {base} (BuildKit; the runtime images' criu stage)")
        proc = docker_mod.run(call.argv(), timeout=3600, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise Failed(f"building CRIU on {base} failed (exit {proc.returncode}); nothing written:\n{tail}")
        tree = work / "tree"
        if not (tree / "bin" / "criu").is_file():
            raise Failed(f"the build on {base} exported no bin/criu; nothing written")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()  # an empty directory (checked before the build)
        os.rename(tree, out)
        out.chmod(0o755)  # the exporter makes it 0700; a tool others run
    finally:
        shutil.rmtree(work, ignore_errors=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    return {"out": str(out), "criu": criu["version"], "patches": list(criu["patches"]), "base": base,
            "built_on": (out / "BUILT_ON").read_text().strip().splitlines(), "files": files,
            "bytes": sum((out / f).stat().st_size for f in files)}
