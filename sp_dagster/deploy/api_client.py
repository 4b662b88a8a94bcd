"""The client side of the manager API (deploy.api): JSON requests with HTTP Basic credentials, following a manager's 307 to the leader.
What the CLI uses when a manager URL is configured, so an operator's machine needs no database
credentials. Every refusal is an `ApiError` carrying the manager's one line.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from sp_dagster.cluster.api_users import basic_authorization
from sp_dagster.errors import SpDagsterError

MANAGER_ENV, USER_ENV, PASSWORD_ENV = "SP_DAGSTER_MANAGER", "SP_DAGSTER_USER", "SP_DAGSTER_PASSWORD"
MAX_REDIRECTS = 3


class ApiError(SpDagsterError):
    """The manager API refused a request, or could not be reached."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # followed by ManagerClient, credentials and body included
        return None


class ManagerClient:
    """Requests to one manager API (`url`: scheme://host:port) as one user."""

    def __init__(self, url: str, username: str, password: str, *, ca_file: str | None = None, timeout: float = 30.0):
        if urlsplit(url).scheme not in ("http", "https"):
            raise ApiError(f"manager URL {url!r} must start with https:// (or http:// on this machine)")
        self.url = url.rstrip("/")
        self.username = username
        self._authorization = basic_authorization(username, password)
        self._timeout = timeout
        context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._opener = urllib.request.build_opener(_NoRedirect(), urllib.request.HTTPSHandler(context=context))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """The JSON answer of one request; ApiError with the manager's line when it refuses."""
        url = f"{self.url}{path}" + (f"?{urlencode(query)}" if query else "")
        for _ in range(MAX_REDIRECTS + 1):
            request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": self._authorization, **(headers or {})})
            try:
                with self._opener.open(request, timeout=timeout or self._timeout) as answer:
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as refused:
                location = refused.headers.get("Location")
                if refused.code in (307, 308) and location:
                    url = location
                    continue
                raise ApiError(f"manager API {self.url}: {_message(refused)}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLCertVerificationError):
                    raise ApiError(
                        f"the manager API at {self.url} has a certificate this machine does not trust ({reason.verify_message}); "
                        "name the certificate to trust in deployment.config.api.caFile"
                    ) from None
                raise ApiError(
                    f"cannot reach the manager API at {self.url} ({reason}); check --manager (or $SP_DAGSTER_MANAGER, deployment.config.api.url)"
                ) from None
        raise ApiError(f"manager API {self.url}: more than {MAX_REDIRECTS} redirects; is every manager's httpsInterface its own address?")

    def apps(self) -> list[dict]:
        """Every deployed app with its plan."""
        return self.request("GET", "/api/apps")["apps"]

    def app(self, name: str) -> dict:
        """One app: its status, plan and SiddhiQL (secrets masked)."""
        return self.request("GET", f"/api/apps/{quote(name, safe='')}")

    def status(self) -> dict:
        """The cluster status, as `sp-dagster status --json` shows it."""
        return self.request("GET", "/api/status")

    def deploy(self, text: str, source: str, *, wait: float | None, fresh: bool = False) -> dict:
        """Deploy an app's SiddhiQL text (waiting up to `wait` seconds for it to run, when given)."""
        from sp_dagster.deploy.api import SOURCE_HEADER

        query = {"wait": wait or 0, **({"fresh": 1} if fresh else {})}
        body = text.encode("utf-8")
        timeout = (wait or 0) + self._timeout
        return self.request("POST", "/api/apps", query=query, body=body, headers={SOURCE_HEADER: source, "Content-Type": "text/plain"}, timeout=timeout)

    def scale(self, name: str, group: str, parallel: int, *, wait: float | None) -> dict:
        """Run one execution group of a deployed app at `parallel` instances (waiting up to `wait` seconds, when given)."""
        query = {"group": group, "parallel": parallel, "wait": wait or 0}
        return self.request("POST", f"/api/apps/{quote(name, safe='')}/scale", query=query, timeout=(wait or 0) + self._timeout + 120)

    def advice(self) -> dict:
        """Each group's advised parallelism, as `sp-dagster advise --json` shows it."""
        return self.request("GET", "/api/advice")

    def rebalance(self) -> dict:
        """Ask the leader to rebalance: {leader, term, before: {instance: node}}."""
        return self.request("POST", "/api/rebalance")

    def autoscaling(self) -> list[dict]:
        """The leader's rescale decisions, recorded there: [{app, group, parallel, advised, applied, reason}]."""
        return self.request("POST", "/api/autoscaling")["decisions"]

    def undeploy(self, name: str, *, delete_topics: bool = False, drop_state: bool = False) -> dict:
        """Undeploy an app (deleting its topics, dropping its state when asked)."""
        query = {**({"deleteTopics": 1} if delete_topics else {}), **({"dropState": 1} if drop_state else {})}
        return self.request("DELETE", f"/api/apps/{quote(name, safe='')}", query=query, timeout=self._timeout + 120)


def client_from(config, url: str | None, user: str | None, password: str | None, *, user_hint: str, password_hint: str) -> ManagerClient | None:
    """A ManagerClient for `url` (else $SP_DAGSTER_MANAGER, else deployment.config.api.url) as `user` (else $SP_DAGSTER_USER)
    with `password` (else $SP_DAGSTER_PASSWORD); None when no URL is configured; ApiError saying what is missing."""
    url = url or os.environ.get(MANAGER_ENV) or config.deployment.api.url
    if not url:
        return None
    user = user or os.environ.get(USER_ENV)
    if not user:
        raise ApiError(f"the manager API at {url} needs a user: {user_hint}")
    password = password or os.environ.get(PASSWORD_ENV)
    if not password:
        raise ApiError(f"the manager API at {url} needs user {user}'s password: {password_hint}")
    return ManagerClient(url, user, password, ca_file=config.deployment.api.ca_file)


def _message(error: urllib.error.HTTPError) -> str:
    """The manager's one line (its JSON `error`), else the HTTP status."""
    try:
        return f"{json.loads(error.read())['error']} (HTTP {error.code})"
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {error.code} {error.reason}"
