"""Upload the dashboards to a running Grafana through its HTTP API (``grafana-client``).

The token (a Grafana service-account token with the Editor role) comes only from the environment
(``AUDITOR_GRAFANA_TOKEN``) or from a file (``--grafana-token-file`` /
``AUDITOR_GRAFANA_TOKEN_FILE``): never from a command-line value, which other users can read in
the process table. No message this module produces contains it, and errors never chain the HTTP
library's exceptions, whose text is not ours to vouch for.

Steps: ``GET /api/health``, find the folder by title in ``GET /api/folders`` or create it with
``POST /api/folders``, then ``POST /api/dashboards/db`` with ``{dashboard, folderUid,
overwrite: true}`` for each dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from grafana_client import GrafanaApi
from grafana_client.client import (
    GrafanaClientError,
    GrafanaException,
    GrafanaServerError,
    GrafanaTimeoutError,
    GrafanaUnauthorizedError,
)

TOKEN_ENV = "AUDITOR_GRAFANA_TOKEN"
TOKEN_FILE_ENV = "AUDITOR_GRAFANA_TOKEN_FILE"
DEFAULT_FOLDER = "GPU Balance Auditor"
DEFAULT_TIMEOUT_S = 10.0


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


def read_token(token_file: str | None, env: Mapping[str, str]) -> str:
    """The token from ``token_file`` if given, else from ``AUDITOR_GRAFANA_TOKEN``."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            # The path is not repeated: a token pasted where the path goes stays unprinted.
            raise TokenError(
                f"cannot read the Grafana token file (--grafana-token-file / {TOKEN_FILE_ENV}): "
                f"{reason}"
            ) from None
        if not token:
            raise TokenError(
                f"the Grafana token file (--grafana-token-file / {TOKEN_FILE_ENV}) is empty"
            )
        return token
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise TokenError(
            f"no Grafana token: set {TOKEN_ENV}, or put the token in a file and pass "
            f"--grafana-token-file PATH (or set {TOKEN_FILE_ENV})"
        )
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


# (url, token, timeout) -> a GrafanaApi; tests may pass their own.
ApiFactory = Callable[[str, str, float], Any]


def _api(url: str, token: str, timeout: float) -> GrafanaApi:
    return GrafanaApi.from_url(url, credential=token, timeout=timeout)


def _reason(exc: OSError) -> str:
    """The short reason of a connection failure (refused, no such host), not the library's
    nested repr."""
    text = str(exc)
    errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if errno:
        return errno.group(1).strip()
    if "resolve" in text.lower():
        return "host name not resolved"
    return exc.strerror or type(exc).__name__


class _Session:
    """Runs API calls and turns every failure into a PushError that names the step."""

    def __init__(self, url: str, token: str, api: Any, timeout: float) -> None:
        self.url = url
        self._token = token
        self.api = api
        self.timeout = timeout

    def _clean(self, text: str) -> str:
        # Whatever a server echoes back, the token never reaches the terminal.
        return " ".join(text.replace(self._token, "***").split())

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        where = f"Grafana at {self.url}"
        try:
            return fn()
        except GrafanaUnauthorizedError:
            raise PushError(
                f"{where} refused the token (401 Unauthorized) while trying to {what}: "
                f"check {TOKEN_ENV} or the token file"
            ) from None
        except GrafanaTimeoutError:
            raise PushError(
                f"{where} did not answer within {self.timeout:g} s while trying to {what}"
            ) from None
        except GrafanaClientError as exc:
            if exc.status_code == 403:
                raise PushError(
                    f"{where} denied permission (403 Forbidden) to {what}: the token needs "
                    "the Editor role"
                ) from None
            raise PushError(
                f"{where} answered {exc.status_code} to {what}: {self._clean(str(exc.message))}"
            ) from None
        except GrafanaServerError as exc:
            raise PushError(
                f"{where} failed ({exc.status_code}) to {what}: {self._clean(str(exc.message))}"
            ) from None
        except GrafanaException as exc:
            raise PushError(f"cannot reach {where}: {self._clean(str(exc.message))}") from None
        except ValueError as exc:
            # Before OSError: niquests' JSONDecodeError is both.
            raise PushError(
                f"{where} sent an answer that is not JSON while trying to {what} "
                f"({type(exc).__name__}): is the URL Grafana's?"
            ) from None
        except OSError as exc:
            raise PushError(
                f"cannot reach {where} ({self._clean(_reason(exc))}) while trying to {what}"
            ) from None


def _folder_uid(session: _Session, title: str) -> str:
    folders = session.call("list folders", session.api.folder.get_all_folders)
    for folder in folders or []:
        if isinstance(folder, dict) and folder.get("title") == title and folder.get("uid"):
            return str(folder["uid"])
    created = session.call(
        f"create folder {title!r}", lambda: session.api.folder.create_folder(title)
    )
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
    api_factory: ApiFactory = _api,
) -> list[Pushed]:
    """Uploads ``dashboards`` (rendered JSON models) into ``folder`` on the Grafana at ``url``,
    overwriting the ones with the same uid; returns what Grafana reported for each."""
    try:
        url = check_url(url)
    except ValueError as exc:
        raise PushError(f"--grafana-url: {exc}") from None
    session = _Session(url, token, api_factory(url, token, timeout), timeout)
    health = session.call("check its health", lambda: session.api.client.GET("/health"))
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
        answer = session.call(
            f"save dashboard {uid}", partial(session.api.dashboard.update_dashboard, payload)
        )
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
