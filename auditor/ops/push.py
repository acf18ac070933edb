"""Upload the dashboards to a running Grafana through its HTTP API (the standard library's urllib).

The token (a Grafana service-account token with the Editor role) comes only from the environment
(``AUDITOR_GRAFANA_TOKEN``) or from a file (``--grafana-token-file`` /
``AUDITOR_GRAFANA_TOKEN_FILE``): never from a command-line value, which other users can read in
the process table. No message this module produces contains it, and errors never chain urllib's
exceptions, whose text is not ours to vouch for.

Steps: ``GET /api/health``, find the folder by title in ``GET /api/folders`` or create it with
``POST /api/folders``, then ``POST /api/dashboards/db`` with ``{dashboard, folderUid,
overwrite: true}`` for each dashboard.

No HTTP client package: the auditor is installed into users' training environments, and a client
package (grafana-client brought niquests, whose urllib3-future replaces the ``urllib3`` module
that requests, botocore and Ray import) would change them for the sake of one operator command.

Redirects are not followed but reported: urllib would send the token on to whatever host a
redirect names, and would turn a POST into a GET.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import IO, Any
from urllib.parse import urlsplit

from auditor import __version__

TOKEN_ENV = "AUDITOR_GRAFANA_TOKEN"
TOKEN_FILE_ENV = "AUDITOR_GRAFANA_TOKEN_FILE"
DEFAULT_FOLDER = "GPU Balance Auditor"
DEFAULT_TIMEOUT_S = 10.0
USER_AGENT = f"gpu-balance-auditor/{__version__}"
# Enough of an error body to say what went wrong; a proxy's HTML page is not worth more.
MAX_MESSAGE_CHARS = 200
BAD_TOKEN = (
    "the Grafana token holds spaces, line breaks or non-ASCII characters: a token is one word"
)


class PushError(Exception):
    """Grafana could not be reached or refused the upload; one line, never the token."""


class TokenError(ValueError):
    """No usable token was given; one line naming where a token may come from."""


@dataclass(frozen=True)
class Pushed:
    """One uploaded dashboard, as Grafana answered."""

    uid: str
    title: str
    url: str
    version: int | None
    status: str


def header_safe(token: str) -> bool:
    """Visible ASCII only: http.client refuses a line break in a header with an error that
    quotes the whole value, and a token is one word in any case."""
    return bool(token) and all(33 <= ord(c) <= 126 for c in token)


def read_token(token_file: str | None, env: Mapping[str, str]) -> str:
    """The token from ``token_file`` if given, else from ``AUDITOR_GRAFANA_TOKEN``."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            # The path is not repeated: a token pasted where the path goes stays unprinted.
            raise TokenError(
                f"cannot read the Grafana token file (--grafana-token-file / {TOKEN_FILE_ENV}): "
                f"{reason}"
            ) from None
        if not token:
            raise TokenError(
                f"the Grafana token file (--grafana-token-file / {TOKEN_FILE_ENV}) is empty"
            )
        if not header_safe(token):
            raise TokenError(f"{BAD_TOKEN} (--grafana-token-file / {TOKEN_FILE_ENV})")
        return token
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise TokenError(
            f"no Grafana token: set {TOKEN_ENV}, or put the token in a file and pass "
            f"--grafana-token-file PATH (or set {TOKEN_FILE_ENV})"
        )
    if not header_safe(token):
        raise TokenError(f"{BAD_TOKEN} ({TOKEN_ENV})")
    return token


def check_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]``, without credentials (they belong in the token)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http(s)://HOST[:PORT], got {url!r}")
    if parts.username or parts.password:
        raise ValueError(f"no credentials in the URL; use {TOKEN_ENV} or a token file")
    try:
        parts.port  # noqa: B018 -- raises on a malformed port
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    return url.rstrip("/")


