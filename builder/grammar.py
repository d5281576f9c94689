"""The grammar of every string that reaches a Dockerfile or a command line: image references, URLs, registry
hosts, OS tags, versions, names, paths. Values are checked by these rules when they are read (matrix.toml,
matrix.lock, knowledge files, CLI options), before anything is rendered or run; what is rendered is then
quoted as well (templates.py), so a value that slipped past a check still cannot start a new instruction.

Each check returns the value or raises ValueError saying why; `check()` turns that into a UserError naming
where the value came from.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import UserError
from .redact import describe

# -- OCI distribution reference grammar (distribution/reference/regexp.go) ---------------------------------
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|{_IPV6})"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
NAME_RE = re.compile(_NAME, re.ASCII)
_TAG_RE = re.compile(_TAG, re.ASCII)
_HOSTPORT_RE = re.compile(_DOMAIN, re.ASCII)
NAME_MAX = 255
REFERENCE_MAX = 1024  # a name of 255, a tag of 128 and a sha512 digest fit well within it
HOST_MAX = 259  # a host name is at most 253 characters, then :PORT

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def _no_control(value: str) -> None:
    m = _CONTROL.search(value)
    if m:
        what = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}.get(m.group(), "a control character")
        raise ValueError(f"contains {what}")


def _string(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"is {type(value).__name__}, not a string")
    return value


def image_name(value) -> str:
    """A repository name without tag or digest: [host[:port]/]path (lowercase path components)."""
    value = _string(value)
    _no_control(value)
    if len(value) > REFERENCE_MAX:  # before the grammar: it reads megabytes slowly
        raise ValueError(f"is longer than {NAME_MAX} characters")
    if not NAME_RE.fullmatch(value):
        raise ValueError("is not an image name like registry.example.com:5000/team/cuda (lowercase letters, digits, "
                         "'.', '_', '-' and '/' only)")
    if len(value) > NAME_MAX:
        raise ValueError(f"is longer than {NAME_MAX} characters")
    return value


def image_ref(value) -> str:
    """An image reference by the OCI distribution grammar: name[:tag][@digest]."""
    value = _string(value)
    _no_control(value)
    if len(value) > REFERENCE_MAX:  # before the grammar: it reads megabytes slowly
        raise ValueError(f"is longer than any image reference ({REFERENCE_MAX} characters)")
    m = _REFERENCE.fullmatch(value)
    if not m:
        raise ValueError("is not an image reference like nvidia/cuda:13.0.3-devel-ubuntu24.04 "
                         "(name[:tag][@sha256:...], lowercase name)")
    if len(m.group(1)) > NAME_MAX:
        raise ValueError(f"has a name longer than {NAME_MAX} characters")
    return value


def image_tag(value) -> str:
    value = _string(value)
    if not _TAG_RE.fullmatch(value):
        raise ValueError("is not an image tag (letters, digits, '_', '.', '-'; at most 128; no leading '.' or '-')")
    return value


def registry_host(value) -> str:
    """host[:port] of a registry, e.g. 127.0.0.1:5000 or registry.example.com."""
    value = _string(value)
    _no_control(value)
    if len(value) > HOST_MAX:
        raise ValueError(f"is longer than any registry host[:port] ({HOST_MAX} characters)")
    if not _HOSTPORT_RE.fullmatch(value):
        raise ValueError("is not a registry host[:port] like 127.0.0.1:5000")
    port = value.rsplit(":", 1)[1] if ":" in value and not value.endswith("]") else None
    if port is not None and not 0 < int(port) < 65536:
        raise ValueError(f"has port {port}, out of range")
    return value


def url(value, schemes: tuple[str, ...] = ("https", "http")) -> str:
    """An absolute URL with a host, no whitespace, quotes or shell metacharacters."""
    value = _string(value)
    _no_control(value)
    bad = sorted({c for c in value if c in " \"'`\\$<>{}|^"})
    if bad:
        raise ValueError(f"contains what no URL may contain: {' '.join(repr(c) for c in bad)}")
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in schemes:
        raise ValueError(f"is not a URL: the scheme must be {' or '.join(schemes)}, like https://pypi.org/simple")
    if not parts.hostname:
        raise ValueError("is not a URL: no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("is not a URL: bad port") from None
    if port == 0:
        raise ValueError("is not a URL: port 0")
    return value


def index_url(value) -> str:
    """A package index URL: a URL without user:password@ (it would reach Dockerfiles and logs; indexes take
    credentials from the environment) and without ?query or #fragment."""
    value = url(value)
    parts = urllib.parse.urlsplit(value)
    if parts.username is not None or parts.password is not None:
        raise ValueError("carries credentials: put none in an index URL (pip reads them from the environment "
                         "or ~/.netrc, builder's index cache from BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD)")
    if parts.query or parts.fragment:
        raise ValueError("is not an index URL: it takes no ?query or #fragment")
    return value


def git_url(value) -> str:
    """A URL git can fetch from: https/http/git/ssh/file, or an absolute local path."""
    value = _string(value)
    if value.startswith("/"):
        if not re.fullmatch(r"/[A-Za-z0-9._/+-]*", value, re.ASCII):
            raise ValueError("is not a git URL or absolute path (no spaces or shell characters)")
        return value
    if value.startswith("file://"):
        if not re.fullmatch(r"file:///[A-Za-z0-9._/+-]*", value, re.ASCII):
            raise ValueError("is not a file:// URL without spaces or shell characters")
        return value
    return url(value, ("https", "http", "git", "ssh"))


def os_tag(value) -> str:
    """The OS part of a base-image tag: ubuntu24.04, bookworm, ubi9."""
    value = _string(value)
    _no_control(value)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", value, re.ASCII):
        raise ValueError("is not an OS tag like ubuntu24.04 (lowercase letters, digits, '.', '_', '-')")
    return value


