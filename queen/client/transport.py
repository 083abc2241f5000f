"""HTTP transport: base URLs with failover, retries with backoff and jitter, typed errors.

A request is sent again, to the next base URL, after
- a connection that failed before anything was sent (refused, DNS, connect timeout),
- a 503 (the server did nothing: PostgreSQL was unreachable or busy);
and, only for requests marked resend (pushes with their transactionIds, acks,
transactions, reads, lease renewals), after an answer lost on the way back (read
timeout, reset): an ack or transaction that applied before is answered so, not refused. A pop is
never sent again after a lost answer: the server may have leased messages that never
arrived. 429 with Retry-After is waited out for resend requests; 4xx otherwise never
retried. After every base URL failed once, the client sleeps (exponential backoff with
jitter) before the next round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import random
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx

from queen import __version__
from queen.client.calls import Call
from queen.client.errors import (
    APIError,
    QueenError,
    RateLimited,
    ResponseLost,
    Unavailable,
    Unreachable,
    error_for,
)

T = TypeVar("T")
log = logging.getLogger("queen.client")

DEFAULT_URL = "http://127.0.0.1:6632"
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is sent again."""

    rounds: int = 4  # passes over every base URL, at least
    base_delay: float = 0.1  # seconds before the second round; doubles each round
    max_delay: float = 5.0  # seconds, the most a pause grows to
    max_retry_after: float = 30.0  # seconds of Retry-After honoured at most
    # Seconds from the first attempt during which a request that found no server, no
    # database (503) or lost its answer is sent again after its rounds are spent: long
    # enough to ride out a database failover. Past the rounds a 503's Retry-After is the
    # shortest pause.
    patience: float = 30.0

    def pause(self, round_no: int) -> float:
        """Seconds to sleep after round round_no (0-based): half fixed, half random."""
        cap = min(self.max_delay, self.base_delay * 2**round_no)
        return cap / 2 + random.uniform(0, cap / 2)


def base_urls(url: str | Sequence[str] | None) -> list[str]:
    """Base URLs from the argument, else QUEEN_URL (comma-separated), else the default."""
    if url is None:
        url = os.environ.get("QUEEN_URL") or DEFAULT_URL
    urls = url.split(",") if isinstance(url, str) else list(url)
    cleaned = [u.strip().rstrip("/") for u in urls if u.strip()]
    if not cleaned:
        raise ValueError("no base URL given")
    return cleaned


def headers(token: str | None) -> dict[str, str]:
    token = token if token is not None else os.environ.get("QUEEN_TOKEN")
    given = {"User-Agent": f"queen-client/{__version__}"}
    if token:
        given["Authorization"] = f"Bearer {token}"
    return given


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def read(call: Call[T], response: httpx.Response) -> T:
    """Parse a response into the call's result, or raise its typed error."""
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = response.text
        raise error_for(response.status_code, body, _retry_after(response))
    if response.status_code == 204 or not response.content:
        return call.parse(None)
    return call.parse(response.json())


