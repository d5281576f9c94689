"""builder/image/sizes.py: where an image's bytes go, read from a real OCI archive layer by layer (whiteouts and
overwrites applied), with real nvcc-built libraries for the device code no GPU of the cell's archs loads."""

from __future__ import annotations

import json
from pathlib import Path

from builder.audit import read_fatbin_entries
from builder.image import oci, sizes
from tests.helpers import zstd_layer
from tests.support import audit as support

built = support.built
host_cc = support.host_cc
SITE = "opt/venv/lib/python3.11/site-packages"


def _archive(path: Path, layers: list[bytes], env: list[str]) -> str:
    """An OCI archive of one image with these zstd layers; its digest."""
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": env},
              "history": [{"created_by": f"RUN step {i}"} for i in range(len(layers))]}
    return oci.write_archive(path, config, [("application/vnd.oci.image.layer.v1.tar+zstd", b) for b in layers])[0]


def test_the_bytes_of_an_image_per_layer_kind_distribution_duplicate_and_arch(built, tmp_path):
    lib = built["sm80_sm90"].read_bytes()  # SASS for sm_80 and sm_90: a cell of sm_80 never loads the sm_90 one
    entries = read_fatbin_entries(built["sm80_sm90"])
    sm90 = sum(e.size for e in entries if e.arch == 90)
    assert sm90 > 0 and sum(e.size for e in entries) < len(lib)
    record = "foo/__init__.py,,\nfoo/libk.so,,\nfoo/tests/test_k.py,,\nfoo-1.0.dist-info/RECORD,,\n".encode()
    big = b"x" * 5000
    first = zstd_layer({f"{SITE}/foo/__init__.py": b"", f"{SITE}/foo/libk.so": lib, f"{SITE}/foo/tests/test_k.py": big,
                    f"{SITE}/foo-1.0.dist-info/RECORD": record, "usr/lib/old.so": b"o" * 3000,
                    f"{SITE}/old-1.0.dist-info/RECORD": b"old/gone.py,,\n", f"{SITE}/old/gone.py": b"g" * 100,
                    "opt/jit-cache/flashinfer/sm_100a/k.cubin": b"c" * 700,
                    "opt/jit-cache/flashinfer/sm_90a/k.cubin": b"c" * 900})
    second = zstd_layer({"usr/lib/.wh.old.so": b"", f"{SITE}/.wh.old-1.0.dist-info": b"", f"{SITE}/.wh.old": b"",
                     "usr/share/copy-of-test.py": big, f"{SITE}/foo/__pycache__/x.cpython-311.pyc": b"p" * 40},
                    links={"usr/lib/libk-link.so": f"{SITE}/foo/libk.so"})
    digest = _archive(tmp_path / "image.oci.tar", [first, second], ["PATH=/usr/bin:/bin",
                                                                    "FLASHINFER_WORKSPACE_BASE=/opt/jit-cache/flashinfer"])
    found = sizes.measure(tmp_path / "image.oci.tar", (80,))
    assert found.digest == digest
    # whiteouts applied: the deleted library and distribution are gone, their bytes counted as shadowed
    assert "/usr/lib/old.so" not in found.files and f"/{SITE}/old/gone.py" not in found.files
    assert found.shadowed == 3000 + 100 + len(b"old/gone.py,,\n")
    assert found.total == len(lib) + 2 * len(big) + len(record) + 700 + 900 + 40  # the hard link adds nothing
    assert [(l.files, l.bytes) for l in found.layers] == [(9, len(lib) + len(big) + len(record) + 3000 + 14 + 100 + 1600),
                                                          (2, len(big) + 40)]
    assert found.layers[1].created_by == "RUN step 1" and found.compressed == len(first) + len(second)
    # per distribution: the RECORD still in the image names foo's files; the deleted RECORD names nothing
    per = sizes.per_distribution(found)
    assert per["foo"] == len(lib) + len(big) + len(record) and "old" not in per
    # per kind: the JIT cache root from the image's Env, tests, bytecode
    assert found.per_kind["JIT cache (prebuilt modules)"] == 1600
    assert found.per_kind["tests"] == len(big) and found.per_kind["Python bytecode"] == 40
    # shipped twice: the same bytes at two paths (not the hard link)
    assert sizes.duplicates(found) == [(len(big), [f"/{SITE}/foo/tests/test_k.py", "/usr/share/copy-of-test.py"])]
    # other archs by path (sm_90a is the cell's family only when the cell has 90: here it does not), and in fatbins
    assert sizes.other_arch_files(found) == {"sm_100": 700, "sm_90": 900}
    lib_file = found.files[f"/{SITE}/foo/libk.so"]
    assert lib_file.device == sum(e.size for e in entries) and lib_file.dead == sm90
    text = "\n".join(sizes.report(found))
    assert "shipped twice:" in text and "of which no GPU of sm_80 loads" in text
    assert json.loads(json.dumps(sizes.to_json(found)))["device_code"]["never_loaded"] == sm90
    # a cell of sm_80 and sm_90 loads every entry
    assert sizes.measure(tmp_path / "image.oci.tar", (80, 90)).files[f"/{SITE}/foo/libk.so"].dead == 0
