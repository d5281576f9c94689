"""The bounds of every answer builder reads from a remote (a registry, an index, a download), in one place.

- one deadline per request (`Deadline`), connect to last byte: BUILDER_REMOTE_TIMEOUT seconds (default 60;
  connect at most 5 s of it), plus, for an upload or a download, 4 s per MiB it carries (SLOWEST_RATE); a
  watchdog shuts the request's sockets down when it passes, so no read or write of any library can outlast it
  (a remote that drips one byte a second is stopped like one that says nothing); the same bound for the
  programs that talk to a remote for builder (twine, skopeo: `subprocess_seconds`);
- a size cap, enforced while the body streams (a Content-Length above it is refused before reading):
  BUILDER_REMOTE_MAX_BYTES (default 64 MiB) for a document, which is held in memory, and for a download
  (streamed to disk) the size the manifest records, else BUILDER_REMOTE_MAX_DOWNLOAD_BYTES (default 16 GiB);
- messages name the remote with its secrets redacted (`redact`: a URL's user:password@ and query values, the
  secret variables' values), before anything cuts a value short (redact.describe).

And how builder talks to a remote at all: the HTTP sessions (`with_timeouts`: every request bounded as above),
urllib's (`urlopen`, lock's index reader and doctor), the errors that mean a remote does not answer
(`NETWORK_ERRORS`), which hosts are this machine (`is_loopback`: plain HTTP and no TLS check there), and the
credentials, read, never written: a registry's from BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD, else from
the docker login of its host (DOCKER_CONFIG/config.json or ~/.docker/config.json: `auths`, `credHelpers`,
`credsStore`, checked as docker reads the file: `_docker_config`); an index's from
BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD (else ~/.netrc, as requests reads it). Streamed downloads are
`stream_into` (pinned ones: builder/download.py).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import os
import re
import contextlib
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Iterator

from . import redact as redact_mod
from .errors import EnvironmentProblem, UserError
from .redact import redact

CHUNK = 1 << 20
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 86400.0
DEFAULT_DOCUMENT_BYTES = 64 << 20
DEFAULT_DOWNLOAD_BYTES = 16 << 30
CONNECT_TIMEOUT = 5.0
SLOWEST_RATE = 256 << 10  # bytes/s an upload or download may take: what its size adds to its deadline

def _number(var: str, default: float, low: float, high: float, integer: bool = False) -> float:
    raw = os.environ.get(var)
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise UserError(f"{var}: {raw!r} is not a {'whole number' if integer else 'number'}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise UserError(f"{var}: {raw!r} must be a finite number from {low:g} to {high:g}")
    return value


def timeouts() -> tuple[float, float]:
    """(connect, read) seconds for every request to a remote."""
    read = _number("BUILDER_REMOTE_TIMEOUT", DEFAULT_TIMEOUT, 0.001, MAX_TIMEOUT)
    return (min(5.0, read), read)


def document_limit() -> int:
    return int(_number("BUILDER_REMOTE_MAX_BYTES", DEFAULT_DOCUMENT_BYTES, 1024, 1 << 40, integer=True))


def download_limit() -> int:
    return int(_number("BUILDER_REMOTE_MAX_DOWNLOAD_BYTES", DEFAULT_DOWNLOAD_BYTES, 1024, 1 << 50, integer=True))


def check_environment() -> None:
    """Refuse a bad BUILDER_REMOTE_* value up front (exit 2), before any work."""
    timeouts()
    document_limit()
    download_limit()
    bound_registry_host()


class TooLarge(EnvironmentProblem):
    """A remote answered more than its cap."""


class TooSlow(EnvironmentProblem):
    """A remote drips a document slower than the timeout allows."""


def _declared(headers) -> int | None:
    try:
        return int(headers.get("Content-Length", ""))
    except (TypeError, ValueError):
        return None


# -- one deadline per request ------------------------------------------------------------------------------
_OWNERS: "weakref.WeakKeyDictionary[socket.socket, Deadline]" = weakref.WeakKeyDictionary()
_OWNERS_LOCK = threading.Lock()
_ACTIVE = threading.local()  # the deadline of the request this thread is sending (connections register with it)


def transfer_seconds(size: int) -> float:
    """What `size` bytes of an upload or a download add to a deadline (at the slowest rate allowed)."""
    return max(0, size) / SLOWEST_RATE


def subprocess_seconds(size: int = 0, requests: int = 1) -> float:
    """The bound for a program that makes `requests` requests to a remote for builder (twine, skopeo) moving
    `size` bytes: each request's deadline, plus the program's own start."""
    return requests * timeouts()[1] + transfer_seconds(size) + 30


class Deadline:
    """The one deadline of a request: connect, headers, upload and body, every byte. A watchdog (a timer
    thread) shuts down the sockets the request uses when it passes: a blocked read or write then returns at
    once, whichever library is doing it, and the reader raises TooSlow naming the remote (`error`)."""

    def __init__(self, what: str, seconds: float | None = None):
        self.what = what
        self.seconds = timeouts()[1] if seconds is None else seconds
        self.end = time.monotonic() + self.seconds
        self.fired = False
        self._socks: list[weakref.ref] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(max(0.0, self.end - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def extend(self, seconds: float) -> None:
        """More time for a body whose size is known only once its headers came (a download)."""
        if seconds > 0 and not self.fired:
            self.seconds += seconds
            self.end += seconds
            self._arm()

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.fired or time.monotonic() >= self.end

    def watch(self, sock) -> None:
        """`sock` carries this request (a pooled connection moves to the request that uses it next)."""
        with _OWNERS_LOCK:
            _OWNERS[sock] = self
        with self._lock:
            self._socks.append(weakref.ref(sock))
            fired = self.fired
        if fired:
            _shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            socks = [r() for r in self._socks]
        for sock in socks:
            if sock is not None:
                with _OWNERS_LOCK:
                    mine = _OWNERS.get(sock) is self
                if mine:
                    _shutdown(sock)

    def done(self) -> None:
        """The answer was read (or given up on): the watchdog stands down."""
        if self._timer is not None:
            self._timer.cancel()

    def error(self, what: str | None = None) -> "TooSlow":
        return _too_slow(self.what if what is None else what, self.seconds)

    @contextlib.contextmanager
    def active(self) -> Iterator["Deadline"]:
        """Connections opened or reused in this block (this thread) are watched by this deadline; an error they
        raise once it has passed is TooSlow."""
        previous = getattr(_ACTIVE, "deadline", None)
        _ACTIVE.deadline = self
        try:
            yield self
        except (TooSlow, TooLarge):
            raise
        except Exception:
            if self.expired:
                raise self.error() from None
            raise
        finally:
            _ACTIVE.deadline = previous


def _too_slow(what: str, seconds: float) -> "TooSlow":
    extra = f", plus {transfer_seconds(1 << 20):g} s per MiB moved" if seconds > timeouts()[1] + 1e-6 else ""
    shown = f"{seconds:.1f}".removesuffix(".0")
    return TooSlow(f"{redact(what)} did not answer within {shown} s (BUILDER_REMOTE_TIMEOUT{extra}); stopped")


def _shutdown(sock) -> None:
    try:  # socket.socket's own shutdown, also for a TLS socket (ssl's would drop its state under the reader)
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, ValueError, TypeError):
        pass


def _watch(sock) -> None:
    deadline = getattr(_ACTIVE, "deadline", None)
    if deadline is not None and sock is not None:
        deadline.watch(sock)


def _deadline_of(resp) -> "Deadline | None":
    return getattr(resp, "deadline", None)


def _bounded(blocks: Iterator[bytes], resp, what: str, limit: int, caps: str, end: float | None) -> Iterator[bytes]:
    """`blocks` of a response body, stopped (TooLarge / TooSlow, naming `what`) as soon as they pass `limit` bytes
    or the request's deadline: its watchdog's (the sessions `with_timeouts` makes, `urlopen`), else `end` (a
    time.monotonic()). `caps`: the variables that set the cap, for the message."""
    declared = _declared(resp.headers)
    watchdog = _deadline_of(resp)
    if declared is not None and declared > limit:
        if watchdog is not None:
            watchdog.done()
        raise TooLarge(f"{redact(what)} announces {declared} bytes, more than the {limit}-byte cap ({caps}); not read")

    def too_slow() -> TooSlow:
        return _too_slow(what, watchdog.seconds if watchdog is not None else timeouts()[1])

    def late() -> bool:
        return watchdog.expired if watchdog is not None else end is not None and time.monotonic() > end

    size = 0
    try:
        for block in blocks:
            size += len(block)
            if size > limit:
                raise TooLarge(f"{redact(what)} sent more than {limit} bytes (the cap: {caps}); stopped reading")
            if late():
                raise too_slow()
            yield block
        if watchdog is not None and watchdog.fired:  # a body read to the connection's close looks whole when cut
            raise too_slow()
    except (TooSlow, TooLarge):
        raise
    except Exception:
        if late():
            raise too_slow() from None
        raise
    finally:
        if watchdog is not None:
            watchdog.done()


def chunks(resp, what: str, limit: int, deadline: float | None = None) -> Iterator[bytes]:
    """The body of a streamed `requests` response in chunks, stopped (TooLarge / TooSlow, naming `what`) as
    soon as it passes `limit` bytes or its request's deadline (the response's `deadline`, set by the session
    `with_timeouts` made; `deadline`: a time.monotonic() for a response of another session)."""
    return _bounded(resp.iter_content(chunk_size=CHUNK), resp, what, limit,
                    "BUILDER_REMOTE_MAX_BYTES / BUILDER_REMOTE_MAX_DOWNLOAD_BYTES", deadline)


def read_document(resp, what: str, limit: int | None = None) -> bytes:
    """A whole (small) body of a streamed `requests` response: capped and within its request's deadline."""
    deadline = time.monotonic() + timeouts()[1]
    return b"".join(chunks(resp, what, document_limit() if limit is None else limit, deadline))


