"""State persistence of instances, per the seeds' `state.persistence` block: an instance's checkpoint
directory is its whole state. The file store keeps checkpoints where every worker finds them; the
database store keeps them locally and saves each, packed as a tar archive, as a revision of the
revision store (`sp_dagster.cluster.store.revisions`), whose newest a worker taking an instance over
restores first.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
from pathlib import Path

from sp_dagster.cluster.store.revisions import RevisionStore

log = logging.getLogger(__name__)

# A checkpoint is copied commits first, then offsets, then state: whatever batch the copied
# commit log names, its offsets and state files are already on disk and in the copy.
_COPY_ORDER = ("commits", "offsets", "metadata", "sources", "state")


def pack_checkpoint(directory: str | Path) -> bytes:
    """A tar archive of a checkpoint directory, consistent even while the query runs."""
    root = Path(directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
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
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as archive:
        archive.extractall(root, filter="data")


class FileStore:
    """Checkpoints on a location every worker shares: nothing to copy."""

    kind = "file"

    def __init__(self, location: str):
        self.root = Path(location).expanduser() / "checkpoints"

    def checkpoint_root(self, worker_id: str) -> Path:
        """Where this worker keeps checkpoints (shared by all workers)."""
        return self.root

    def save(self, instance: str, directory: Path, owner: tuple[str, int | None], keep_before: int | None = None) -> None:
        """Nothing: the checkpoint is already where every worker finds it."""

    def restore(self, instance: str, directory: Path) -> bool:
        """True when the shared checkpoint exists; a changed instance (a new directory) starts from its
        previous version's continuous checkpoint, whose unchanged queries keep their state."""
        from sp_dagster.worker.instance.checkpoints import predecessor
        from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE

        if not (directory / CHECKPOINT_FILE).exists() and (earlier := predecessor(directory, CHECKPOINT_FILE)) is not None:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copy2(earlier, directory / CHECKPOINT_FILE)
            log.info("%s: starting from the checkpoint of its previous version (%s)", instance, earlier.parent.name)
        return directory.exists()

    def newest_checkpoint(self, instance: str, *, before_ms: int | None = None) -> bytes | None:
        """The newest continuous checkpoint of an instance, of any version of it (of those saved before
        `before_ms`, when given), or None."""
        from sp_dagster.worker.instance.checkpoints import SET_ASIDE, Checkpoint, CheckpointError
        from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE

        dated = []
        for path in (self.root / instance).glob(f"*/{CHECKPOINT_FILE}"):
            if path.parent.name != SET_ASIDE:
                data = path.read_bytes()
                try:
                    dated.append((Checkpoint.decode(data).saved_at, data))
                except CheckpointError:  # damaged: the resume of whoever uses it would set it aside; here it is no candidate
                    continue
        kept = [(at, data) for at, data in dated if before_ms is None or at < before_ms]
        return max(kept, key=lambda item: item[0])[1] if kept else None

    def checkpoint_before(self, instance: str, before_ms: int, scratch: Path) -> Path | None:
        """The newest micro-batch checkpoint of an instance that no rescale at or after `before_ms` handed over
        (its query as it was before then), in place; None when it has none."""
        from sp_dagster.worker.instance.checkpoints import SET_ASIDE
        from sp_dagster.worker.spark.handover import handed_over_since

        found = [d for d in (self.root / instance).glob("*/commits") if d.parent.name != SET_ASIDE and (handed_over_since(d.parent) or 0) < before_ms]
        return max(found, key=lambda d: d.stat().st_mtime).parent if found else None

    def close(self) -> None:
        """Nothing to release."""


class DatabaseStore:
    """Local checkpoints, saved to and restored from the revision store.

    A worker saves each checkpoint every `intervalInMin` and when it stops an instance. The revision
    store (`sp_dagster.cluster.store.revisions`) holds the shared table, the compression,
    `revisionsToKeep`, and the refusal of a save from a worker that no longer owns the instance."""

    kind = "database"

    def __init__(self, revisions: RevisionStore, local_root: str | Path):
        self.revisions = revisions
        self.local_root = Path(local_root)

    def checkpoint_root(self, worker_id: str) -> Path:
        """Local checkpoints of this worker."""
        return self.local_root / f"worker-{worker_id}" / "checkpoints"

    def save(self, instance: str, directory: Path, owner: tuple[str, int | None], keep_before: int | None = None) -> None:
        """Save the checkpoint as the newest revision (keeping the newest one saved before `keep_before`, ms, too);
        NotOwnerError when `owner` no longer owns the instance."""
        if not directory.exists():
            return
        blob = pack_checkpoint(directory)
        number = self.revisions.save(instance, blob, owner=owner, keep_before=keep_before)
        log.debug("saved revision %d of %s (%d bytes before compression)", number, instance, len(blob))

    def restore(self, instance: str, directory: Path) -> bool:
        """Put the newest revision in `directory` (a local copy left from before may be stale, so it
        always goes); False when there is no revision and the instance starts afresh."""
        newest = self.revisions.latest(instance)
        if newest is None:
            if directory.exists():
                shutil.rmtree(directory)
            return False
        assert newest.data is not None  # latest() reads the data too
        unpack_checkpoint(newest.data, directory)
        log.info("restored %s from revision %d (saved by %s)", instance, newest.revision, newest.saved_by or "an earlier version")
        return True

    def newest_checkpoint(self, instance: str, *, before_ms: int | None = None) -> bytes | None:
        """The continuous checkpoint in the newest revision of an instance (of those saved before `before_ms`,
        when given), or None."""
        from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE

        newest = self.revisions.latest(instance, before_ms=before_ms)
        if newest is None or newest.data is None:
            return None
        with tarfile.open(fileobj=io.BytesIO(newest.data), mode="r:") as archive:
            try:
                member = archive.extractfile(CHECKPOINT_FILE)
            except KeyError:
                return None
            return member.read() if member is not None else None

    def checkpoint_before(self, instance: str, before_ms: int, scratch: Path) -> Path | None:
        """The checkpoint in the newest revision of an instance saved before `before_ms`, unpacked into `scratch`; None when there is none."""
        newest = self.revisions.latest(instance, before_ms=before_ms)
        if newest is None or newest.data is None:
            return None
        unpack_checkpoint(newest.data, scratch)
        return scratch

    def close(self) -> None:
        """Release the persistence database."""
        self.revisions.close()


def store_for(config, home: str | Path, plane) -> FileStore | DatabaseStore:
    """The persistence store a worker's Config asks for (the file store when persistence is off);
    `plane` is the control plane that says who owns an instance."""
    persistence = config.persistence
    if persistence.enabled and persistence.persistence_store == "database":
        return DatabaseStore(RevisionStore.from_config(config, plane), home)
    location = persistence.config.location if persistence.enabled else str(Path(home) / f"worker-{config.node_id}")
    return FileStore(location)
