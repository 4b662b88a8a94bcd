"""The app-repository sensor: a new or changed `*.siddhi` file deploys, a deleted one undeploys.
A tick only lists the directory and hashes the files, so a broken app fails its run, never the
sensor; the cursor's change events make `run_key`s (see `diff_repository`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from sp_dagster.deploy import content_hash
from sp_dagster.wording import counted

APP_SUFFIX = ".siddhi"
# Hashes kept per file, so an undeploy finds its deployment even if the newest version never deployed.
HASHES_KEPT = 5
FILE_TAG = "sp-dagster/app-file"


def scan_repository(directory: str | Path) -> dict[str, str]:
    """{file name: content hash} of every `*.siddhi` file directly inside `directory`."""
    found = {}
    for path in sorted(Path(directory).glob(f"*{APP_SUFFIX}")):
        if path.is_file():
            found[path.name] = content_hash(path.read_text(encoding="utf-8", errors="replace"))
    return found


@dataclass(frozen=True)
class Change:
    """One change event in the repository: a file deployed (with its hash) or removed."""

    kind: str  # "deploy" or "undeploy"
    file: str
    content_hash: str | None
    hashes: tuple[str, ...]  # the file's known hashes, newest last (what an undeploy looks for)
    event: int

    @property
    def run_key(self) -> str:
        """Unique per change event: name + content hash + event number."""
        if self.kind == "deploy":
            assert self.content_hash is not None  # a deploy names what it deploys
            return f"deploy:{self.file}:{self.content_hash[:16]}:{self.event}"
        return f"undeploy:{self.file}:{self.event}"


def diff_repository(cursor: str | None, scan: dict[str, str]) -> tuple[list[Change], str]:
    """The changes between the cursor's view and a scan, and the new cursor.

    The cursor remembers each file's last hash and the hashes it had before, and counts change events: a run_key
    is `deploy:<file>:<hash>:<event>`, so an unchanged file never redeploys while a file changed A -> B -> A
    deploys A again."""
    state = json.loads(cursor) if cursor else {}
    files: dict[str, list[str]] = {name: list(hashes) for name, hashes in state.get("files", {}).items()}
    event = int(state.get("event", 0))
    changes = []
    for name, digest in scan.items():
        known = files.get(name, [])
        if known and known[-1] == digest:
            continue
        event += 1
        known = [h for h in known if h != digest][-(HASHES_KEPT - 1) :] + [digest]
        files[name] = known
        changes.append(Change("deploy", name, digest, tuple(known), event))
    for name in sorted(set(files) - set(scan)):
        event += 1
        changes.append(Change("undeploy", name, None, tuple(files.pop(name)), event))
    return changes, json.dumps({"event": event, "files": files}, sort_keys=True)


def run_request(change: Change, directory: Path) -> dg.RunRequest:
    """The deploy or undeploy run of one change."""
    path = str(directory / change.file)
    if change.kind == "deploy":
        run_config = {"ops": {"load_app": {"config": {"path": path, "content_hash": change.content_hash}}}}
        job = "deploy"
    else:
        run_config = {"ops": {"resolve_app": {"config": {"path": path, "content_hashes": list(change.hashes)}}}}
        job = "undeploy"
    return dg.RunRequest(run_key=change.run_key, job_name=job, run_config=run_config, tags={FILE_TAG: change.file})


def build_app_repository_sensor(
    directory: str | Path,
    jobs: list,
    *,
    interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """The sensor watching `directory` (resolved now, so every process sees the same path)."""
    root = Path(directory).expanduser().resolve()

    @dg.sensor(
        name="app_repository",
        jobs=jobs,
        minimum_interval_seconds=interval_seconds,
        default_status=default_status,
        description=f"Deploys new or changed *.siddhi files in {root} and undeploys deleted ones (lists and hashes only).",
    )
    def app_repository(context: dg.SensorEvaluationContext):
        """List and hash the app files; one run request per change."""
        if not root.is_dir():
            return dg.SkipReason(f"the app repository {root} does not exist; create it or set dagster.appRepository")
        try:
            scan = scan_repository(root)
        except OSError as exc:
            return dg.SkipReason(f"cannot read the app repository {root}: {exc.strerror or exc}")
        changes, cursor = diff_repository(context.cursor, scan)
        if not changes:
            return dg.SkipReason(f"no change in {root} ({counted(len(scan), 'app file')})")
        return dg.SensorResult(run_requests=[run_request(change, root) for change in changes], cursor=cursor)

    return app_repository