def python_version(value) -> str:
    value = _string(value)
    if not re.fullmatch(r"3\.[0-9]{1,2}", value, re.ASCII):
        raise ValueError("is not a Python version like 3.12")
    return value


def cuda_version(value) -> str:
    value = _string(value)
    if not re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,4})?", value, re.ASCII):
        raise ValueError("is not a CUDA version like 13.0.3")
    return value


def version(value) -> str:
    """A package version as written in an image tag and a pip pin: PEP 440, and only [0-9A-Za-z.+!_-]."""
    value = _string(value)
    _no_control(value)
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}", value, re.ASCII):
        raise ValueError("is not a version like 0.33.0")
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError("is not a version like 0.33.0") from None
    return value


def version_range(value) -> str:
    value = _string(value)
    _no_control(value)
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError('is not a version range like ">=3.11"') from None
    return value


def package_name(value) -> str:
    """A package name as builder uses it: in stage names, cell ids, image names and label keys."""
    value = _string(value)
    if not re.fullmatch(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", value, re.ASCII) or len(value) > 64:
        raise ValueError("is not a package name like flash-attn (lowercase letters, digits and single '-')")
    return value


def bundle_name(value) -> str:
    """A cell id or a GPU-host carry bundle's name (scripts/gpu-host/<name>.toml, .carry/<name>/, the store's
    <name>/): one path component, so no '/' and no '..', and nothing a shell would read."""
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", value, re.ASCII):
        raise ValueError("is not a name like vllm-0.26.0 (letters, digits, '.', '_', '+', '-'; no '/' or spaces)")
    return value


def pypi_name(value) -> str:
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", value, re.ASCII):
        raise ValueError("is not a PyPI project name")
    return value


def identifier(value) -> str:
    """An environment variable or CMake define name."""
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", value, re.ASCII):
        raise ValueError("is not a variable name like TORCH_CUDA_ARCH_LIST")
    return value


def token(value) -> str:
    """A word with no spaces or shell metacharacters: a git tag, a toolchain name."""
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+/{}:-]{0,127}", value, re.ASCII):
        raise ValueError("is not a plain word (letters, digits and . _ + / - only)")
    return value


def relative_path(value) -> str:
    """A path inside a source tree: relative, no '..', no spaces or shell metacharacters."""
    value = _string(value)
    if (not re.fullmatch(r"[A-Za-z0-9._/+-]{1,255}", value, re.ASCII) or value.startswith("/")
            or ".." in value.split("/")):
        raise ValueError("is not a relative path inside the source tree (no '..', no leading '/', no spaces)")
    return value


def subdir(value) -> str:
    """A directory of a source (relative to the matrix for local sources, so '..' is allowed)."""
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9._/+-]{1,255}", value, re.ASCII):
        raise ValueError("is not a directory path (letters, digits and . _ / + - only)")
    return value


def requirement(value) -> str:
    """A pip requirement written unquoted on a command line: name[extras]==version and the like, no spaces,
    no '<' or '>' (a shell would read them as redirections)."""
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],=!~]*", value, re.ASCII):
        raise ValueError("is not a requirement like cmake==3.31.6 (no spaces, quotes, '<', '>' or ';')")
    try:
        Requirement(value)
    except InvalidRequirement:
        raise ValueError("is not a requirement like cmake==3.31.6") from None
    return value


def line(value) -> str:
    """Free text rendered on one Dockerfile line (a comment, a command): no newline or control character."""
    value = _string(value)
    _no_control(value)
    if len(value) > 4096:
        raise ValueError("is longer than 4096 characters")
    return value


def quotable(value) -> str:
    """Text rendered inside single quotes in a shell command (a requirement, a sed literal)."""
    value = line(value)
    if "'" in value:
        raise ValueError("contains a single quote (') that would end the quoted shell word")
    return value


def double_quotable(value) -> str:
    """Text rendered inside double quotes in a Dockerfile (an ENV or LABEL value)."""
    value = line(value)
    if '"' in value or "\\" in value:
        raise ValueError('contains a double quote or a backslash that would end the quoted value')
    return value


def sha256(value) -> str:
    value = _string(value)
    if not re.fullmatch(r"[0-9a-f]{64}", value, re.ASCII):
        raise ValueError("is not a sha256 (64 lowercase hex digits)")
    return value


def commit(value) -> str:
    """A git commit id (40 hex digits; 64 for SHA-256 repositories), or "" while unresolved."""
    value = _string(value)
    if value and not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", value, re.ASCII):
        raise ValueError("is not a git commit (40 lowercase hex digits)")
    return value


def filename(value) -> str:
    value = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}", value, re.ASCII):
        raise ValueError("is not a plain file name")
    return value


def source_date_epoch(value) -> int:
    """A Unix timestamp in ASCII digits (or a TOML integer), 0 .. 253402300799 (year 9999)."""
    if isinstance(value, bool):
        raise ValueError("is not a Unix timestamp")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,12}", value, re.ASCII):
        n = int(value)
    else:
        raise ValueError("is not a Unix timestamp (ASCII digits, e.g. 1700000000)")
    if not 0 <= n <= 253402300799:
        raise ValueError("is out of range for a Unix timestamp")
    return n


def path_argument(value: str) -> str:
    """A path that reaches a command line: no control characters (a newline would split buildx's CSV options)."""
    _no_control(value)
    return value


def check(rule: Callable, value, where: str):
    """`rule(value)`, or a UserError naming `where`, the value and why it is refused."""
    try:
        return rule(value)
    except ValueError as exc:
        raise UserError(f"{where}: {describe(value)} {exc}") from None
