"""Dagster resources built from conf/: the control plane, the messaging layer and Spark.
Nothing connects when a resource is built: the control plane and the transport open on first
use inside a run (or a sensor tick) and close when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

CONF_HELP = "a deployment.yaml or conf directory; default: the search order of `sp-dagster config where`"


def load_conf(path: str | None, role: str | None = None):
    """The typed Config of a deployment.yaml or conf directory (None: the search order; ConfigError naming the file and key when it is wrong)."""
    from sp_dagster.config.loader import load_config
    from sp_dagster.config.locate import conf_path

    return load_config(conf_path(role or "manager", path), role=role)


class ControlPlaneResource(dg.ConfigurableResource):
    """The cluster: the control-plane database a deployment.yaml names (`deployment.config.datasource`), or, when a
    manager API is configured, that API, so the code location needs no database credentials."""

    conf: str | None = Field(default=None, description=f"the manager's configuration naming the control plane ({CONF_HELP})")
    url: str | None = Field(
        default=None,
        description="a SQLAlchemy URL that replaces the file's datasource; pass EnvVar('...') when it holds a password",
    )
    manager: str | None = Field(
        default=None, description="go through this manager API (https://host:port); default $SP_DAGSTER_MANAGER, else deployment.config.api.url"
    )
    user: str | None = Field(default=None, description="the manager API user (default $SP_DAGSTER_USER)")
    password: str | None = Field(default=None, description="its password; pass EnvVar('...') (default $SP_DAGSTER_PASSWORD)")
    _plane: Any = PrivateAttr(default=None)
    _client: Any = PrivateAttr(default=None)

    def config(self):
        """The deployment.yaml as a Config, with `url` (if given) as its control-plane datasource."""
        from sp_dagster.config.datasources import Datasource

        config = load_conf(self.conf)
        if not self.url:
            return config
        name = config.deployment.datasource
        replaced = Datasource(name, self.url, "from the Dagster resource")
        return dataclasses.replace(config, datasources={**config.datasources, name: replaced})

    def client(self):
        """The ManagerClient when a manager API is configured, else None (the database is used)."""
        if self._client is None:
            from sp_dagster.deploy.api_client import PASSWORD_ENV, USER_ENV, client_from

            self._client = (
                client_from(
                    self.config(),
                    self.manager,
                    self.user,
                    self.password,
                    user_hint=f"set the control_plane resource's user (or ${USER_ENV}) and password (or ${PASSWORD_ENV})",
                    password_hint=f"set the control_plane resource's password to EnvVar('...') (or ${PASSWORD_ENV} in the code location's environment)",
                )
                or False
            )
        return self._client or None

    def where(self) -> str:
        """The manager API's URL or the database's (without its password)."""
        client = self.client()
        if client is not None:
            return client.url
        with self.reader() as plane:
            return plane.safe_url

    @property
    def plane(self):
        """The ControlPlane (schema created or upgraded on first use); closed when the run ends. Not through a manager API."""
        if (client := self.client()) is not None:
            from sp_dagster.errors import ControlPlaneError

            raise ControlPlaneError(f"this code location goes through the manager API at {client.url}, not the database")
        if self._plane is None:
            from sp_dagster.cluster.db import ControlPlane

            self._plane = ControlPlane.from_config(self.config())
        return self._plane

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A ControlPlane for reading only: no schema is created, closed on exit."""
        from sp_dagster.cluster.db import ControlPlane

        plane = ControlPlane.from_config(self.config(), migrate=False)
        try:
            yield plane
        finally:
            plane.close()

    def status(self) -> dict[str, Any]:
        """The cluster as `sp-dagster status --json` shows it (ControlPlaneError when there is none)."""
        from sp_dagster.cluster.status import cluster_status

        if (client := self.client()) is not None:
            return client.status()
        with self.reader() as plane:
            return cluster_status(plane)

    def advice(self) -> dict[str, Any]:
        """Each group's advised parallelism as `sp-dagster advise --json` shows it (ControlPlaneError when there is no cluster)."""
        from sp_dagster.cluster.advising import group_advice

        if (client := self.client()) is not None:
            return client.advice()
        with self.reader() as plane:
            return group_advice(plane, self.config().deployment.autoscaling)

    def deployments(self, status: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every recorded deployment: app, content_hash, generation, status, plan and placement ({instance: node}),
        placed as `status` (this resource's status(), read now when not given) has them."""
        from sp_dagster.cluster.status import deployed_apps

        status = status or self.status()
        if (client := self.client()) is not None:
            apps = client.apps()  # the API's plans have their secrets masked
        else:
            with self.reader() as plane:
                apps = deployed_apps(plane, masked_plans=False)
        placement = {d["app"]: {i["instance"]: i["node"] for i in d["instances"]} for d in status["deployments"]}
        keys = ("app", "content_hash", "generation", "status", "plan")
        return [{**{k: a[k] for k in keys}, "placement": placement.get(a["app"], {})} for a in apps]

    def deployment_state(self, app: str):
        """The deployment's status and its instances' (steps.DeploymentState); DeployError when it is not recorded."""
        from sp_dagster.deploy.steps import DeployError, DeploymentState, deployment_state

        if self.client() is None:
            with self.reader() as plane:
                return deployment_state(plane, app)
        entry = next((d for d in self.status()["deployments"] if d["app"] == app), None)
        if entry is None:
            raise DeployError(f"no deployment named '{app}'; `sp-dagster status` lists the deployments")
        return DeploymentState.from_status(entry)

    def group_id(self) -> str:
        """The manager group whose leader places instances."""
        return self.config().cluster.group_id

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the control plane at the end of the run."""
        if self._plane is not None:
            self._plane.close()
            self._plane = None


class MessagingResource(dg.ConfigurableResource):
    """The messaging layer a deployment.yaml names: Kafka (bootstrapURLs, kafkaProperties) or NATS (natsServerUrl, clusterId)."""

    conf: str | None = Field(default=None, description=f"the manager's configuration naming the brokers ({CONF_HELP})")
    bootstrap_servers: str | None = Field(default=None, description="host:port,... replacing the file's bootstrapURLs (or natsServerUrl)")
    sasl_username: str | None = Field(default=None, description="SASL user name (sets sasl.username)")
    sasl_password: str | None = Field(default=None, description="SASL password (sets sasl.password); pass EnvVar('...')")
    timeout: float = Field(default=15.0, description="seconds to wait for the brokers' answers")
    _transport: Any = PrivateAttr(default=None)

    def settings(self):
        """The MessagingSettings the transport is built from."""
        settings = load_conf(self.conf).messaging
        properties = dict(settings.properties)
        if self.sasl_username:
            properties["sasl.username"] = self.sasl_username
        if self.sasl_password:
            properties["sasl.password"] = self.sasl_password
        servers = tuple(s.strip() for s in self.bootstrap_servers.split(",")) if self.bootstrap_servers else settings.servers
        return dataclasses.replace(settings, servers=servers, properties=properties)

    @property
    def transport(self):
        """The Transport (connected on first use); closed when the run ends."""
        if self._transport is None:
            from sp_dagster.messaging import transport_for

            self._transport = transport_for(self.settings(), self.timeout)
        return self._transport

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the transport at the end of the run."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None


def spark_config_of(config) -> dict[str, str]:
    """A Config's `spark:` section as spark.* settings (what dagster-pyspark's resource takes)."""
    settings = {"spark.master": config.spark.master}
    if config.spark.app_name:
        settings["spark.app.name"] = config.spark.app_name
    settings.update({str(k): str(v) for k, v in config.spark.conf.items()})
    return settings


def spark_resource(worker_conf: str | None = None):
    """dagster-pyspark's lazy resource with the worker conf's Spark settings (no session until used)."""
    from dagster_pyspark import LazyPySparkResource

    from sp_dagster.errors import SpDagsterError

    try:
        settings = spark_config_of(load_conf(worker_conf, role="worker"))
    except (SpDagsterError, OSError) as exc:  # a broken worker conf must not break the code location
        logging.getLogger(__name__).warning("%s; the Spark resource takes local[*] (worker runs report the error)", exc)
        settings = {"spark.master": "local[*]"}
    return LazyPySparkResource(spark_config=settings)
