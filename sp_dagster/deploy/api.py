"""The manager API: JSON over HTTPS on `httpsInterface`, behind the users and roles of deployment.config.api.
The leader answers and any other manager answers 307 with the leader's address (the same path); every
change is recorded in the control plane's event log with its user (cluster.store.events). Routes, roles
and errors: docs/operations/security.md.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sp_dagster.cluster.api_users import ADMIN, DEPLOYER, VIEWER, ApiRefused, Caller, Users
from sp_dagster.config.tls import server_context
from sp_dagster.errors import ConfigError, SpDagsterError

log = logging.getLogger(__name__)

PREFIX = "/api"
MAX_BODY = 4 * 1024 * 1024
SOURCE_HEADER = "X-Siddhi-Source"  # the file name the client read the app from, for error messages


@dataclass
class Response:
    """What a request gets: an HTTP status, a JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def is_loopback(host: str) -> bool:
    """True when every address `host` resolves to is a loopback one."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses)


def scheme(config) -> str:
    """`https` when deployment.config.api names a certificate, else `http`."""
    return "https" if config.deployment.api.cert_file else "http"


def check_settings(config) -> None:
    """ConfigError, one line naming the setting, when the API cannot start safely as configured."""
    api, host = config.deployment.api, config.deployment.https_interface.host
    where = f"{config.source}: deployment.config.api"
    if not api.users:
        raise ConfigError(f"{where}.enabled is true but no users are configured; add users: [{{username, password: ${{ENV}}, role}}]")
    if bool(api.cert_file) != bool(api.key_file):
        raise ConfigError(f"{where}: certFile and keyFile go together; set both (TLS) or neither")
    if not api.cert_file and not api.allow_plain_http and not is_loopback(host):
        raise ConfigError(
            f"{where}: plain HTTP on {host} (not a loopback address) would send passwords in clear; "
            "set certFile and keyFile, or allowPlainHttp: true to accept that"
        )


class Api:
    """The request handling of one manager's API (no sockets: `handle` maps a request to a Response)."""

    def __init__(self, config, plane, *, leading: Callable[[], bool], leader_address: Callable[[], str | None]):
        self.config = config
        self.plane = plane
        self.users = Users(config.deployment.api.users)
        self.leading = leading
        self.leader_address = leader_address

    def handle(self, method: str, target: str, headers, body: bytes) -> Response:
        """Answer one request (auth, leadership, route); never raises."""
        parts = urlsplit(target)
        try:
            caller = self.users.authenticate(headers.get("Authorization"))
            if not self.leading():
                return self._to_leader(target)
            return self._route(caller, method, parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}, headers, body)
        except ApiRefused as refused:
            log.info("api: %s %s refused (%d): %s", method, parts.path, refused.status, refused)
            return Response(refused.status, {"error": str(refused)}, {"WWW-Authenticate": 'Basic realm="sp-dagster"'} if refused.status == 401 else {})
        except SpDagsterError as exc:
            return Response(_status_of(exc), {"error": str(exc)})
        except Exception as exc:  # a failure of ours: logged here, one line to the client
            log.exception("api: %s %s failed", method, parts.path)
            return Response(500, {"error": f"the manager failed to answer ({type(exc).__name__}); its log says why"})

    def _to_leader(self, target: str) -> Response:
        address = self.leader_address()
        if address is None:
            return Response(503, {"error": "no manager leads the cluster right now; try again in a few seconds"}, {"Retry-After": "2"})
        return Response(307, {"leader": address}, {"Location": f"{scheme(self.config)}://{address}{target}"})

    def _route(self, caller: Caller, method: str, path: str, query: dict[str, str], headers, body: bytes) -> Response:
        from sp_dagster.cluster.status import cluster_status, deployed_apps

        segments = [unquote(s) for s in path.removeprefix(PREFIX).strip("/").split("/")] if path.startswith(PREFIX + "/") else []
        if method == "GET" and segments == ["status"]:
            caller.require(VIEWER, "status")
            return Response(200, cluster_status(self.plane))
        if method == "GET" and segments == ["apps"]:
            caller.require(VIEWER, "listing apps")
            return Response(200, {"apps": deployed_apps(self.plane)})
        if method == "GET" and len(segments) == 2 and segments[0] == "apps":
            caller.require(VIEWER, "reading an app")
            return Response(200, self._app(segments[1]))
        if method == "POST" and segments == ["apps"]:
            caller.require(DEPLOYER, "deploy")
            return Response(200, self._deploy(caller, body, headers.get(SOURCE_HEADER) or "<api>", query))
        if method == "POST" and len(segments) == 3 and segments[0] == "apps" and segments[2] == "scale":
            caller.require(DEPLOYER, "scale")
            return Response(200, self._scale(caller, segments[1], query))
        if method == "GET" and segments == ["advice"]:
            caller.require(VIEWER, "reading the advice")
            return Response(200, self._advice())
        if method == "POST" and segments == ["rebalance"]:
            caller.require(DEPLOYER, "rebalance")
            return Response(200, self._rebalance(caller))
        if method == "POST" and segments == ["autoscaling"]:
            caller.require(DEPLOYER, "autoscaling")
            return Response(200, self._autoscaling())
        if method == "DELETE" and len(segments) == 2 and segments[0] == "apps":
            drop = _flag(query, "dropState")
            caller.require(ADMIN if drop else DEPLOYER, "undeploy --drop-state" if drop else "undeploy")
            return Response(200, self._undeploy(caller, segments[1], delete_topics=_flag(query, "deleteTopics"), drop_state=drop))
        return Response(404, {"error": f"no such endpoint: {method} {path} (see docs/operations/security.md)"})

    def _app(self, name: str) -> dict[str, Any]:
        from sp_dagster.cluster.store.deployments import get_deployment
        from sp_dagster.deploy.errors import DeployError
        from sp_dagster.siddhi.secrets import mask_secrets
        from sp_dagster.topology.output import masked

        record = get_deployment(self.plane, name)
        if record is None:
            raise DeployError(f"no deployment named '{name}'; `sp-dagster apps` lists the deployments")
        return {"app": record.app, "status": record.status, "generation": record.generation, "siddhi": mask_secrets(record.source), "plan": masked(record.plan)}

    def _deploy(self, caller: Caller, body: bytes, source: str, query: dict[str, str]) -> dict[str, Any]:
        from sp_dagster.cluster.store.events import record_change
        from sp_dagster.deploy.steps import deploy, load_app

        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiRefused(400, "the app is not UTF-8 text") from None
        loaded = load_app(text=text, source=source)
        wait = float(query.get("wait") or 0)
        result = deploy(loaded, self.config, wait=wait > 0, timeout=wait or 120.0, fresh=_flag(query, "fresh"))
        record_change(self.plane, caller.username, "deploy", result.app, changed=result.changed, content_hash=loaded.content_hash, node=self.config.node_id)
        log.info("api: %s deployed %s%s", caller.username, result.app, "" if result.changed else " (unchanged)")
        return {"app": result.app, "changed": result.changed, "lines": result.summary(), "running": bool(result.state and result.state.running)}

    def _scale(self, caller: Caller, app: str, query: dict[str, str]) -> dict[str, Any]:
        from sp_dagster.cluster.store.events import record_change
        from sp_dagster.deploy.scaling import scale

        group, parallel = query.get("group") or "", query.get("parallel") or ""
        if not group or not parallel.isdigit():
            raise ApiRefused(400, "scale needs ?group=<execGroup>&parallel=<whole number>")
        wait = float(query.get("wait") or 0)
        result = scale(self.config, app, group, int(parallel), wait=wait > 0, timeout=wait or 120.0)
        record_change(self.plane, caller.username, "scale", result.app, group=group, parallel=int(parallel), node=self.config.node_id)
        log.info("api: %s scaled %s group %s to %s", caller.username, result.app, group, parallel)
        return {"app": result.app, "changed": result.changed, "lines": result.summary(), "running": bool(result.state and result.state.running)}

    def _advice(self) -> dict[str, Any]:
        from sp_dagster.cluster.advising import group_advice

        return group_advice(self.plane, self.config.deployment.autoscaling)

    def _rebalance(self, caller: Caller) -> dict[str, Any]:
        from sp_dagster.cluster.store.events import record_change
        from sp_dagster.deploy.rebalance import request_rebalance

        asked = request_rebalance(self.plane, self.config.cluster.group_id)
        if asked is None:  # this manager answers as leader, so its lease ran out a moment ago
            raise ApiRefused(503, "no manager leads the cluster right now; try again in a few seconds")
        record_change(self.plane, caller.username, "rebalance", None, node=self.config.node_id)
        log.info("api: %s asked for a rebalance", caller.username)
        return asked

    def _autoscaling(self) -> dict[str, Any]:
        from sp_dagster.cluster.advising import group_advice
        from sp_dagster.cluster.autoscaling import plan_rescales

        settings = self.config.deployment.autoscaling
        decisions = plan_rescales(self.plane, group_advice(self.plane, settings), settings)
        return {"decisions": [{"app": d.app, **d.detail()} for d in decisions]}

    def _undeploy(self, caller: Caller, app: str, *, delete_topics: bool, drop_state: bool) -> dict[str, Any]:
        from sp_dagster.cluster.store.events import record_change
        from sp_dagster.deploy.state import remove_app

        lines = remove_app(self.plane, self.config, app, delete_topics=delete_topics, drop=drop_state)
        record_change(self.plane, caller.username, "undeploy", app, delete_topics=delete_topics, drop_state=drop_state, node=self.config.node_id)
        log.info("api: %s undeployed %s%s", caller.username, app, " and dropped its state" if drop_state else "")
        return {"app": app, "lines": lines}


