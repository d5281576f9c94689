"""What `builder verify` costs a deployer, and what the SBOM of an image holds (issue 49: verify <= 5 s for the real
vLLM image on 2 cores): the image's OCI archive pushed by digest to a registry on 127.0.0.1 (docker-registry, as the
tests run it), its SBOM and provenance made and attached as publish attaches them (signed with a key made here),
then `builder verify REPO@digest --key` timed n times, each a fresh process (its imports included).

    .venv/bin/python benchmarks/verify.py --archive WORK/<cell>/image.oci.tar [-n 3]
    .venv/bin/python benchmarks/verify.py --quick      # the fixture cell, built here first, n = 1

Prints the SBOM's seconds and package counts per source, the attestations' bytes, and verify's median seconds."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import REPO  # noqa: E402
from image_bytes import chosen_archive  # noqa: E402

from builder.image import attest, oci, provenance, sbom  # noqa: E402
from builder.registry_api import RegistryPath  # noqa: E402
from tests.helpers import free_port, registry_config_lines, stop_process  # noqa: E402
from tests.support.ledger_signing import keys  # noqa: E402

GOAL_S = 5.0


def start_registry(root: Path) -> tuple[subprocess.Popen, str]:
    host = f"127.0.0.1:{free_port()}"
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text("\n".join(registry_config_lines(root, host)) + "\n")
    proc = subprocess.Popen([shutil.which("docker-registry") or "docker-registry", "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request

    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=1).close()
            return proc, host
        except OSError:
            time.sleep(0.1)
    stop_process(proc, 5)
    sys.exit(f"docker-registry did not come up on {host}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, help="an image's OCI archive (builder build leaves it in the cell's work dir)")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the fixture cell, built here first; n = 1")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp_dir:
        tmp = Path(tmp_dir)
        archive = chosen_archive(args.quick, args.archive, tmp)
        if args.quick:
            args.n = 1
        proc, host = start_registry(tmp / "registry")
        try:
            where = RegistryPath.parse(f"{host}/bench", "--registry")
            repository = where.repository("engine")
            with oci.Archive(archive) as a:
                image = a.image()
            archive_bytes = archive.stat().st_size  # the quick run's archive goes with its temporary directory
            t0 = time.perf_counter()
            copied = subprocess.run(["skopeo", "copy", "--quiet", "--all", "--preserve-digests", "--dest-tls-verify=false",
                                     f"oci-archive:{archive}", f"docker://{repository}:bench"], capture_output=True, text=True)
            if copied.returncode != 0:
                sys.exit(f"skopeo copy failed: {copied.stderr[-2000:]}")
            pushed_s = time.perf_counter() - t0
            signer, _, _ = keys(tmp)
            labels = (image.config.get("config") or {}).get("Labels") or {}
            predicate = provenance.predicate({"id": labels.get("io.builder.cell", ""),
                                              "content_key": labels.get("io.builder.content-key", "")}, [], {}, {},
                                             started=attest.now(), finished=attest.now(), versions={})
            t0 = time.perf_counter()
            doc = sbom.make(archive)
            sbom_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            attached = attest.attach_image(where, repository, archive, image, predicate, signer, lambda line: None, doc)
            attach_s = time.perf_counter() - t0
            sbom_bytes = len(json.dumps(doc, sort_keys=True, separators=(",", ":")))
            ref = f"{repository}@{image.digest}"
            argv = [sys.executable, "-m", "builder.cli", "verify", ref, "--key", str(tmp / "ecdsa.pub")]
            seconds = []
            for _ in range(args.n):
                t0 = time.perf_counter()
                res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
                seconds.append(time.perf_counter() - t0)
                if res.returncode != 0:
                    sys.exit(f"verify failed on the good image:\n{res.stdout}{res.stderr}")
        finally:
            stop_process(proc, 10)
    counts = sbom.counts(doc)
    print(f"image {image.digest} ({archive_bytes / 1e9:.2f} GB archive), pushed in {pushed_s:.1f} s")
    print(f"SBOM: {sbom_s:.1f} s to make, {sbom_bytes / 1e6:.2f} MB; " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    print(f"attach: {len(attached)} attestations signed and pushed in {attach_s:.1f} s")
    median = statistics.median(seconds)
    print(f"verify: median {median:.2f} s over {args.n} runs (goal <= {GOAL_S:g} s): "
          + ("goal met" if median <= GOAL_S else "GOAL NOT MET"))


if __name__ == "__main__":
    main()