def read_urllib(resp, what: str, limit: int | None = None) -> bytes:
    """The same for a urllib response (`urlopen` below: lock's index reader, doctor)."""
    read = resp.read1 if hasattr(resp, "read1") else resp.read
    return b"".join(_bounded(iter(lambda: read(CHUNK), b""), resp, what, document_limit() if limit is None else limit,
                             "BUILDER_REMOTE_MAX_BYTES", time.monotonic() + timeouts()[1]))


def stream_into(resp, part: Path, what: str = "the download", limit: int | None = None) -> tuple[str, int]:
    """Write a streamed response body into `part`: (sha256 hex, bytes); at most `limit` bytes (default: the
    download cap). Its request's deadline grows by what the body may carry (its Content-Length, else `limit`)."""
    limit = download_limit() if limit is None else limit
    watchdog = _deadline_of(resp)
    if watchdog is not None:
        declared = _declared(resp.headers)
        watchdog.extend(transfer_seconds(min(limit, declared) if declared is not None and declared >= 0 else limit))
    h, size = hashlib.sha256(), 0
    with open(part, "wb") as fh:
        for chunk in chunks(resp, what, limit):
            h.update(chunk)
            size += len(chunk)
            fh.write(chunk)
    return h.hexdigest(), size


def speaks_registry_api(headers, body: bytes) -> bool:
    """Whether an answer to GET /v2/ comes from an OCI distribution registry: its API version header, or the
    JSON object the spec's endpoint answers with (random bytes with HTTP 200 are not a registry)."""
    if (headers.get("Docker-Distribution-API-Version") or "").lower().startswith("registry/2"):
        return True
    try:
        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return False


