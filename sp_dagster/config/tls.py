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
