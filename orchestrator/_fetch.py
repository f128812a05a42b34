"""Fetching a URL for the ACP registry: the registry file itself and binary agents' archives.

One rule for every URL and every redirect hop: ``https://`` anywhere, ``http://`` only to this
machine (``localhost``, ``127.0.0.1``, ``::1``); ``file://`` only where the caller allows it
(an archive named by a local registry file), never as a redirect target; a URL holding a user
name or password is refused (none is ever sent). A redirect is checked before it is followed
(at most :data:`MAX_REDIRECTS` of them), so a local server cannot hand the fetch on to a
plain-HTTP host elsewhere. A fetch has a total deadline, not only a per-read
timeout, so a server that trickles bytes cannot hold it for ever, and a size cap. Errors never
show a URL's user name or password (:func:`redact`).

Blocking: callers in async code run :func:`fetch` in a thread they may abandon.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import OrchestratorError

if TYPE_CHECKING:
    import urllib.request

__all__ = [
    "LOCAL_HOSTS",
    "MAX_REDIRECTS",
    "OFFICIAL_REGISTRY_URL",
    "check_url",
    "fetch",
    "redact",
    "url_problem",
]

#: where the ACP registry publishes each build (a release asset of its repository); here, not
#: in :mod:`orchestrator.registry`, so that the command line's help names it without importing
#: more
OFFICIAL_REGISTRY_URL = (
    "https://github.com/agentclientprotocol/registry/releases/latest/download/registry.json"
)

#: the hosts plain ``http://`` may name
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
#: redirects followed, each checked like the first URL
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


def redact(url: str) -> str:
    """``url`` without its user name and password (``https://***@host/...``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<an unparsable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def url_problem(url: str, *, allow_file: bool = False) -> str | None:
    """Why ``url`` may not be fetched (None when it may): the scheme/host rule above."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError:
        return f"{redact(url)} is not a valid URL"
    if parts.scheme in ("http", "https") and "@" in parts.netloc:
        # urllib would take the user name and password for part of the host name; and sent
        # as Basic auth they would follow a redirect to another host: refused, never sent
        return (
            f"{redact(url)} is not allowed: a URL must not carry credentials"
            " (save the file and name it instead)"
        )
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and host in LOCAL_HOSTS:
        return None
    if parts.scheme == "file" and allow_file:
        return None
    allowed = "https://, http:// only to localhost" + (", or file://" if allow_file else "")
    return f"{redact(url)} is not allowed: a URL must be {allowed}"


def check_url(url: str, error: type[OrchestratorError], *, allow_file: bool = False) -> None:
    """Raise ``error`` when :func:`url_problem` finds one."""
    problem = url_problem(url, allow_file=allow_file)
    if problem is not None:
        raise error(problem)


def _opener(allow_file: bool) -> urllib.request.OpenerDirector:
    """An opener for http(s) (and ``file`` if allowed) whose redirects obey the rule."""
    import urllib.error
    import urllib.request
    from http.client import HTTPMessage
    from typing import IO

    class CheckedRedirects(urllib.request.HTTPRedirectHandler):
        max_redirections = MAX_REDIRECTS
        max_repeats = 1

        def redirect_request(
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: HTTPMessage,
            newurl: str,
        ) -> urllib.request.Request | None:
            problem = url_problem(newurl)
            if problem is not None:
                raise _Refused(f"redirected to {problem}")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

        def http_error_302(  # urllib's loop/limit error spans lines: make it one
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: HTTPMessage,
        ) -> Any:
            # urllib refuses a scheme it does not follow (file://) with an HTTPError of this
            # code before redirect_request sees it: the rule's refusal comes first
            location = headers.get("location") or headers.get("uri")
            if location is not None:
                problem = url_problem(urllib.parse.urljoin(req.full_url, location))
                if problem is not None:
                    raise _Refused(f"redirected to {problem}")
            try:
                return super().http_error_302(req, fp, code, msg, headers)
            except urllib.error.HTTPError as e:
                if e.code in (301, 302, 303, 307, 308):
                    raise _Refused(
                        f"more than {MAX_REDIRECTS} redirects, or a redirect loop"
                    ) from e
                raise

        http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    opener = urllib.request.OpenerDirector()
    handlers: list[urllib.request.BaseHandler] = [
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        CheckedRedirects(),
    ]
    if allow_file:
        handlers.append(urllib.request.FileHandler())
    for handler in handlers:
        opener.add_handler(handler)
    return opener


class _Refused(OSError):
    """A redirect hop the rule refuses (raised inside urllib, turned into the caller's error)."""


def fetch(
    url: str,
    sink: Callable[[bytes], None],
    *,
    error: type[OrchestratorError],
    what: str,
    deadline: float,
    max_bytes: int,
    allow_file: bool = False,
) -> None:
    """Fetch ``url`` within ``deadline`` seconds in all, passing its bytes to ``sink``.

    ``error`` (naming ``what``, in one line) when the URL or a redirect breaks the rule, the
    fetch fails, takes longer than ``deadline`` or passes ``max_bytes``.
    """
    check_url(url, error, allow_file=allow_file)
    shown = redact(url)
    ends = time.monotonic() + deadline
    import urllib.request

    request = urllib.request.Request(url, headers={"User-Agent": "acp-orchestrator"})
    size = 0
    try:
        with _opener(allow_file).open(request, timeout=deadline) as response:
            while True:
                left = ends - time.monotonic()
                if left <= 0:
                    raise error(f"cannot fetch {what} {shown}: not done within {deadline:g} s")
                _limit_read(response, left)
                chunk = (
                    response.read1(_CHUNK) if hasattr(response, "read1") else response.read(_CHUNK)
                )
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise error(f"{what} {shown} is larger than {max_bytes} bytes: refused")
                sink(chunk)
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
            # every wait is bounded by what is left of the deadline: it has passed
            raise error(f"cannot fetch {what} {shown}: not done within {deadline:g} s") from e
        raise error(f"cannot fetch {what} {shown}: {_reason(e)}") from e


def _limit_read(response: Any, seconds: float) -> None:
    """Make the next read of ``response`` wait at most ``seconds`` (the deadline's rest)."""
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.01))


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    if isinstance(error, _Refused):
        text = str(error)
    else:
        text = str(reason if reason is not None else error)
    if isinstance(reason, TimeoutError) or isinstance(error, TimeoutError):
        text = "timed out"
    # urllib's texts may quote the URL (with its credentials) or span lines
    return " ".join(_scrub(text).split())


def _scrub(text: str) -> str:
    words = []
    for word in text.split(" "):
        words.append(redact(word) if "://" in word else word)
    return " ".join(words)