# -- HTTP clients ----------------------------------------------------------------------------------------
def _body_size(body, headers=None) -> int:
    """The bytes an upload sends: its Content-Length, else the size of a file, bytes or a string (0 when unknown:
    a generator gets no extra time)."""
    declared = _declared(headers or {})
    if declared is not None:
        return max(0, declared)
    if body is None:
        return 0
    if isinstance(getattr(body, "len", None), int):  # requests-toolbelt's multipart encoder (twine's uploads)
        return body.len
    if isinstance(body, (bytes, bytearray, str)):
        return len(body)
    try:
        return os.fstat(body.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return 0


def _watched_connections():
    """urllib3's connection classes, each registering its socket with the deadline of the request it carries
    (on connect, the plain socket and then the TLS one; on reuse, at every request)."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Watched:
        def _new_conn(self):
            sock = super()._new_conn()
            _watch(sock)
            return sock

        def connect(self):
            super().connect()
            _watch(self.sock)

        def request(self, *args, **kwargs):
            _watch(self.sock)
            return super().request(*args, **kwargs)

    class WatchedHTTP(Watched, HTTPConnection):
        pass

    class WatchedHTTPS(Watched, HTTPSConnection):
        pass

    class Pool(HTTPConnectionPool):
        ConnectionCls = WatchedHTTP

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPS

    return {"http": Pool, "https": TLSPool}


def _timeout_adapter():
    """The HTTPAdapter every session to a remote uses (requests is imported only by verbs that talk to one)."""
    from requests.adapters import HTTPAdapter

    pools = _watched_connections()

    class TimeoutAdapter(HTTPAdapter):
        """Every request gets its deadline (connect, headers, upload, body: `Deadline`), carried by the response
        to the reader of its body (`chunks`). And every answer read whole (not streamed: oras' own requests,
        token endpoints) is read here under the document cap, before requests would buffer it without limit."""

        def __init__(self, timeout: tuple[float, float]):
            super().__init__()
            self._timeout = timeout

        def init_poolmanager(self, *args, **kwargs):
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy, **kwargs):
            manager = super().proxy_manager_for(proxy, **kwargs)
            manager.pool_classes_by_scheme = pools
            return manager

        def send(self, request, **kwargs):
            what = f"{request.method} {request.url}"
            deadline = Deadline(what, self._timeout[1] + transfer_seconds(_body_size(request.body, request.headers)))
            connect, read = self._timeout
            kwargs["timeout"] = (min(connect, deadline.remaining() or 0.001), read)
            try:
                with deadline.active():
                    resp = super().send(request, **kwargs)
            except BaseException:
                deadline.done()
                raise
            resp.deadline = deadline
            if not kwargs.get("stream"):
                try:
                    resp._content = read_document(resp, what)
                finally:
                    resp.close()
                resp._content_consumed = True
            return resp

    return TimeoutAdapter


def with_timeouts(session):
    """`session` (a requests.Session) with every request bounded: one deadline, and a whole answer under the cap."""
    adapter = _timeout_adapter()(timeouts())
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def without_netrc(session):
    """`session` sending no ~/.netrc credentials (requests would add them to every request without its own auth,
    and to a redirect's): a registry's credentials come from registry_credentials and go only where asked."""
    import requests

    class _Nothing(requests.auth.AuthBase):
        def __call__(self, r):
            return r

    session.auth = _Nothing()  # requests consults ~/.netrc only when neither the request nor the session has auth
    strip = session.rebuild_auth

    def rebuild_auth(prepared, response):
        trust, session.trust_env = session.trust_env, False
        try:
            strip(prepared, response)  # drops Authorization on a redirect to another host, adds nothing
        finally:
            session.trust_env = trust

    session.rebuild_auth = rebuild_auth
    return session


def bounded_twine(argv: list[str]) -> int:
    """twine's command line with every request of its session under `with_timeouts` (twine sets no timeout:
    an index that drips its answer to an upload would hold it forever). For `python -c` (IndexStore)."""
    import twine.repository
    from twine.__main__ import main as twine_main

    made = twine.repository.make_requests_session
    twine.repository.make_requests_session = lambda: with_timeouts(made())
    sys.argv = ["twine", *argv]
    try:
        return twine_main()
    except (TooSlow, TooLarge) as exc:
        print(f"{TWINE_STOPPED}{exc}", file=sys.stderr)
        return 3


TWINE_STOPPED = "builder stopped the upload: "


def _watched_urllib_handlers(context):
    import http.client
    import urllib.request

    def connect(conn, parent) -> None:
        read = conn.timeout
        conn.timeout = min(CONNECT_TIMEOUT, read) if isinstance(read, (int, float)) else read
        create = conn._create_connection

        def create_watched(*args, **kwargs):
            sock = create(*args, **kwargs)
            _watch(sock)
            return sock

        conn._create_connection = create_watched
        try:
            parent.connect(conn)
        finally:
            conn.timeout = read
        if conn.sock is not None and isinstance(read, (int, float)):
            conn.sock.settimeout(read)
        _watch(conn.sock)

    class WatchedHTTP(http.client.HTTPConnection):
        def connect(self):
            connect(self, http.client.HTTPConnection)

    class WatchedHTTPS(http.client.HTTPSConnection):
        def connect(self):
            connect(self, http.client.HTTPSConnection)

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(WatchedHTTP, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(WatchedHTTPS, req, context=self._context)

    return HTTPHandler(), HTTPSHandler(context=context)


def urlopen(req, what: str | None = None, context=None, timeout: float | None = None):
    """urllib's urlopen under one deadline for the whole request, redirects included: the response (or the
    HTTPError raised) carries it to `read_urllib`, which reads the body under it."""
    import urllib.error
    import urllib.request

    url = req.full_url if isinstance(req, urllib.request.Request) else req
    deadline = Deadline(what or url, timeout)
    opener = urllib.request.build_opener(*_watched_urllib_handlers(context))
    try:
        with deadline.active():
            resp = opener.open(req, timeout=deadline.seconds)
    except urllib.error.HTTPError as exc:
        exc.deadline = deadline
        raise
    except BaseException:
        deadline.done()
        raise
    resp.deadline = deadline
    return resp


def __getattr__(name: str):
    """NETWORK_ERRORS (what a request raises when the remote does not answer), made on first use: importing
    requests costs a third of a second that plan, render and every refusal of bad input need not pay."""
    if name == "NETWORK_ERRORS":
        import requests

        value = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                 requests.exceptions.ContentDecodingError, requests.TooManyRedirects)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- loopback hosts --------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether a registry host is this machine: `localhost`, `127.0.0.1`, `[::1]`, each with or without :PORT."""
    if host.startswith("["):  # [v6] or [v6]:port
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # name:port or v4:port (a bare v6 address has more colons)
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- credentials -----------------------------------------------------------------------------------------
def _env_pair(user_var: str, password_var: str) -> tuple[str, str] | None:
    user, password = os.environ.get(user_var), os.environ.get(password_var)
    if bool(user) != bool(password):
        missing = password_var if user else user_var
        raise UserError(f"{missing} is not set but {user_var if user else password_var} is: set both or neither")
    return (user, password) if user else None


