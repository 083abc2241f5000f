"""API tokens and roles: what a token looks like, what each role may do, which queues it covers.

A token is `qn_` and 43 URL-safe base64 characters (32 random bytes). Only its SHA-256
hash is stored; a request's token is found by that hash. Roles grant permissions:

    reader   read                      (every GET but pop, the dashboard)
    producer read, push
    consumer read, consume             (pop, ack)
    admin    everything                (configure, delete, retry, dead-letter, clear)
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import hashlib
import re
import secrets

from queen.errors import InvalidInput

PREFIX = "qn_"
TOKEN_BYTES = 32
TOKEN = re.compile(r"qn_[A-Za-z0-9_-]{43}")  # matched whole; what make_token returns
MAX_TOKEN_TEXT = 256  # characters of an Authorization header value looked at
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")  # token names, matched whole
GLOB = re.compile(r"[A-Za-z0-9._:@*?\[\]!-]{1,128}")  # one queue glob, matched whole
EVERY_QUEUE = "*"


class Permission(enum.Enum):
    """What a route asks of the token that calls it."""

    PUBLIC = "public"  # no token needed
    READ = "read"
    PUSH = "push"
    CONSUME = "consume"
    ADMIN = "admin"


ROLES: dict[str, frozenset[Permission]] = {
    "reader": frozenset({Permission.READ}),
    "producer": frozenset({Permission.READ, Permission.PUSH}),
    "consumer": frozenset({Permission.READ, Permission.CONSUME}),
    "admin": frozenset(Permission),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """The token a request authenticated with."""

    name: str
    role: str
    queues: tuple[str, ...] = (EVERY_QUEUE,)  # fnmatch globs
    rate: float | None = None  # requests per second per worker; None: unlimited

    @property
    def scoped(self) -> bool:
        """Tell whether the token is limited to some queues."""
        return self.queues != (EVERY_QUEUE,)

    def may(self, permission: Permission) -> bool:
        return permission is Permission.PUBLIC or permission in ROLES[self.role]

    def covers(self, queue: str) -> bool:
        """Tell whether queue is one this token may use."""
        return any(fnmatch.fnmatchcase(queue, glob) for glob in self.queues)


def make_token() -> str:
    """Return a new random token (shown once; only its hash is kept)."""
    return PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> bytes:
    """Return the SHA-256 digest a token is stored and looked up by."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def well_formed(token: str) -> bool:
    """Tell whether text has a token's shape (others are refused without a lookup)."""
    return len(token) <= MAX_TOKEN_TEXT and TOKEN.fullmatch(token) is not None


def parse_queues(text: str) -> tuple[str, ...]:
    """Check a comma-separated list of queue globs (`--queues`)."""
    globs = tuple(g.strip() for g in text.split(",") if g.strip())
    if not globs:
        raise InvalidInput("--queues needs at least one queue name or glob")
    for glob in globs:
        if not GLOB.fullmatch(glob):
            raise InvalidInput(f"invalid queue glob {glob[:64]!r}")
    return (EVERY_QUEUE,) if EVERY_QUEUE in globs else globs


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid token name {name[:64]!r}: 1-64 letters, digits and . _ : @ - (not first)"
        )
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}")
    return role