def _status_of(error: SpDagsterError) -> int:
    """400 for an app that cannot be deployed, 404 for an app that is not there, 409 for any other refusal."""
    from sp_dagster.siddhi import SiddhiQLError

    return 400 if isinstance(error, SiddhiQLError) else 404 if "no deployment named" in str(error) else 409


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true", "yes")


class _Handler(BaseHTTPRequestHandler):
    api: Api  # set on the subclass serve_api makes
    server_version = "sp-dagster"
    sys_version = ""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            response = Response(413, {"error": f"the request is larger than {MAX_BODY} bytes"})
        else:
            response = self.api.handle(self.command, self.path, self.headers, self.rfile.read(length) if length else b"")
        data = json.dumps(response.body, sort_keys=True).encode("utf-8")
        self.send_response(response.status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **response.headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # the request line and status only: never a header
        log.debug("api: %s %s", self.address_string(), format % args)


class ApiEndpoint:
    """A running manager API; `url` is where it answers."""

    def __init__(self, server: ThreadingHTTPServer, url: str):
        self._server, self.url = server, url
        threading.Thread(target=server.serve_forever, name="manager-api", daemon=True).start()

    def stop(self) -> None:
        """Stop answering and release the port."""
        self._server.shutdown()
        self._server.server_close()


class _TlsServer(ThreadingHTTPServer):
    """Wraps each accepted connection in TLS (the handshake runs in the request's own thread)."""

    daemon_threads = True
    context: ssl.SSLContext | None = None

    def get_request(self):
        """Accept a connection, wrapped in TLS when a context is set."""
        sock, address = super().get_request()
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address


def serve_api(config, plane, *, leading: Callable[[], bool], leader_address: Callable[[], str | None]) -> ApiEndpoint:
    """Serve the API on httpsInterface (TLS when deployment.config.api names a certificate); ConfigError, one line, when it cannot."""
    check_settings(config)
    api_settings, interface = config.deployment.api, config.deployment.https_interface
    context = None
    if api_settings.cert_file:
        context = server_context(api_settings.cert_file, api_settings.key_file or "", f"{config.source}: deployment.config.api")
    handler = type("ApiHandler", (_Handler,), {"api": Api(config, plane, leading=leading, leader_address=leader_address)})
    try:
        server = _TlsServer((interface.host, interface.port), handler)
    except OSError as exc:
        raise ConfigError(
            f"{config.source}: cannot serve the manager API on {interface.host}:{interface.port} ({exc.strerror}); set deployment.config.httpsInterface to a free address"
        ) from None
    server.context = context
    url = f"{scheme(config)}://{interface.host}:{interface.port}"
    log.info("manager %s: API at %s (%d users)", config.node_id, url, len(config.deployment.api.users))
    return ApiEndpoint(server, url)