# (request, timeout) -> an open response; tests may pass their own.
Opener = Callable[[urllib.request.Request, float], Any]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Hands a 3xx back as an HTTPError (see the module's docstring)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _open(request: urllib.request.Request, timeout: float) -> Any:
    return _OPENER.open(request, timeout=timeout)


def _reason(exc: BaseException | str) -> str:
    """The short reason of a connection failure (refused, no such host, TLS), not a repr."""
    if isinstance(exc, str):
        return exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or type(exc).__name__}"
    if isinstance(exc, socket.gaierror):
        return "host name not resolved"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def _message(raw: bytes, fallback: str) -> str:
    """Grafana's ``{"message": ...}`` from an error body, else the body's text, else
    ``fallback`` (the HTTP reason)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        text = str(body["message"])
    else:
        text = raw.decode("utf-8", "replace").strip() or fallback
    return text[:MAX_MESSAGE_CHARS]


class _Session:
    """Sends the API requests and turns every failure into a PushError that names the step."""

    def __init__(self, url: str, token: str, opener: Opener, timeout: float) -> None:
        self.url = url
        self._token = token
        self._open = opener
        self.timeout = timeout
        self.where = f"Grafana at {url}"

    def _clean(self, text: str) -> str:
        # Whatever a server echoes back, the token never reaches the terminal.
        return " ".join(text.replace(self._token, "***").split())

    def _request(self, method: str, path: str, body: Any) -> urllib.request.Request:
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=data, headers=headers, method=method)

    def call(self, what: str, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer to ``method path`` (None for an empty 2xx answer)."""
        where = self.where
        request = self._request(method, path, body)
        try:
            with self._open(request, self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._refused(what, exc) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._timed_out(what) from None
            raise PushError(
                f"cannot reach {where} ({self._clean(_reason(exc.reason))}) while trying to {what}"
            ) from None
        except TimeoutError:
            raise self._timed_out(what) from None
        except (http.client.InvalidURL, UnicodeError) as exc:
            # A space, a control or a non-ASCII character in the URL.
            raise PushError(
                f"--grafana-url: cannot request {self.url!r} ({self._clean(str(exc))})"
            ) from None
        except http.client.HTTPException as exc:
            # Before OSError: RemoteDisconnected is both. Something answered, not in HTTP.
            raise PushError(
                f"{where} sent no HTTP answer ({type(exc).__name__}) while trying to {what}: "
                "is the URL Grafana's?"
            ) from None
        except OSError as exc:
            raise PushError(
                f"cannot reach {where} ({self._clean(_reason(exc))}) while trying to {what}"
            ) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise PushError(
                f"{where} sent an answer that is not JSON while trying to {what} "
                f"({type(exc).__name__}): is the URL Grafana's?"
            ) from None

    def _timed_out(self, what: str) -> PushError:
        return PushError(
            f"{self.where} did not answer within {self.timeout:g} s while trying to {what}"
        )

    def _refused(self, what: str, exc: urllib.error.HTTPError) -> PushError:
        where, code = self.where, exc.code
        try:
            raw = exc.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        finally:
            exc.close()
        if 300 <= code < 400:
            target = self._clean(str(exc.headers.get("Location", "")))
            return PushError(
                f"{where} redirected ({code}) to {target!r} while trying to {what}: "
                "pass the address Grafana is served at as --grafana-url"
            )
        if code == 401:
            return PushError(
                f"{where} refused the token (401 Unauthorized) while trying to {what}: "
                f"check {TOKEN_ENV} or the token file"
            )
        if code == 403:
            return PushError(
                f"{where} denied permission (403 Forbidden) to {what}: the token needs "
                "the Editor role"
            )
        message = self._clean(_message(raw, str(exc.reason)))
        if code == 404:
            return PushError(
                f"{where} answered 404 to {what}: {message} (is the URL Grafana's, with its "
                "sub-path if it is served under one?)"
            )
        if code >= 500:
            return PushError(f"{where} failed ({code}) to {what}: {message}")
        return PushError(f"{where} answered {code} to {what}: {message}")


def _folder_uid(session: _Session, title: str) -> str:
    folders = session.call("list folders", "GET", "/api/folders")
    for folder in folders if isinstance(folders, list) else []:
        if isinstance(folder, dict) and folder.get("title") == title and folder.get("uid"):
            return str(folder["uid"])
    created = session.call(f"create folder {title!r}", "POST", "/api/folders", {"title": title})
    if not isinstance(created, dict) or not created.get("uid"):
        raise PushError(f"Grafana at {session.url} created folder {title!r} but sent no uid")
    return str(created["uid"])


def push(
    url: str,
    token: str,
    dashboards: Sequence[Mapping[str, Any]],
    *,
    folder: str = DEFAULT_FOLDER,
    timeout: float = DEFAULT_TIMEOUT_S,
    opener: Opener = _open,
) -> list[Pushed]:
    """Uploads ``dashboards`` (rendered JSON models) into ``folder`` on the Grafana at ``url``,
    overwriting the ones with the same uid; returns what Grafana reported for each."""
    try:
        url = check_url(url)
    except ValueError as exc:
        raise PushError(f"--grafana-url: {exc}") from None
    if not header_safe(token):
        raise PushError(BAD_TOKEN)
    session = _Session(url, token, opener, timeout)
    health = session.call("check its health", "GET", "/api/health")
    if isinstance(health, dict) and health.get("database") not in (None, "ok"):
        raise PushError(f"Grafana at {url} is not healthy: database {health.get('database')}")
    folder_uid = _folder_uid(session, folder)
    pushed: list[Pushed] = []
    for dashboard in dashboards:
        uid = str(dashboard.get("uid", ""))
        payload: dict[str, Any] = {
            "dashboard": dict(dashboard),
            "folderUid": folder_uid,
            "overwrite": True,
        }
        answer = session.call(f"save dashboard {uid}", "POST", "/api/dashboards/db", payload)
        answer = answer if isinstance(answer, dict) else {}
        version = answer.get("version")
        pushed.append(
            Pushed(
                uid=str(answer.get("uid") or uid),
                title=str(dashboard.get("title", "")),
                url=str(answer.get("url", "")),
                version=version if isinstance(version, int) else None,
                status=str(answer.get("status", "")),
            )
        )
    return pushed
