"""Bad inputs around the unchanged-cell reuse (builder/image/ledger.py, steps/image.py), in the table's form
(tests/hardening/cases.py's Case): the place of the image ledger under the wheelhouse taken by something that
is not builder's directory. Each is refused (exit 2, one line naming --wheelhouse and the path) before any
docker call, and nothing is written through it.

The registry a build reuses from (--reuse-from, BUILDER_REUSE_FROM: builder/image/reuse.py) is checked as publish's
--registry is, before anything runs: empty, credentials in it, no repository path, a port out of range, not an
image name, a newline or a shell word in it, and, for publish, a registry other than the one it pushes to.

A bad entry inside the ledger (not JSON, another key, a digest that is not one, a symlink, a huge or deeply
nested file) is not refused: the build goes on and the image is built, the entry ignored with one line and then
replaced. That takes an image build, so it is tested on the engine (tests/docker/builds/test_build.py
test_reuse_takes_only_an_image_whose_digest_builder_recorded) and in-process (tests/unit/image/test_ledger.py), not here.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.hardening.cases import BUILD, PUBLISH, Case, directory, fifo, loop


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


SECRET = "s3cr3t-reuse-pw"
BAD_REUSE = {  # --reuse-from VALUE → what the refusal names
    "empty": ("", ("--reuse-from", "empty")),
    "only-a-scheme": ("https://", ("--reuse-from", "empty")),
    "credentials": (f"ci:{SECRET}@127.0.0.1:5000/team", ("--reuse-from", "no credentials")),
    "no-path": ("127.0.0.1:5000", ("--reuse-from", "HOST[:PORT]/PATH")),
    "port-range": ("127.0.0.1:99999/team", ("--reuse-from", "port 99999")),
    "port-zero": ("127.0.0.1:0/team", ("--reuse-from", "port 0")),
    "uppercase": ("127.0.0.1:5000/Team", ("--reuse-from",)),
    "space": ("127.0.0.1:5000/te am", ("--reuse-from",)),
    "newline": ("127.0.0.1:5000/team\n--evil", ("--reuse-from",)),
    "shell": ("127.0.0.1:5000/$(id)", ("--reuse-from",)),
    "nul": ("127.0.0.1:5000/te\x00am", ("--reuse-from",)),
    "double-slash": ("127.0.0.1:5000//team", ("--reuse-from",)),
    "trailing-dot": ("127.0.0.1:5000/team.", ("--reuse-from",)),
}
for name, (value, words) in BAD_REUSE.items():  # an empty or NUL value cannot be an environment variable's
    CASES.append(Case(f"reuse-from-{name}", "reuse", [*BUILD, "--reuse-from", value], expect=words))
    CASES.append(Case(f"reuse-from-env-{name}", "reuse", BUILD, env={"BUILDER_REUSE_FROM": value}, expect=words)
                 if value and "\x00" not in value else Case(f"reuse-from-dry-{name}", "reuse", [*BUILD, "--dry-run", "--reuse-from", value],
                                    expect=words))
CASES.append(Case("reuse-from-publish-elsewhere", "reuse",
                  [*PUBLISH, "--registry", "127.0.0.1:5999/team", "--reuse-from", "127.0.0.1:5999/other"],
                  expect=("--reuse-from", "publish reuses only what its --registry", "127.0.0.1:5999/team")))