def docker_config_path() -> Path:
    return Path(os.environ["DOCKER_CONFIG"]) / "config.json" if os.environ.get("DOCKER_CONFIG") \
        else Path.home() / ".docker" / "config.json"


_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_CONFIG_MAX_BYTES = 16 << 20


HELPER_SECONDS = 30  # what a credential helper may take to answer
HELPER_MAX_BYTES = 256 << 10  # what builder reads of its output and of its errors: its JSON answer is a few hundred bytes
# what a helper says when it holds nothing for the host (docker-credential-helpers' ErrCredentialsNotFound)
_HELPER_NOT_FOUND = "credentials not found"


def _run_helper(argv: list[str], stdin: bytes) -> tuple[int | None, bytes, bytes]:
    """Run a credential helper: (exit code, stdout, stderr), each stream read up to HELPER_MAX_BYTES. The exit code
    is None when it printed more (it is killed then: nothing past the cap is read, however much it prints);
    subprocess.TimeoutExpired past HELPER_SECONDS (killed too)."""
    import selectors

    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + HELPER_SECONDS
    try:
        with contextlib.suppress(BrokenPipeError):  # one that does not read its input: its answer says the rest
            try:
                proc.stdin.write(stdin)
            finally:
                proc.stdin.close()
        with selectors.DefaultSelector() as sel:
            for stream in (proc.stdout, proc.stderr):
                sel.register(stream, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, HELPER_SECONDS)
                for key, _ in sel.select(left):
                    block = os.read(key.fd, 1 << 16)
                    if not block:
                        sel.unregister(key.fileobj)
                        continue
                    out[key.fd] += block
                    if len(out[key.fd]) > HELPER_MAX_BYTES:
                        return None, b"", b""
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(argv, HELPER_SECONDS) from None
        return code, bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()


