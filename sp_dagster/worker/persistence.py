"""State persistence of instances, per the seeds' `state.persistence` block.

A Spark checkpoint (offsets, commits, and the engine's state in the state store) is an
instance's whole state. With the file store the checkpoints live under `config.location`,
which every worker must share. With the database store each worker keeps its checkpoints
locally and, every `intervalInMin` and when it stops an instance, saves each one as a
gzip-compressed tar revision in the shared table (WSO2's PERSISTENCE_TABLE layout), keeping
`revisionsToKeep`; a worker taking an instance over restores the newest revision first.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import time
from pathlib import Path

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, MetaData, String, Table, create_engine, delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from sp_dagster.errors import SpDagsterError

log = logging.getLogger(__name__)

# A checkpoint is copied commits first, then offsets, then state: whatever batch the copied
# commit log names, its offsets and state files are already on disk and in the copy.
_COPY_ORDER = ("commits", "offsets", "metadata", "sources", "state")


class PersistenceError(SpDagsterError):
    """State could not be saved or restored."""


def pack_checkpoint(directory: str | Path) -> bytes:
    """A gzip-compressed tar of a checkpoint directory, consistent even while the query runs."""
    root = Path(directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        names = sorted(os.listdir(root)) if root.exists() else []
        ordered = [n for n in _COPY_ORDER if n in names] + [n for n in names if n not in _COPY_ORDER]
        for name in ordered:
            try:
                archive.add(root / name, arcname=name)
            except FileNotFoundError:  # a temp file renamed away while copying: it is in its final name
                continue
    return buffer.getvalue()


def unpack_checkpoint(blob: bytes, directory: str | Path) -> None:
    """Replace a checkpoint directory by the contents of pack_checkpoint() bytes."""
    root = Path(directory)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as archive:
        archive.extractall(root, filter="data")


class FileStore:
    """Checkpoints on a location every worker shares: nothing to copy."""

    kind = "file"

    def __init__(self, location: str):
        self.root = Path(location).expanduser() / "checkpoints"

    def checkpoint_root(self, worker_id: str) -> Path:
        """Where this worker keeps checkpoints (shared by all workers)."""
        return self.root

    def save(self, instance: str, directory: Path) -> None:
        """Nothing: the checkpoint is already where every worker finds it."""

    def restore(self, instance: str, directory: Path) -> bool:
        """Nothing to restore: True when the shared checkpoint exists."""
        return directory.exists()

    def close(self) -> None:
        """Nothing to release."""


class DatabaseStore:
    """Checkpoint revisions in a shared table: id, siddhiAppName, revision, snapshot."""

    kind = "database"

    def __init__(self, url: str, table: str, revisions_to_keep: int, local_root: str | Path):
        self.url = url
        self.keep = revisions_to_keep
        self.local_root = Path(local_root)
        self.engine = create_engine(url, pool_pre_ping=True)
        self.metadata = MetaData()
        self.table = Table(
            table,
            self.metadata,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("siddhiAppName", String(100), nullable=False, index=True),
            Column("revision", String(300), nullable=False),
            Column("snapshot", LargeBinary(length=2**31 - 1), nullable=False),
            Column("savedAt", BigInteger, nullable=False),
        )
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise PersistenceError(f"cannot open the persistence table {table} at {self.engine.url.render_as_string(hide_password=True)}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None

    def checkpoint_root(self, worker_id: str) -> Path:
        """Local checkpoints of this worker."""
        return self.local_root / f"worker-{worker_id}" / "checkpoints"

    def save(self, instance: str, directory: Path) -> None:
        """Save the checkpoint as the newest revision and prune the oldest beyond revisionsToKeep."""
        if not directory.exists():
            return
        blob = pack_checkpoint(directory)
        now = int(time.time() * 1000)
        with self.engine.begin() as conn:
            conn.execute(insert(self.table).values(siddhiAppName=instance, revision=f"{now}__{instance}", snapshot=blob, savedAt=now))
            ids = [row.id for row in conn.execute(select(self.table.c.id).where(self.table.c.siddhiAppName == instance).order_by(self.table.c.id.desc()))]
            if len(ids) > self.keep:
                conn.execute(delete(self.table).where(self.table.c.id.in_(ids[self.keep:])))
        log.debug("saved revision of %s (%d bytes)", instance, len(blob))

    def restore(self, instance: str, directory: Path) -> bool:
        """Put the newest revision in `directory` (a local copy left from before may be stale, so it
        always goes); False when there is no revision and the instance starts afresh."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(self.table.c.snapshot, self.table.c.revision).where(self.table.c.siddhiAppName == instance).order_by(self.table.c.id.desc()).limit(1)
            ).first()
        if row is None:
            if directory.exists():
                shutil.rmtree(directory)
            return False
        unpack_checkpoint(row.snapshot, directory)
        log.info("restored %s from revision %s", instance, row.revision)
        return True

    def revisions(self, instance: str) -> list[str]:
        """The kept revisions of an instance, newest first."""
        with self.engine.connect() as conn:
            return [r.revision for r in conn.execute(select(self.table.c.revision).where(self.table.c.siddhiAppName == instance).order_by(self.table.c.id.desc()))]

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()


def store_for(config, home: str | Path) -> FileStore | DatabaseStore:
    """The persistence store a worker's Config asks for (the file store when persistence is off)."""
    persistence = config.persistence
    if persistence.enabled and persistence.persistence_store == "database":
        return DatabaseStore(config.persistence_datasource.url, persistence.config.table, persistence.revisions_to_keep, home)
    location = persistence.config.location if persistence.enabled else str(Path(home) / f"worker-{config.node_id}")
    return FileStore(location)
