"""Datasources: a name mapped to a SQLAlchemy URL, written as a URL or in WSO2's JDBC form."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sp_dagster.config.binding import Context, bind_dataclass, describe, setting
from sp_dagster.config.yamlsource import LocatedDict, LocatedList, default_home
from sp_dagster.errors import ConfigError

SUPPORTED = (
    "MySQL/MariaDB (jdbc:mysql://, jdbc:mariadb://), PostgreSQL (jdbc:postgresql://), Oracle (jdbc:oracle:thin:@), "
    "MSSQL (jdbc:sqlserver://), H2 (run on SQLite) or SQLite"
)
# The DB-API driver each dialect needs, and what to install for it.
DRIVERS = {
    "postgresql": ("psycopg", "pip install 'sp-dagster[postgres]'"),
    "oracle": ("oracledb", "pip install 'sp-dagster[oracle]'"),
    "mssql": ("pymssql", "pip install 'sp-dagster[mssql]'"),
    "mysql": ("pymysql", "pip install pymysql"),
}


@dataclass(frozen=True)
class Datasource:
    """A database the cluster uses: control plane, state persistence or RDBMS tables."""

    name: str
    url: str
    description: str = ""
    max_pool_size: int | None = None

    @property
    def safe_url(self) -> str:
        """The URL with its password hidden, for logs and status output."""
        return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", self.url)


@dataclass(frozen=True)
class _RdbmsConfiguration:
    """WSO2's `definition.configuration` block (HikariCP settings are accepted; pool size is used)."""

    jdbc_url: str | None = setting("jdbcUrl", None)
    url: str | None = setting("url", None, doc="a SQLAlchemy URL")
    username: str | None = setting("username", None)
    password: str | None = setting("password", None)
    driver_class_name: str | None = setting("driverClassName", None)
    max_pool_size: int | None = setting("maxPoolSize", None, minimum=1)
    idle_timeout: int | None = setting("idleTimeout", None)
    connection_test_query: str | None = setting("connectionTestQuery", None)
    validation_timeout: int | None = setting("validationTimeout", None)
    is_auto_commit: bool | None = setting("isAutoCommit", None)
    description: str = setting("description", "")


@dataclass(frozen=True)
class _JndiConfig:
    name: str | None = setting("name", None)
    use_jndi_reference: bool | None = setting("useJndiReference", None)


@dataclass(frozen=True)
class _Definition:
    type: str = setting("type", "RDBMS", choices=("RDBMS",))
    configuration: _RdbmsConfiguration = setting("configuration", factory=_RdbmsConfiguration)


@dataclass(frozen=True)
class _Wso2Datasource:
    name: str = setting("name")
    definition: _Definition = setting("definition")
    description: str = setting("description", "")
    jndi_config: _JndiConfig | None = setting("jndiConfig", None)


def _auth(username: str | None, password: str | None) -> str:
    if not username:
        return ""
    return quote(username, safe="") + (":" + quote(password, safe="") if password else "") + "@"


def jdbc_to_sqlalchemy(jdbc_url: str, username: str | None, password: str | None, ctx: Context) -> str:
    """Translate a JDBC URL (MySQL, MariaDB, PostgreSQL, Oracle, MSSQL, H2, SQLite) into a SQLAlchemy URL."""
    auth = _auth(username, password)
    match = re.fullmatch(r"jdbc:(mysql|mariadb|postgresql)://([^/?;]+)(?:/([^?;]*))?(?:[?;].*)?", jdbc_url.strip())
    if match:
        kind, hostport, database = match.groups()
        scheme = "postgresql+psycopg" if kind == "postgresql" else "mysql+pymysql"
        return f"{scheme}://{auth}{hostport}/{database or ''}"
    match = re.fullmatch(r"jdbc:oracle:thin:@(//)?([^:/]+(?::\d+)?)([:/])([^?]+)(?:\?.*)?", jdbc_url.strip())
    if match:  # @host:port:SID, or @//host:port/service and @host:port/service
        slashes, hostport, separator, name = match.groups()
        sid = separator == ":" and not slashes
        return f"oracle+oracledb://{auth}{hostport}/" + (name if sid else f"?service_name={quote(name, safe='')}")
    match = re.fullmatch(r"jdbc:sqlserver://([^;]*)((?:;[^;]*)*)", jdbc_url.strip().rstrip(";"))
    if match:  # jdbc:sqlserver://host[\\instance][:port];databaseName=DB;...
        hostport, properties = match.groups()
        settings = dict(p.split("=", 1) for p in properties.split(";") if "=" in p)
        database = next((v for k, v in settings.items() if k.lower() in ("databasename", "database")), "")
        return f"mssql+pymssql://{auth}{hostport.replace(chr(92), '%5C')}/{database}"
    match = re.fullmatch(r"jdbc:h2:(.*)", jdbc_url.strip())
    if match:
        target = match.group(1).split(";", 1)[0]
        if target.startswith("mem:"):
            return "sqlite://"
        target = re.sub(r"^(file:|tcp://[^/]*/)", "", target)
        target = target.replace("${carbon.home}", default_home())  # ${sys:carbon.home} is resolved with the file
        path = Path(target).expanduser()
        if not path.is_absolute():
            path = Path(default_home()) / path
        return f"sqlite:///{path}.db"
    match = re.fullmatch(r"jdbc:sqlite:(.+)", jdbc_url.strip())
    if match:
        return f"sqlite:///{match.group(1)}"
    raise ctx.error(f"unsupported JDBC URL {jdbc_url!r}; expected {SUPPORTED}")


