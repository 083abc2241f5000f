"""Claims a worker made whose answer it has not delivered yet, kept where its master sees them.

A pop's claim commits in the database before its answer is written to the client. When
the worker dies in between (killed, out of memory), nothing in the worker can give the
claim back: its partition would stay leased to nobody for a whole lease time, and its
messages would come back counted as a retry that no consumer saw (with retryLimit 0,
dead-lettered without a delivery).

So each worker keeps, in a file of its own under QUEEN_CLAIMS_DIR, the lease ids of its
pops from just before the claim is sent until the answer is with the kernel (or given
back): "+lease" and "-lease" lines, appended; the file is emptied whenever nothing is in
flight, so it stays a few lines long. The gunicorn master, told of a worker's death
(child_exit), reads what was still in flight and starts `python -m queen.server.claims`
to give those claims back (queen.give_back: no attempt counted), so the partition is free
again within seconds.

A lease's id is made of the one its claim was made under and its partition's
(queen.lease_in): the last 8 bytes, kept, say which claim an answered lease was.

Imported by the gunicorn master: nothing here imports psycopg at load.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

CLAIMS_ENV = "QUEEN_CLAIMS_DIR"
SUFFIX = ".claims"
# When the helper gives back: at once, then again for claims whose statement was still
# running when the worker died (it may commit after the first try found nothing).
GIVE_BACK_AFTER_S = (0.0, 2.0, 6.0)

log = logging.getLogger(__name__)

KEPT = 2**64 - 1  # the bits of a claim's lease id that the lease's own id keeps


def claim_of(lease: uuid.UUID) -> int:
    """What a lease id and the id its claim was made under have in common."""
    return lease.int & KEPT


class InFlight:
    """This worker's pops whose answers are not delivered yet (a file its master reads)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._leases: set[int] = set()  # (claim_of each)
        self._lock = threading.Lock()
        self._fd: int | None = None
        if path is not None:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)

    def begin(self, lease: uuid.UUID) -> None:
        """Record a claim about to be made under lease."""
        if self._fd is None:
            return
        with self._lock:
            self._leases.add(claim_of(lease))
            os.write(self._fd, b"+%s\n" % lease.hex.encode())

    def end(self, leases: Iterable[uuid.UUID]) -> None:
        """Record that these claims were answered, found nothing, or were given back."""
        if self._fd is None:
            return
        with self._lock:
            ended = [lease for lease in leases if claim_of(lease) in self._leases]
            if not ended:
                return
            self._leases.difference_update(claim_of(lease) for lease in ended)
            if not self._leases:
                os.ftruncate(self._fd, 0)  # nothing in flight: start the file over
                return
            os.write(self._fd, b"".join(b"-%s\n" % lease.hex.encode() for lease in ended))

    def in_flight(self) -> int:
        return len(self._leases)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


NOWHERE = InFlight(None)  # for a process whose master keeps no claims (tests, tools)


def for_this_worker() -> InFlight:
    """This worker's record, in the directory its master chose (NOWHERE without one)."""
    directory = os.environ.get(CLAIMS_ENV)
    if not directory:
        return NOWHERE
    return InFlight(Path(directory) / f"{os.getpid()}{SUFFIX}")


def unanswered(path: Path) -> list[uuid.UUID]:
    """The leases a file records as claimed and never answered, in claim order."""
    try:
        text = path.read_text("ascii", errors="replace")
    except FileNotFoundError:
        return []
    leases: dict[int, uuid.UUID] = {}
    for line in text.splitlines():
        try:
            lease = uuid.UUID(hex=line[1:])
        except ValueError:
            continue  # (a line cut short by the death)
        if line[:1] == "+":
            leases[claim_of(lease)] = lease
        elif line[:1] == "-":
            leases.pop(claim_of(lease), None)
    return list(leases.values())


def prepare() -> str | None:
    """Point QUEEN_CLAIMS_DIR at a private directory before the workers start; return it
    if we made it (to remove at exit).

    A directory given by the operator (or by `queen serve`, which keeps one across
    gunicorn restarts) may hold files of workers of an earlier master: their claims are
    given back now.
    """
    given = os.environ.get(CLAIMS_ENV)
    if given:
        directory = Path(given)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for stale in directory.glob(f"*{SUFFIX}"):
            give_back_in_background(unanswered(stale))
            stale.unlink(missing_ok=True)
        return None
    made = tempfile.mkdtemp(prefix="queen-claims-")
    os.environ[CLAIMS_ENV] = made
    return made


def worker_died(pid: int) -> None:
    """Give back the claims a dead worker had not answered (the master's child_exit)."""
    directory = os.environ.get(CLAIMS_ENV)
    if not directory:
        return
    path = Path(directory) / f"{pid}{SUFFIX}"
    leases = unanswered(path)
    path.unlink(missing_ok=True)
    give_back_in_background(leases)


def give_back_in_background(leases: list[uuid.UUID]) -> None:
    """Start a process that gives these claims back (the master must not import psycopg,
    nor wait on the database)."""
    if not leases:
        return
    subprocess.Popen(  # noqa: S603 - our own module, our own arguments
        [sys.executable, "-m", "queen.server.claims", *(str(lease) for lease in leases)],
        env=os.environ,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # (not stopped with the master's process group)
    )


def remove(directory: str | None) -> None:
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def give_back(leases: list[uuid.UUID]) -> int:
    """Give back leases' claims in the database of this server's settings; return how many
    messages went back to pending."""
    import psycopg

    from queen.config import Settings

    settings = Settings.from_env()
    returned = 0
    remaining = list(leases)
    started = time.monotonic()
    for after in GIVE_BACK_AFTER_S:
        time.sleep(max(0.0, started + after - time.monotonic()))
        try:
            with psycopg.connect(settings.dsn, autocommit=True, connect_timeout=5) as conn:
                for lease in remaining:
                    (count,) = conn.execute("SELECT queen.give_back(%s)", [lease]).fetchone() or (0,)
                    returned += count or 0
        except psycopg.Error as exc:
            log.warning("cannot give back the claims of a dead worker yet: %s", exc)
    return returned


def main(argv: list[str]) -> int:
    from queen import logs

    logs.setup("claims", logging.INFO)
    leases = [uuid.UUID(arg) for arg in argv]
    returned = give_back(leases)
    log.warning(
        "a worker died with %d pops unanswered: gave back %d messages (no attempt counted)",
        len(leases), returned,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
