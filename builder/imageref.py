"""An image reference, parsed once: `[REGISTRY[:PORT]/]PATH[:TAG][@ALGORITHM:HEX]`.

The grammar is the distribution project's (reference/regexp.go), with Docker's normalisation of a name that names
no registry: the first path component is a registry only when it holds a `.` or a `:`, is `localhost`, or has an
upper-case letter (`ParseNormalizedNamed`); otherwise the image is on Docker Hub (`docker.io`), and a one-component
path there is `library/NAME`. `str()` gives back the reference as the user wrote it; `registry` and `repository`
say where it lives, as written (`registry` is "" for a Docker Hub short name); `api_host` and `api_repository` are
what a registry client asks (`registry-1.docker.io`, `library/x`).

    >>> ImageRef.parse("127.0.0.1:5000/builder/vllm@sha256:" + "a" * 64).registry
    '127.0.0.1:5000'
    >>> ImageRef.parse("x:1").api_repository
    'library/x'
"""

from __future__ import annotations

import dataclasses
import re

from .errors import UserError
from .redact import describe

HUB = "docker.io"
HUB_API = "registry-1.docker.io"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
# a host name (labels of letters, digits and inner dashes), an IPv4 address or a bracketed IPv6 one, then a port
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
NAME_MAX = 255  # the whole name (registry and path), as the distribution project bounds it


@dataclasses.dataclass(frozen=True)
class ImageRef:
    registry: str  # "127.0.0.1:5000", "ghcr.io"; "" for a name on Docker Hub written without its host
    repository: str  # the path as written: "builder/vllm", "x" (not "library/x")
    tag: str = ""
    digest: str = ""  # "sha256:<64 hex>"

    @classmethod
    def parse(cls, text: str, what: str = "image reference") -> ImageRef:
        """The reference `text`, or UserError naming `what` and the part the grammar refuses."""
        if not isinstance(text, str) or not text:
            raise UserError(f"{what}: empty")
        if text != text.strip() or any(c.isspace() or ord(c) < 32 for c in text):
            raise UserError(f"{what}: {describe(text)} holds white space or control characters")
        if bad := sorted(set(re.sub(r"[A-Za-z0-9._:/@\[\]-]", "", text))):
            # named by the characters only: a query or credentials there must not be echoed part by part
            raise UserError(f"{what}: {describe(text)} holds {' '.join(map(repr, bad))}, which no image reference "
                            "has")
        rest, at, digest = text.partition("@")
        if at and digest.startswith("sha256:") and not _SHA256.fullmatch(digest):
            raise UserError(f"{what}: {describe(text)}: a sha256 digest is 64 lowercase hex digits")
        if at and not _DIGEST.fullmatch(digest):
            raise UserError(f"{what}: {describe(text)}: {describe(digest)} after '@' is not a digest like sha256:<64 hex>")
        name, tag = rest, ""
        if ":" in rest.rsplit("/", 1)[-1]:
            name, _, tag = rest.rpartition(":")
            if not _TAG.fullmatch(tag):
                raise UserError(f"{what}: {describe(text)}: {describe(tag)} is not a tag (letters, digits, '_', '.', '-'; at most 128, "
                                "not starting with '.' or '-')")
        first, slash, path = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
            if not _HOST.fullmatch(first):
                raise UserError(f"{what}: {describe(text)}: {describe(first)} is not a registry host[:port]")
            registry = first
        else:
            registry, path = "", name
        if not path or not _PATH.fullmatch(path):
            raise UserError(f"{what}: {describe(text)}: {describe(path)} is not a repository path (lowercase letters, digits and "
                            "'.', '_', '__', '-' between them, components joined by '/')")
        if len(name) > NAME_MAX:
            raise UserError(f"{what}: {describe(text)}: the name is longer than {NAME_MAX} characters")
        return cls(registry, path, tag, digest)

    # -- where it lives ---------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """REGISTRY/REPOSITORY as written, without tag or digest."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def api_host(self) -> str:
        """The host a registry client talks to."""
        return HUB_API if self.registry in ("", HUB, "index.docker.io") else self.registry

    @property
    def api_repository(self) -> str:
        """The repository as the registry's API names it (Docker Hub's official images under library/)."""
        if self.api_host == HUB_API and "/" not in self.repository:
            return f"library/{self.repository}"
        return self.repository

    @property
    def host(self) -> str:
        """The registry host as users and credentials name it (docker.io for Docker Hub)."""
        return self.registry or HUB

    @property
    def reference(self) -> str:
        """What the registry is asked for: the digest, else the tag, else `latest`."""
        return self.digest or self.tag or "latest"

    def same_repository(self, other: ImageRef) -> bool:
        """Both name one repository of one registry (Docker Hub's spellings made equal)."""
        return (self.api_host, self.api_repository) == (other.api_host, other.api_repository)

    # -- derived references ---------------------------------------------------------------------------------
    def with_digest(self, digest: str) -> ImageRef:
        """NAME@DIGEST: this image pinned to `digest` (the tag dropped: a digest says everything)."""
        return dataclasses.replace(self, tag="", digest=digest)

    def with_tag(self, tag: str) -> ImageRef:
        return dataclasses.replace(self, tag=tag, digest="")

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")
