"""Run `queen serve`'s children (gunicorn, maintenance) and restart the ones that die.

A child that exits is restarted after an exponential backoff, with one log line saying
why it ended (exit code or signal). The supervisor ends when asked (stop(): every child
gets SIGTERM, exit 0) or when an essential child (the API's gunicorn) keeps failing
(MAX_FAILURES exits within FAILURE_WINDOW_S: everything is stopped, exit 1). A child that
is not essential (maintenance: the API serves without it) is crash-looping then: it is
restarted every MAX_BACKOFF at most, each exit logged as an error, until it has run
RECOVERED_AFTER_S. Each change is written to the state file (queen.server.status), from
which the API reports it.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from queen.server import status

log = logging.getLogger("queen")

STOP_TIMEOUT = 15.0  # seconds children get to stop before they are killed
MAX_FAILURES = 5  # exits of one child within FAILURE_WINDOW_S that end the supervisor
FAILURE_WINDOW_S = 60.0
MIN_BACKOFF = 0.5  # seconds before the first restart; doubled by each recent failure
MAX_BACKOFF = 15.0  # seconds
RECOVERED_AFTER_S = 30.0  # seconds a crash-looping child must run to be counted well again
TICK = 0.2  # seconds between looks at the children

Spawn = Callable[[Sequence[str], Mapping[str, str]], "subprocess.Popen[bytes]"]


def _popen(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), env=dict(env))


def describe_exit(code: int) -> str:
    """Say how a process ended, from its Popen returncode."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclasses.dataclass
class Child:
    """One supervised command and its recent history."""

    name: str
    argv: Sequence[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # when a dead child is due to start again
    failures: list[float] = dataclasses.field(default_factory=list)  # exit times
    essential: bool = True  # its crash loop stops the server
    crash_looping: bool = False
    restarts: int = 0
    last_exit: str | None = None

    def recent_failures(self, now: float) -> int:
        self.failures = [t for t in self.failures if now - t < FAILURE_WINDOW_S]
        return len(self.failures)

    def state(self, now: float) -> status.ChildState:
        running = self.restart_at is None and self.proc is not None
        return {
            "status": "crash-looping" if self.crash_looping
            else "running" if running else "restarting",
            "pid": self.proc.pid if running and self.proc is not None else None,
            "restarts": self.restarts,
            "recentExits": self.recent_failures(now),
            "lastExit": self.last_exit,
        }


class Supervisor:
    """Keep children running; see the module docstring."""

    def __init__(
        self,
        children: Sequence[tuple[str, Sequence[str]]],
        env: Mapping[str, str],
        *,
        spawn: Spawn = _popen,
        clock: Callable[[], float] = time.monotonic,
        essential: Collection[str] | None = None,
        state_path: str | None = None,
    ) -> None:
        """essential: the children whose crash loop stops the server (default: all).
        state_path: where to write the children's states (queen.server.status)."""
        self.children = [
            Child(name, argv, essential=essential is None or name in essential)
            for name, argv in children
        ]
        self.state_path = state_path
        self.env = env
        self.spawn = spawn
        self.clock = clock
        self.stopping = False
        self.failed: str | None = None  # why the supervisor gave up

    def stop(self, *_: object) -> None:
        """Ask the supervisor to stop its children and return 0 (a signal handler)."""
        self.stopping = True

    def start(self) -> None:
        for child in self.children:
            self._start(child)
        self.save()

    def _start(self, child: Child) -> None:
        child.proc = self.spawn(child.argv, self.env)
        child.started_at = self.clock()
        child.restart_at = None

    def save(self) -> None:
        """Write every child's state to the state file (when there is one)."""
        if self.state_path is None:
            return
        now = self.clock()
        try:
            status.write(self.state_path, {c.name: c.state(now) for c in self.children})
        except OSError as exc:
            log.warning("cannot write the children's state to %s: %s", self.state_path, exc)

    def step(self) -> None:
        """Restart what is due and notice what exited since the last step."""
        now = self.clock()
        changed = False
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    log.info("starting %s again", child.name)
                    self._start(child)
                    child.restarts += 1
                    changed = True
                continue
            if child.proc is None or self.stopping:
                continue
            if child.proc.poll() is None:
                if child.crash_looping and now - child.started_at >= RECOVERED_AFTER_S:
                    child.crash_looping = False
                    log.warning(
                        "%s has run %.0fs: no longer crash-looping", child.name, RECOVERED_AFTER_S
                    )
                    changed = True
                continue
            self._exited(child, child.proc.returncode, now)
            changed = True
            if self.failed:
                return
        if changed:
            self.save()

    def _exited(self, child: Child, code: int, now: float) -> None:
        child.failures.append(now)
        recent = child.recent_failures(now)
        ran = now - child.started_at
        child.last_exit = describe_exit(code)
        if recent >= MAX_FAILURES and child.essential:
            self.failed = (
                f"{child.name} exited {recent} times within {FAILURE_WINDOW_S:.0f}s"
                f" (last: {describe_exit(code)}); stopping"
            )
            log.error("%s", self.failed)
            return
        if recent >= MAX_FAILURES and not child.crash_looping:
            child.crash_looping = True
            log.error(
                "%s is crash-looping: it exited %d times within %.0fs; the API keeps serving"
                " without it, and it is restarted every %.0fs at most until it runs %.0fs",
                child.name, recent, FAILURE_WINDOW_S, MAX_BACKOFF, RECOVERED_AFTER_S,
            )
        delay = min(MIN_BACKOFF * 2 ** (recent - 1), MAX_BACKOFF)
        child.restart_at = now + delay
        log.error(
            "%s (pid %d) ended after %.1fs: %s; restarting in %.1fs%s",
            child.name,
            child.proc.pid if child.proc else 0,
            ran,
            describe_exit(code),
            delay,
            " (crash-looping)" if child.crash_looping else "",
        )

    def run(self, sleep: Callable[[float], None] = time.sleep) -> int:
        """Start the children and keep them running; return the exit code."""
        self.start()
        while not self.stopping and not self.failed:
            sleep(TICK)
            self.step()
        self.terminate()
        return 1 if self.failed else 0

    def terminate(self) -> None:
        """SIGTERM every running child, then kill those still running after STOP_TIMEOUT."""
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
