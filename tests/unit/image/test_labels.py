"""Labels are facts: the audited package labels say what the audit found in the wheels the image installs — the
SASS and PTX every binary with device code carries, and each binary whose coverage differs (sglang-kernel's six
binaries do: sm90/ and sm100/ common_ops, flash_ops, flashmla_ops, ...) — and builder/image/labels.py is the one module
that writes and reads every io.builder.* label (render, serve, smoke)."""

from __future__ import annotations

import ast
import json
import re

import pytest

from builder.image import labels
from builder.audit import AuditReport, BinaryReport, FatbinEntry

from tests.helpers import REPO


def binary(path: str, *names: str) -> BinaryReport:
    entries = tuple(FatbinEntry("sass" if n.startswith("sm_") else "ptx", int(re.search(r"\d+", n).group()),
                                re.sub(r"^\D+_\d+", "", n), False) for n in names)
    return BinaryReport(f"sglang_kernel-0.4.10-cp310-abi3-linux_x86_64.whl!{path}", entries, ())


@pytest.mark.pure
def test_audited_labels_are_what_every_binary_carries_and_the_binaries_that_differ():
    report = AuditReport("wheels", (80, 90), [
        binary("sgl_kernel/sm90/common_ops.abi3.so", "sm_80", "sm_89", "sm_90", "sm_90a", "sm_100f", "sm_120a"),
        binary("sgl_kernel/sm100/common_ops.abi3.so", "sm_80", "sm_89", "sm_90", "sm_90a", "sm_100f", "sm_120a"),
        binary("sgl_kernel/flash_ops.abi3.so", "sm_80", "sm_86", "sm_90a"),
        binary("sgl_kernel/flashmla_ops.abi3.so", "sm_90a", "sm_100f", "sm_103a"),
        BinaryReport("sglang_kernel-0.4.10-cp310-abi3-linux_x86_64.whl!sgl_kernel/__init__.py", (), ()),
    ])
    got = labels.audit_values("sglang-kernel", report)
    assert got["BUILDER_AUDIT_SGLANG_KERNEL_SASS"] == "sm_90a"  # the one SASS every binary carries
    assert got["BUILDER_AUDIT_SGLANG_KERNEL_PTX"] == ""
    differ = json.loads(got["BUILDER_AUDIT_SGLANG_KERNEL_BINARIES"])
    assert differ["sgl_kernel/flashmla_ops.abi3.so"] == {"sass": ["sm_100f", "sm_103a", "sm_90a"], "ptx": []}
    assert set(differ) == {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
                           "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so"}
    assert labels.found_sass(report) >= {"sm_80", "sm_86", "sm_103a"} and "sm_100a" not in labels.found_sass(report)
    image = {"io.builder.package.sglang-kernel.sass": "sm_90a", "io.builder.package.sglang-kernel.ptx": "",
             "io.builder.package.sglang-kernel.binaries": got["BUILDER_AUDIT_SGLANG_KERNEL_BINARIES"]}
    facts = labels.package_facts(image, "sglang-kernel")
    assert facts["sass"] == ["sm_90a"] and facts["binaries"] == differ


@pytest.mark.pure
def test_one_uniform_package_has_no_per_binary_label():
    report = AuditReport("w", (80, 90), [binary("cuda_ext/libsaxpy.so", "sm_80", "sm_90")])
    assert labels.audit_values("cuda-ext", report) == {"BUILDER_AUDIT_CUDA_EXT_SASS": "sm_80,sm_90",
                                                       "BUILDER_AUDIT_CUDA_EXT_PTX": "", "BUILDER_AUDIT_CUDA_EXT_BINARIES": ""}


@pytest.mark.pure
def test_no_other_module_spells_an_image_label():
    """Image labels are written and read through builder/image/labels.py (container labels of smoke runs, the OCI
    annotations of the wheel cache's and of a snapshot's artifacts, and the CLI's version listing are not image
    labels of the runtime image)."""
    allowed = {"builder/image/labels.py", "builder/deploy/runtime/engine.py", "builder/deploy/runtime/caches.py",
               "builder/cache/registry.py", "builder/deploy/snapshot/ship.py"}
    offenders = []
    for path in sorted((REPO / "builder").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"io\.builder\.[a-z.-]+", node.value):
                offenders.append(f"{rel}: {node.value}")
    assert offenders == []


@pytest.mark.pure
@pytest.mark.parametrize("cell, prebuilt", [
    ("vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-index-jitprebuilt", True),
    ("vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-index-jitprebuilt-criu", True),  # criu's suffix comes after
    ("vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-criu", False),
    ("vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90", False),
    ("jitprebuilt-1.0-cu130-py311-sm90", False),  # an engine's name is not the part
])
def test_an_image_is_jit_prebuilt_when_its_cell_id_has_the_part(cell, prebuilt):
    """serve mounts no compile-cache volume over prebuilt JIT modules: the cell id says which images carry them."""
    assert labels.jit_prebuilt({labels.CELL: cell}) is prebuilt
