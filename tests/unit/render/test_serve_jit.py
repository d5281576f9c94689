"""What an engine compiles at its first request is in its runtime image, and smoke's JIT layer proves it without
a GPU (engine data serve_jit; ENGINES.md 7: Triton's launcher needs Python.h and a C compiler).

- no Docker: every shipped cell names its serve-time compiles, and its rendered runtime stage installs what each
  needs for the cell's Python (cu121 included) and the libcuda link stub; an unknown path is refused.
- docker: the fixture package as an engine that compiles a C extension against the Python headers at its first
  request. With the needs unmet (the runtime as it was) the JIT layer fails naming Python.h and the C compiler,
  and the cell fails; with the data's needs the same build passes it.
"""

from __future__ import annotations

import re

import pytest

from builder import plan, render
from builder.errors import UserError
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX
from tests.support.serve_jit import FIXTURE


def shipped_cells():
    m = load(MATRIX)
    return m, select(m, Selection(profiles=("all",)))


def runtime_stage(text: str) -> str:
    return text[text.index(" AS runtime"):]


@pytest.mark.pure
@pytest.mark.parametrize("cell", shipped_cells()[1], ids=lambda c: c.id)
def test_every_shipped_runtime_gets_what_its_first_request_compiles(cell):
    m, _ = shipped_cells()
    names = [p["name"] for p in cell.serve_jit]
    assert "triton" in names, "every shipped engine runs Triton kernels at serve time"
    text = runtime_stage(render.render(plan.plan_cells([cell], None)[0], m.defaults["index"]))
    apt = re.search(r"apt-get install -y --no-install-recommends ([^\\\n]*)\\\n \&\& apt-get clean[^\n]*\n(?!.*python3\.\d+ -m venv)",
                    text.split("ENV VIRTUAL_ENV", 1)[1])
    assert apt, "the runtime installs the serve-time needs"
    words = apt.group(1).split()
    assert f"python{cell.python}-dev" in words and "gcc" in words, words  # Triton's launcher: Python.h + cc
    assert "gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /opt/builder/stubs/libcuda.so /tmp/libcuda-stub.c" in text
    assert " cuInit " in text and "readelf -d /tmp/libcuda-check.so | grep -q 'NEEDED.*libcuda" in text
    assert "ENV TRITON_LIBCUDA_PATH=/opt/builder/stubs" in text
    if "flashinfer" in names:  # FlashInfer's JIT links -lcuda from CUDA_HOME
        assert cell.runtime_jit and 'ln -sfn /opt/builder/stubs "$root/lib/stubs"' in text
    for p in cell.serve_jit:
        assert p["why"] and p["probe"]


@pytest.mark.pure
def test_a_serve_jit_name_the_knowledge_does_not_define_is_refused(tmp_path):
    extra = tmp_path / "extra.toml"
    extra.write_text((FIXTURE / "engines-jit.toml").read_text().replace('serve_jit = ["python-c"]', 'serve_jit = ["pyhton-c"]'))
    mat = tmp_path / "matrix.toml"
    mat.write_text((FIXTURE / "matrix-jit.toml").read_text().replace('"engines-jit.toml"', f'"{extra}"'))
    (tmp_path / "pkg").symlink_to(FIXTURE / "pkg")
    with pytest.raises(UserError, match=r"serve_jit 'pyhton-c' .* defined nowhere.*did you mean 'python-c'"):
        select(load(mat), Selection())
