"""`@store(type='rdbms', ...)`: siddhi-store-rdbms's options, checked and turned into SQLAlchemy terms.
The JDBC URL goes through the same translation as deployment.yaml's datasources; every mistake is a
SiddhiQLError at the annotation element it concerns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sp_dagster.engine.errors import app_error
from sp_dagster.errors import ConfigError
from sp_dagster.siddhi import ast
from sp_dagster.siddhi.secrets import resolve_placeholders

KNOWN = (
    "type", "jdbc.url", "username", "password", "jdbc.driver.name", "pool.properties", "jndi.resource",
    "datasource", "table.name", "field.length", "table.check.query", "use.collation", "allow.null.values",
)  # fmt: skip
#: JDBC driver classes and the database they drive (jdbc.driver.name must agree with jdbc.url).
DRIVERS = {
    "com.mysql.jdbc.driver": "mysql",
    "com.mysql.cj.jdbc.driver": "mysql",
    "org.mariadb.jdbc.driver": "mysql",
    "org.postgresql.driver": "postgresql",
    "org.h2.driver": "h2",
    "org.sqlite.jdbc": "sqlite",
}
#: HikariCP pool properties that have a SQLAlchemy counterpart; the others are accepted and unused.
POOL_KEYS = ("maximumPoolSize", "connectionTimeout", "maxLifetime")
DEFAULT_CONNECT_TIMEOUT = 10  # seconds, when pool.properties gives no connectionTimeout


@dataclass(frozen=True)
class StoreOptions:
    """Where a store table lives and how to reach it."""

    url: str  # a SQLAlchemy URL
    shown: str  # where it lives, for messages: the URL with its password hidden
    table_name: str
    field_lengths: dict[str, int] = field(default_factory=dict)
    pool_size: int | None = None
    pool_timeout: float | None = None  # seconds
    pool_recycle: float | None = None  # seconds
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT  # seconds
    check_query: str | None = None


def parse_store(definition: ast.TableDefinition, store: ast.Annotation, datasources: dict | None) -> StoreOptions:
    """The options of `@store(type='rdbms', ...)` on `definition` (SiddhiQLError on a mistake).

        @store(type='rdbms', jdbc.url='jdbc:mysql://h:3306/db', username='u', password='p',
               jdbc.driver.name='com.mysql.jdbc.Driver', table.name='Stocks',
               field.length='symbol:100', pool.properties='maximumPoolSize:5, maxLifetime:60000')
        @store(type='rdbms', datasource='STOCKS_DB')      -- a datasource of deployment.yaml

    MySQL and MariaDB URLs go through pymysql, PostgreSQL through psycopg, H2 and SQLite on SQLite.
    """
    from sqlalchemy.engine import make_url

    from sp_dagster.config.binding import Context
    from sp_dagster.config.datasources import SUPPORTED, jdbc_to_sqlalchemy

    for element in store.elements:
        if element.key is None:
            raise app_error(f"@store takes key='value' elements, not '{element.value}'", element)
        if element.key.lower() not in KNOWN:
            raise app_error(f"@store has no option '{element.key}'; the rdbms store takes {', '.join(KNOWN[1:])}", element)
    if store.get("jndi.resource") is not None:
        raise app_error(
            "@store jndi.resource needs a Java application server; give jdbc.url (with username and password) or datasource", store.element("jndi.resource")
        )
    for flag in ("use.collation", "allow.null.values"):
        value = store.get(flag)
        if value is not None and value.lower() not in ("true", "false"):
            raise app_error(f"@store {flag} must be 'true' or 'false', not '{value}'", store.element(flag))

    name = definition.name
    if store.get("datasource") is not None:
        # siddhi-store-rdbms: a datasource wins over jdbc.url and the pool properties
        url = _datasource_url(store, datasources)
        jdbc = None
    else:
        jdbc = store.get("jdbc.url")
        if not jdbc:
            raise app_error(f"@store(type='rdbms') on table {name} needs jdbc.url (or datasource)", store)
        where = f"@store of table {name}"  # ${VAR}s come from the environment of the node running the app
        username, password = (
            resolve_placeholders(store.get("username"), f"{where}: username"),
            resolve_placeholders(store.get("password"), f"{where}: password"),
        )
        try:
            url = jdbc_to_sqlalchemy(jdbc, username, password, Context("@store", "jdbc.url", None))
        except ConfigError:
            raise app_error(f"@store jdbc.url {jdbc!r} is not supported; expected {SUPPORTED}", store.element("jdbc.url")) from None
        _check_driver(store, jdbc)
    shown = make_url(url).render_as_string(hide_password=True)
    pool = _pool_properties(store)
    datasource_pool = getattr(_datasource(store, datasources), "max_pool_size", None) if jdbc is None else None
    return StoreOptions(
        url=url,
        shown=shown,
        table_name=store.get("table.name") or name,
        field_lengths=_field_lengths(definition, store),
        pool_size=pool.get("maximumPoolSize") or datasource_pool,
        pool_timeout=pool["connectionTimeout"] / 1000 if "connectionTimeout" in pool else None,
        pool_recycle=pool["maxLifetime"] / 1000 if "maxLifetime" in pool else None,
        connect_timeout=pool["connectionTimeout"] / 1000 if "connectionTimeout" in pool else DEFAULT_CONNECT_TIMEOUT,
        check_query=store.get("table.check.query"),
    )


def _datasource(store: ast.Annotation, datasources: dict | None):
    name = store.get("datasource")
    if name is None:
        return None
    node = store.element("datasource")
    if not datasources:
        raise app_error(
            f"@store datasource '{name}' names a datasource of deployment.yaml, and this runtime was given none; "
            "pass the file that defines it (sp-dagster run or query --conf FILE; AppRuntime(..., datasources=config.datasources)) "
            "or give jdbc.url, username and password instead",
            node,
        )
    if name not in datasources:
        raise app_error(
            f"@store datasource '{name}' is not among the datasources of the deployment.yaml in use ({', '.join(sorted(datasources))}); "
            "define it under datasources: there, or pass the file that does (--conf FILE; `sp-dagster config where` shows which file a command reads)",
            node,
        )
    return datasources[name]


def _datasource_url(store: ast.Annotation, datasources: dict | None) -> str:
    source = _datasource(store, datasources)
    assert source is not None  # called only when the @store names a datasource
    return source if isinstance(source, str) else source.url


def _check_driver(store: ast.Annotation, jdbc: str) -> None:
    driver = store.get("jdbc.driver.name")
    if not driver:
        return
    drives = DRIVERS.get(driver.lower())
    kind = re.match(r"jdbc:(\w+):", jdbc.strip())
    kind = kind.group(1).lower() if kind else ""
    kind = "mysql" if kind == "mariadb" else kind
    if drives is not None and drives != kind:
        raise app_error(f"@store jdbc.driver.name '{driver}' drives {drives}, but jdbc.url is a {kind or 'different'} URL", store.element("jdbc.driver.name"))


def _pool_properties(store: ast.Annotation) -> dict[str, int]:
    text = store.get("pool.properties")
    if not text:
        return {}
    node = store.element("pool.properties")
    result: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition(":"))
        if not sep or not key:
            raise app_error(f"@store pool.properties takes 'key:value' pairs separated by commas, not '{item}'", node)
        if key in POOL_KEYS:
            if not value.isdigit() or int(value) < 1:
                raise app_error(f"@store pool.properties {key} must be a whole number of at least 1, not '{value}'", node)
            result[key] = int(value)
    return result


def _field_lengths(definition: ast.TableDefinition, store: ast.Annotation) -> dict[str, int]:
    text = store.get("field.length")
    if not text:
        return {}
    node = store.element("field.length")
    types = {a.name: a.type for a in definition.attributes}
    lengths = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (part.strip() for part in item.partition(":"))
        if not sep or not value.isdigit() or int(value) < 1:
            raise app_error(f"@store field.length takes 'attribute:length' pairs separated by commas, not '{item}'", node)
        if name not in types:
            raise app_error(f"@store field.length names '{name}', which table {definition.name} does not have", node)
        if types[name] != "string":
            raise app_error(f"@store field.length applies to string attributes; '{name}' is {types[name]}", node)
        lengths[name] = int(value)
    return lengths