def _credential_helper(helper: str, host: str, path: Path, key: str) -> tuple[str, str] | None:
    """`docker-credential-HELPER get` for host: (user, secret), None when it holds nothing for host;
    EnvironmentProblem when the helper is missing or fails (docker itself would fail the same way), in one line.

    What it prints is read up to HELPER_MAX_BYTES (more is refused: its answer is a small JSON object) and never
    quoted: a helper's error text can hold the very secret it guards ("cannot unlock the keychain for <password>").
    Only its one known phrase is recognised: "credentials not found" (it holds nothing for the host)."""
    where = f"docker-credential-{helper} ({key} of {path})"
    try:
        code, stdout, stderr = _run_helper([f"docker-credential-{helper}", "get"], host.encode())
    except FileNotFoundError:
        raise EnvironmentProblem(f"{where} is not installed: install it, or remove {key} from {path}") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{where} did not answer within {HELPER_SECONDS} s") from None
    except OSError as exc:
        raise EnvironmentProblem(f"{where} cannot run ({exc.strerror or exc})") from None
    if code is None:
        raise EnvironmentProblem(f"{where} printed more than {HELPER_MAX_BYTES >> 10} KiB (a credential helper answers "
                                 "a small JSON object); refused, nothing of it read further")
    if code != 0:
        said = (stdout + stderr).decode("utf-8", "replace").lower()
        if _HELPER_NOT_FOUND in said:
            return None
        raise EnvironmentProblem(f"{where} failed (exit {code}); its message is withheld (a credential helper's words "
                                 f"can hold the secret it guards): run `docker-credential-{helper} get` to read it")
    try:
        data = json.loads(stdout.decode("utf-8"))
    except (ValueError, RecursionError):
        raise EnvironmentProblem(f"{where} answered no JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("Secret", ""), str) \
            or not isinstance(data.get("Username", ""), str):
        raise EnvironmentProblem(f"{where} answered no {{\"Username\": ..., \"Secret\": ...}} object")
    return (data.get("Username", ""), data["Secret"]) if data.get("Secret") else None


_JSON_NOUNS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}


