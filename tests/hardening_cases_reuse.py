"""Bad inputs around the unchanged-cell reuse (builder/ledger.py, steps/image.py), in the table's form
(tests/hardening_cases.py's Case): the place of the image ledger under the wheelhouse taken by something that
is not builder's directory. Each is refused (exit 2, one line naming --wheelhouse and the path) before any
docker call, and nothing is written through it.

A bad entry inside the ledger (not JSON, another key, a digest that is not one, a symlink, a huge or deeply
nested file) is not refused: the build goes on and the image is built, the entry ignored with one line and then
replaced. That takes an image build, so it is tested on the engine (tests/test_build.py
test_reuse_takes_only_an_image_whose_digest_builder_recorded) and in-process (tests/test_ledger.py), not here.
"""

from __future__ import annotations

import os
from pathlib import Path

from .hardening_cases import BUILD, Case, directory, fifo, loop


def _symlink_to_dir(path: Path) -> None:
    (path.parent.parent / "elsewhere").mkdir()
    os.symlink("../elsewhere", path)


def _dangling(path: Path) -> None:
    os.symlink("/nonexistent/builder-ledger", path)


def _symlink_to_file(path: Path) -> None:
    (path.parent.parent / "afile").write_text("x")
    os.symlink("../afile", path)


LEDGER = "wh/.images"
CASES: list[Case] = [
    Case("ledger-place-is-a-file", "reuse", BUILD, files={"wh": directory, LEDGER: "not a directory\n"},
         expect=("--wheelhouse", ".images is a file", "image ledger")),
    Case("ledger-place-is-an-empty-file", "reuse", BUILD, files={"wh": directory, LEDGER: ""},
         expect=("--wheelhouse", ".images is a file", "image ledger")),
    Case("ledger-place-is-a-fifo", "reuse", BUILD, files={"wh": directory, LEDGER: fifo},
         expect=("--wheelhouse", ".images is not a directory", "image ledger")),
    Case("ledger-place-is-a-symlink-to-a-directory", "reuse", BUILD, files={"wh": directory, LEDGER: _symlink_to_dir},
         expect=("--wheelhouse", ".images is a symlink", "image ledger")),
    Case("ledger-place-is-a-symlink-to-a-file", "reuse", BUILD, files={"wh": directory, LEDGER: _symlink_to_file},
         expect=("--wheelhouse", ".images is a symlink", "image ledger")),
    Case("ledger-place-is-a-dangling-symlink", "reuse", BUILD, files={"wh": directory, LEDGER: _dangling},
         expect=("--wheelhouse", ".images is a symlink", "image ledger")),
    Case("ledger-place-is-a-symlink-loop", "reuse", BUILD, files={"wh": directory, LEDGER: loop},
         expect=("--wheelhouse", ".images is a symlink", "image ledger")),
]
