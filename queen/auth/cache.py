"""Per-worker token checks without a database call per request: a short cache and rate buckets.

A verified token (or an unknown one) is trusted for TOKEN_TTL_S, so a token revoked in
the database stops working on every worker within that time; a worker asks the
database about a given token at most once per period.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from queen.auth import Principal, parse_queues, token_hash

if TYPE_CHECKING:
    from queen.store.tokens import StoredToken

TOKEN_TTL_S = 0.5  # seconds a lookup is trusted: revocation reaches every worker within it
MAX_CACHED = 10_000  # lookups kept per worker; the cache starts over when it is full


class _Cached(NamedTuple):
    principal: Principal | None
    expires_at: float


class TokenVerifier:
    """Turn a presented token into its Principal (None: unknown or revoked)."""

    def __init__(
        self,
        find: Callable[[bytes], StoredToken | None],
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = TOKEN_TTL_S,
    ) -> None:
        self._find = find
        self._clock = clock
        self._ttl_s = ttl_s
        self._cache: dict[bytes, _Cached] = {}  # by hash: no token is kept in memory

    def verify(self, token: str) -> Principal | None:
        digest = token_hash(token)
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and cached.expires_at > now:
            return cached.principal
        principal = self._lookup(digest)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[digest] = _Cached(principal, now + self._ttl_s)
        return principal

    def _lookup(self, digest: bytes) -> Principal | None:
        stored = self._find(digest)
        if stored is None or not hmac.compare_digest(stored.token_hash, digest):
            return None
        return Principal(
            name=stored.name,
            role=stored.role,
            queues=parse_queues(stored.queues),
            rate=stored.rate,
        )


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class RateLimiter:
    """A token bucket per token name, in this worker: `rate` requests per second, burst `rate`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def wait_s(self, name: str, rate: float) -> float:
        """Take one request from name's bucket: 0 when allowed, else seconds until one is."""
        capacity = max(1.0, rate)
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._buckets[name] = _Bucket(capacity, now)
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
            bucket.at = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / rate


def retry_after(wait_s: float) -> str:
    """Format a Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