class _Attempts:
    """The retry decisions of one request, shared by both transports."""

    def __init__(self, call: Call[Any], urls: list[str], start: int, policy: RetryPolicy) -> None:
        self.call = call
        self.urls = urls
        self.start = start
        self.policy = policy
        self.total = policy.rounds * len(urls)
        self.last: QueenError | None = None
        self.started = time.monotonic()

    def more(self, attempt: int, pause: float) -> bool:
        """Tell whether to send again after attempt (0-based), pausing pause seconds first."""
        if attempt + 1 < self.total:
            return True
        return time.monotonic() + pause - self.started < self.policy.patience

    def url(self, attempt: int) -> str:
        return self.urls[(self.start + attempt) % len(self.urls)] + self.call.path

    def after_not_sent(self, exc: Exception, attempt: int) -> float:
        self.last = Unreachable(f"cannot connect to {self.url(attempt)}: {exc!r}")
        return self._pause(attempt)

    def after_lost(self, exc: Exception, attempt: int) -> float:
        """Pause before resending; raise ResponseLost when the call may not be resent."""
        lost = ResponseLost(f"{self.call.method} {self.url(attempt)}: answer lost ({exc!r})")
        if not self.call.resend:
            raise lost from exc
        self.last = lost
        return self._pause(attempt)

    def after_error(self, error: APIError, attempt: int) -> float:
        """Pause before resending after an error answer; raise it when not worth retrying."""
        if isinstance(error, Unavailable):
            self.last = error
            return self._pause(attempt)
        if isinstance(error, RateLimited) and self.call.resend and error.retry_after is not None:
            self.last = error
            return min(error.retry_after, self.policy.max_retry_after)
        raise error

    def _pause(self, attempt: int) -> float:
        done = attempt + 1
        if done % len(self.urls):
            return 0.0  # the next base URL right away
        pause = self.policy.pause(done // len(self.urls) - 1)
        if done >= self.total and isinstance(self.last, Unavailable) and self.last.retry_after:
            pause = max(pause, min(self.last.retry_after, self.policy.max_retry_after))
        return pause

    def give_up(self) -> QueenError:
        assert self.last is not None
        return self.last


class Transport:
    """Send Calls over one httpx.Client (thread-safe)."""

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        token: str | None = None,
        policy: RetryPolicy | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.urls = base_urls(url)
        self.policy = policy or RetryPolicy()
        self.client = client or httpx.Client(headers=headers(token), timeout=None)
        self._current = 0  # the base URL that answered last

    def send(self, call: Call[T]) -> T:
        attempts = _Attempts(call, self.urls, self._current, self.policy)
        for attempt in itertools.count():
            try:
                response = self.client.request(
                    call.method,
                    attempts.url(attempt),
                    params=call.params,
                    json=call.json,
                    timeout=call.timeout,
                )
            except NOT_SENT as exc:
                pause = attempts.after_not_sent(exc, attempt)
            except httpx.TransportError as exc:
                pause = attempts.after_lost(exc, attempt)
            else:
                try:
                    result = read(call, response)
                except APIError as error:
                    pause = attempts.after_error(error, attempt)
                else:
                    self._current = (attempts.start + attempt) % len(self.urls)
                    return result
            if not attempts.more(attempt, pause):
                break
            log.debug("retrying %s %s in %.2fs: %s", call.method, call.path, pause, attempts.last)
            time.sleep(pause)
        raise attempts.give_up()

    def close(self) -> None:
        self.client.close()


class AsyncTransport:
    """Send Calls over one httpx.AsyncClient."""

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        token: str | None = None,
        policy: RetryPolicy | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.urls = base_urls(url)
        self.policy = policy or RetryPolicy()
        self.client = client or httpx.AsyncClient(headers=headers(token), timeout=None)
        self._current = 0

    async def send(self, call: Call[T]) -> T:
        attempts = _Attempts(call, self.urls, self._current, self.policy)
        for attempt in itertools.count():
            try:
                response = await self.client.request(
                    call.method,
                    attempts.url(attempt),
                    params=call.params,
                    json=call.json,
                    timeout=call.timeout,
                )
            except NOT_SENT as exc:
                pause = attempts.after_not_sent(exc, attempt)
            except httpx.TransportError as exc:
                pause = attempts.after_lost(exc, attempt)
            else:
                try:
                    result = read(call, response)
                except APIError as error:
                    pause = attempts.after_error(error, attempt)
                else:
                    self._current = (attempts.start + attempt) % len(self.urls)
                    return result
            if not attempts.more(attempt, pause):
                break
            log.debug("retrying %s %s in %.2fs: %s", call.method, call.path, pause, attempts.last)
            await asyncio.sleep(pause)
        raise attempts.give_up()

    async def close(self) -> None:
        await self.client.aclose()