def missing_driver(url: str, exc: ModuleNotFoundError) -> str:
    """One line: which driver a database URL needs, and what to install."""
    from sqlalchemy.engine import make_url

    backend = make_url(url).get_backend_name()
    module, install = DRIVERS.get(backend, (exc.name, f"pip install {exc.name}"))
    return f"the {backend} driver ({module}) for {Datasource('', url).safe_url} is not installed: {install}"


def create_engine(url: str, **kwargs: Any):
    """sqlalchemy.create_engine; a missing database driver is a ConfigError naming the package to install."""
    import sqlalchemy

    try:
        return sqlalchemy.create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        raise ConfigError(missing_driver(url, exc)) from None


def _check_url(url: str, ctx: Context) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if url.startswith("jdbc:"):
        return jdbc_to_sqlalchemy(url, None, None, ctx)
    try:
        make_url(url)
    except ArgumentError:
        raise ctx.error(f"expected a SQLAlchemy URL such as 'sqlite:///path/to/db.sqlite' or a jdbcUrl, got {url!r}") from None
    return url


def _from_configuration(name: str, conf: _RdbmsConfiguration, description: str, ctx: Context, raw: Any) -> Datasource:
    marks = raw.marks if isinstance(raw, LocatedDict) else {}
    if conf.url and conf.jdbc_url:
        raise ctx.error("give either url or jdbcUrl, not both")
    if conf.jdbc_url:
        url = jdbc_to_sqlalchemy(conf.jdbc_url, conf.username, conf.password, ctx.child("jdbcUrl", marks.get("jdbcUrl")))
    elif conf.url:
        url = _check_url(conf.url, ctx.child("url", marks.get("url")))
    else:
        raise ctx.error("expected a jdbcUrl (WSO2 form) or a url (SQLAlchemy form)")
    return Datasource(name, url, description or conf.description, conf.max_pool_size)


def parse_datasources(value: Any, ctx: Context) -> dict[str, Datasource]:
    """Parse `datasources:`: NAME: URL, or NAME: {url|jdbcUrl, username, password, ...}."""
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping of datasource names to URLs, got {describe(value)}")
    marks = value.marks if isinstance(value, LocatedDict) else {}
    result = {}
    for name, entry in value.items():
        entry_ctx = ctx.child(name, marks.get(name))
        if isinstance(entry, str):
            result[name] = Datasource(name, _check_url(entry, entry_ctx))
        else:
            conf = bind_dataclass(_RdbmsConfiguration, entry, entry_ctx)
            result[name] = _from_configuration(name, conf, "", entry_ctx, entry)
    return result


def parse_wso2_datasources(value: Any, ctx: Context) -> dict[str, Datasource]:
    """Parse WSO2's `wso2.datasources: {dataSources: [{name, definition: {configuration}}]}`."""
    if not isinstance(value, dict) or set(value) - {"dataSources"}:
        raise ctx.error("expected a mapping with one key, dataSources: a list of datasources")
    entries = value.get("dataSources") or LocatedList()
    list_ctx = ctx.child("dataSources", value.marks.get("dataSources") if isinstance(value, LocatedDict) else None)
    if not isinstance(entries, list):
        raise list_ctx.error(f"expected a list of datasources, got {describe(entries)}")
    result = {}
    for index, entry in enumerate(entries):
        entry_ctx = list_ctx.child(index, entries.marks.get(index) if isinstance(entries, LocatedList) else None)
        wso2 = bind_dataclass(_Wso2Datasource, entry, entry_ctx)
        if wso2.name in result:
            raise entry_ctx.error(f"datasource '{wso2.name}' is defined twice")
        definition = entry.get("definition") if isinstance(entry, dict) else None
        raw = definition.get("configuration") if isinstance(definition, dict) else None
        conf_ctx = entry_ctx.child("definition", None).child("configuration", getattr(raw, "mark", None))
        result[wso2.name] = _from_configuration(wso2.name, wso2.definition.configuration, wso2.description, conf_ctx, raw)
    return result
