"""More processes for one HTTP receiver: `@source(type='http', worker.count='N')` serves on N cores. A
receiver's event loop is one Python thread and takes one core, so with `worker.count` above 1 the
receiver starts N - 1 helper processes (`ReceiverProcesses`) that listen on the same host:port with
SO_REUSEPORT, and the kernel spreads the connections over all N.
"""

from __future__ import annotations

import logging
import multiprocessing
import time

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a spawned interpreter imports the engine and aiohttp before it listens


class ReceiverProcessError(RuntimeError):
    """A helper process could not start, or stopped on its own."""


class _PipeControl:
    """A helper's control: stop commands from the receiver, metrics back to it; its lease is the receiver's."""

    def __init__(self, connection):
        self.connection = connection

    def commands(self) -> list[tuple]:
        """The commands the receiver sent since the last call (a closed pipe means stop)."""
        out = []
        try:
            while self.connection.poll():
                out.append(self.connection.recv())
        except (EOFError, OSError):
            out.append(("stop", False))
        return out

    def lease_ok(self) -> bool:
        """The receiver stops its helpers when its own lease runs out."""
        return True

    def lease_left(self) -> float:
        """No lease of its own (see lease_ok): calls wait as long as they are allowed."""
        return float("inf")

    def metrics(self, values: dict) -> None:
        """Hand the newest metrics to the receiver."""
        try:
            self.connection.send(("metrics", values))
        except (BrokenPipeError, OSError):
            pass


def _serve(plan, messaging, settings, users, index: int, connection, log_level: int) -> None:
    """A helper process: one more copy of the receiver's HTTP server (SO_REUSEPORT)."""
    from sp_dagster.messaging import transport_for
    from sp_dagster.worker.receivers.http import ReceiverLoop

    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [{plan.name}/{index}] %(name)s: %(message)s")
    transport = transport_for(messaging, timeout=30.0)
    loop = ReceiverLoop(plan, transport, settings, control=_PipeControl(connection), users=users, process_index=index)
    try:
        try:
            loop.start()
        except BaseException as exc:
            connection.send(("error", f"{exc.__class__.__name__}: {exc}"))
            loop.close()
            return
        connection.send(("ready", None))
        loop.run()  # until the receiver says stop, or its end of the pipe closes (it died); closes the loop
    finally:
        transport.close()


class ReceiverProcesses:
    """The helper processes of one receiver.

    Each helper is spawned: its own interpreter, event loop, producer and engine. Each names its
    requests' origins after itself (`<instance>@http<k>`), so the next group keeps every process's
    sequence apart. The receiver's loop stays the one the worker talks to: it stops the helpers
    when told to stop or when its lease runs out, sums their metrics into its own, and fails when
    one of them dies (the worker then starts the instance again).

        helpers = ReceiverProcesses(plan, messaging, settings, users, count=N - 1).start()
        helpers.poll()      # their newest metrics; raises when one has died
        helpers.stop()
    """

    def __init__(self, plan, messaging, settings, users: dict, count: int):
        if messaging is None:
            raise ReceiverProcessError(f"{plan.name}: worker.count above 1 needs the messaging settings to start more processes")
        self.plan, self.messaging, self.settings, self.users, self.count = plan, messaging, settings, dict(users), count
        self._context = multiprocessing.get_context("spawn")
        self._helpers: list[tuple] = []  # (process, connection)
        self.newest: list[dict] = []

    def start(self) -> ReceiverProcesses:
        """Spawn the helpers and wait until each listens; raise (stopping them) when one cannot."""
        level = logging.getLogger().getEffectiveLevel()
        for index in range(1, self.count + 1):
            ours, theirs = self._context.Pipe()
            process = self._context.Process(
                target=_serve,
                args=(self.plan, self.messaging, self.settings, self.users, index, theirs, level),
                name=f"http-receiver-{self.plan.name}-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._helpers.append((process, ours))
            self.newest.append({})
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            for index, (process, connection) in enumerate(self._helpers, start=1):
                while not connection.poll(0.2):
                    if not process.is_alive() or time.monotonic() > deadline:
                        raise ReceiverProcessError(f"{self.plan.name}: receiver process {index} did not start (exit code {process.exitcode})")
                try:
                    kind, detail = connection.recv()
                except EOFError:  # it ended before a word: its log says why
                    process.join(5)
                    raise ReceiverProcessError(f"{self.plan.name}: receiver process {index} did not start (exit code {process.exitcode})") from None
                if kind == "error":
                    raise ReceiverProcessError(f"{self.plan.name}: receiver process {index} could not listen: {detail}")
        except BaseException:
            self.stop()
            raise
        log.info("%s: %d more receiver process(es) listen beside this one", self.plan.name, self.count)
        return self

    @property
    def pids(self) -> list[int]:
        """The helpers' process ids."""
        return [process.pid for process, _connection in self._helpers if process.pid is not None]

    def poll(self) -> list[dict]:
        """Each helper's newest metrics; raise when one has stopped on its own."""
        for index, (process, connection) in enumerate(self._helpers):
            try:
                while connection.poll():
                    kind, values = connection.recv()
                    if kind == "metrics":
                        self.newest[index] = values
            except (EOFError, OSError):
                pass
            if not process.is_alive():
                raise ReceiverProcessError(f"{self.plan.name}: receiver process {index + 1} stopped (exit code {process.exitcode})")
        return self.newest

    def stop(self, timeout: float = 30.0) -> None:
        """Tell every helper to stop (each answers what waits), wait for them, and end those that do not."""
        for _process, connection in self._helpers:
            try:
                connection.send(("stop", True))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + timeout
        for process, connection in self._helpers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5)
            connection.close()
        self._helpers = []
