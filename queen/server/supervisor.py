"""Run `queen serve`'s children (gunicorn, maintenance) and restart the ones that die.

A child that exits is restarted after an exponential backoff, with one log line saying
why it ended (exit code or signal). The supervisor ends when asked (stop(): every child
gets SIGTERM, exit 0) or when one child keeps failing (MAX_FAILURES exits within
FAILURE_WINDOW_S: everything is stopped, exit 1).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("queen")

STOP_TIMEOUT = 15.0  # seconds children get to stop before they are killed
MAX_FAILURES = 5  # exits of one child within FAILURE_WINDOW_S that end the supervisor
FAILURE_WINDOW_S = 60.0
MIN_BACKOFF = 0.5  # seconds before the first restart; doubled by each recent failure
MAX_BACKOFF = 15.0  # seconds
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

    def recent_failures(self, now: float) -> int:
        self.failures = [t for t in self.failures if now - t < FAILURE_WINDOW_S]
        return len(self.failures)


class Supervisor:
    """Keep children running; see the module docstring."""

    def __init__(
        self,
        children: Sequence[tuple[str, Sequence[str]]],
        env: Mapping[str, str],
        *,
        spawn: Spawn = _popen,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = [Child(name, argv) for name, argv in children]
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

    def _start(self, child: Child) -> None:
        child.proc = self.spawn(child.argv, self.env)
        child.started_at = self.clock()
        child.restart_at = None

    def step(self) -> None:
        """Restart what is due and notice what exited since the last step."""
        now = self.clock()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    log.info("starting %s again", child.name)
                    self._start(child)
                continue
            if child.proc is None or child.proc.poll() is None or self.stopping:
                continue
            self._exited(child, child.proc.returncode, now)
            if self.failed:
                return

    def _exited(self, child: Child, code: int, now: float) -> None:
        child.failures.append(now)
        recent = child.recent_failures(now)
        ran = now - child.started_at
        if recent >= MAX_FAILURES:
            self.failed = (
                f"{child.name} exited {recent} times within {FAILURE_WINDOW_S:.0f}s"
                f" (last: {describe_exit(code)}); stopping"
            )
            log.error("%s", self.failed)
            return
        delay = min(MIN_BACKOFF * 2 ** (recent - 1), MAX_BACKOFF)
        child.restart_at = now + delay
        log.error(
            "%s (pid %d) ended after %.1fs: %s; restarting in %.1fs",
            child.name,
            child.proc.pid if child.proc else 0,
            ran,
            describe_exit(code),
            delay,
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
