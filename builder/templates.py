"""The Dockerfile templates on disk (dockerfiles/): the Jinja2 environment, and which templates shape which
package's wheel. plan hashes that text into cache keys; render fills the templates in."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "dockerfiles"
ENTRY_TEMPLATE = "image.Dockerfile.j2"
# Templates that shape every wheel (a change to one of these changes every cache key)
_COMMON_TEMPLATES = ("macros.j2", "stages/toolchain.j2", "stages/torch.j2", "stages/wheels.j2")

if TYPE_CHECKING:
    import jinja2


@cache
def environment() -> jinja2.Environment:
    if not TEMPLATE_DIR.is_dir():
        raise UserError(f"templates not found at {TEMPLATE_DIR}; run builder from its source checkout")
    import jinja2  # only a render needs it: plan hashes the templates' text

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@cache
def template_text(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


def package_templates(source_kind: str, template: str, fetch_plan: bool) -> tuple[str, ...]:
    """Every template whose text reaches the stages that produce one package's wheel."""
    own = (f"stages/source-{source_kind}.j2", f"packages/{template}.j2")
    return _COMMON_TEMPLATES + own + (("stages/deps.j2",) if fetch_plan else ())


def digest(names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0" + template_text(name).encode() + b"\0")
    return h.hexdigest()