def _docker_config(path: Path) -> dict | None:
    """docker's config.json, checked as docker reads it: None when there is none. What it holds wrong (not JSON,
    not an object, odd auths / credHelpers / credsStore) is UserError (exit 2) naming the file and the key; a
    file that cannot be read (a directory, a FIFO, no permission, an I/O error) EnvironmentProblem (exit 3)."""
    import stat

    def cannot(why: str) -> EnvironmentProblem:
        return EnvironmentProblem(f"{path}: cannot read the docker credentials ({why}); fix it or point DOCKER_CONFIG "
                                  "at another directory")

    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise cannot(exc.strerror or str(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise cannot("it is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise cannot("it is not a regular file")
    if st.st_size > _CONFIG_MAX_BYTES:
        raise UserError(f"{path}: {st.st_size} bytes, more than a docker config.json holds ({_CONFIG_MAX_BYTES >> 20} MiB)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise cannot(exc.strerror or str(exc)) from None

    def bad(why: str) -> UserError:
        return UserError(f"{path}: {why} (docker's config.json, read for the registry credentials)")

    try:
        cfg = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad("not UTF-8 text") from None
    except RecursionError:
        raise bad("JSON nested too deeply") from None
    except ValueError as exc:
        raise bad(f"not JSON ({getattr(exc, 'msg', exc)} at line {getattr(exc, 'lineno', '?')} column "
                  f"{getattr(exc, 'colno', '?')})") from None
    if not isinstance(cfg, dict):
        raise bad(f"a JSON object expected, got {_JSON_NOUNS.get(type(cfg), type(cfg).__name__)}")
    for key in ("auths", "credHelpers"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise bad(f"{key} must be an object, got {_JSON_NOUNS.get(type(cfg[key]), type(cfg[key]).__name__)}")
    for name, entry in (cfg.get("auths") or {}).items():
        if not isinstance(entry, dict):
            raise bad(f"auths.{redact(name)[:100]} must be an object, got {_JSON_NOUNS.get(type(entry), type(entry).__name__)}")
        for field in ("auth", "username", "password", "identitytoken"):
            if entry.get(field) is not None and not isinstance(entry[field], str):
                raise bad(f"auths.{redact(name)[:100]}.{field} must be a string")
    for name, helper in (cfg.get("credHelpers") or {}).items():
        if not isinstance(helper, str) or not _HELPER_NAME.fullmatch(helper):
            raise bad(f"credHelpers.{redact(name)[:100]} must name a credential helper (letters, digits, '.', '_', '-')")
    store = cfg.get("credsStore")
    if store is not None and (not isinstance(store, str) or (store and not _HELPER_NAME.fullmatch(store))):
        raise bad("credsStore must name a credential helper (letters, digits, '.', '_', '-')")
    return cfg


_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}
_REGISTRY_HOST = re.compile(r"(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)(?::[0-9]{1,5})?")


def same_host(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or (a in _DOCKER_HUB and b in _DOCKER_HUB)


def bound_registry_host() -> str | None:
    """BUILDER_REGISTRY_HOST: the one registry host BUILDER_REGISTRY_USER / _PASSWORD are for, when set (HOST[:PORT],
    checked: a bad value is refused, exit 2)."""
    value = os.environ.get("BUILDER_REGISTRY_HOST")
    if value is None or value == "":
        return None
    port = value.rpartition(":")[2] if _REGISTRY_HOST.fullmatch(value) and not value.endswith("]") else ""
    if not _REGISTRY_HOST.fullmatch(value) or (port.isdigit() and ":" in value and not 0 < int(port) < 65536):
        raise UserError(f"BUILDER_REGISTRY_HOST: {redact(value)[:80]!r} is not a registry host (HOST[:PORT], port 1-65535, "
                        "e.g. ghcr.io or 127.0.0.1:5000)")
    return value


def env_credentials_apply(host: str, given: bool) -> bool:
    """Whether BUILDER_REGISTRY_USER / _PASSWORD are for `host`: they are bound to one registry host, never sent
    anywhere else. That host is BUILDER_REGISTRY_HOST when set; else a registry the command was given as its own
    (`given`: the matrix's defaults.registry, publish's --registry, the wheel cache's registry remote, a
    --reuse-from on the matrix's registry host). An image named to serve, smoke, bench or doctor --host, a base
    image, or a --reuse-from on another host gets them only when BUILDER_REGISTRY_HOST names its host."""
    bound = bound_registry_host()
    return same_host(host, bound) if bound is not None else given


def registry_credentials(host: str, given: bool = False) -> tuple[tuple[str, str] | None, str]:
    """(user, password) for a registry host, or None; and where they came from (for messages, never the secret):
    BUILDER_REGISTRY_USER / _PASSWORD where they apply to this host (`env_credentials_apply`), else the docker
    login of this very host. Whoever holds them sends nothing before the host asks (a 401): registry_api.Client."""
    env = _env_pair("BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD")
    if env and env_credentials_apply(host, given):
        return env, "BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD"
    path = docker_config_path()
    cfg = _docker_config(path)
    if cfg is None:
        return None, ""
    names = [host, f"http://{host}", f"https://{host}", f"https://{host}/v1/", f"http://{host}/v2/", f"https://{host}/v2/"]
    auths = cfg.get("auths") or {}
    for name in names:
        entry = auths.get(name)
        if entry is None:
            continue
        if entry.get("auth"):
            try:
                decoded = base64.b64decode("".join(entry["auth"].split()), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise UserError(f"{path}: auths.{name}.auth is not base64 of user:password") from None
            user, colon, password = decoded.partition(":")
            if not colon or not user:
                raise UserError(f"{path}: auths.{name}.auth decodes to no user:password (no ':' or no user)")
            redact_mod.remember(password)
            return (user, password), f"docker login ({path})"
        if entry.get("username") and entry.get("password"):
            redact_mod.remember(entry["password"])
            return (entry["username"], entry["password"]), f"docker login ({path})"
    helpers = cfg.get("credHelpers") or {}
    key = f"credHelpers.{host}" if helpers.get(host) else "credsStore"
    helper = helpers.get(host) or cfg.get("credsStore")
    if helper:
        found = _credential_helper(helper, host, path, key)
        if found:
            redact_mod.remember(found[1])
            return found, f"docker-credential-{helper}"
    return None, ""


def index_credentials() -> tuple[str, str] | None:
    return _env_pair("BUILDER_INDEX_USER", "BUILDER_INDEX_PASSWORD")
