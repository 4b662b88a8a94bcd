"""TLS for the servers a node runs (the manager API, HTTP receivers): a server context from PEM files."""

from __future__ import annotations

import ssl

from sp_dagster.errors import ConfigError


def server_context(cert_file: str, key_file: str, where: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving `cert_file` with `key_file`; ConfigError naming `where` (the setting) when they cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: cannot load certFile {cert_file} with keyFile {key_file} ({exc}); name PEM files this user can read") from None
    return context


def receiver_tls_files(config) -> tuple[str, str] | None:
    """(certificate, key) of this node's https:// receivers, checked to load; None without; ConfigError, one line, when they do not."""
    tls, where = config.deployment.receiver_tls, f"{config.source}: deployment.config.receiverTls"
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(f"{where}: certFile and keyFile go together; set both (https:// receivers) or neither")
    if not tls.enabled:
        return None
    server_context(tls.cert_file, tls.key_file, where)
    return tls.cert_file, tls.key_file
