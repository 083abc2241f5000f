"""Tokens, roles, queue globs, the per-worker cache and rate buckets, and protected mode."""

from __future__ import annotations

import pytest

from queen import auth
from queen.auth.cache import TOKEN_TTL_S, RateLimiter, TokenVerifier, retry_after
from queen.config import SettingError, Settings, check_exposure, is_loopback
from queen.errors import InvalidInput
from queen.store.tokens import StoredToken


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tokens_are_random_prefixed_and_well_formed() -> None:
    made = {auth.make_token() for _ in range(100)}
    assert len(made) == 100
    assert all(t.startswith("qn_") and auth.well_formed(t) for t in made)
    assert len(auth.token_hash(next(iter(made)))) == 32


@pytest.mark.parametrize(
    "text", ["", "qn_", "qn_short", "xx_" + "a" * 43, "qn_" + "a" * 44, "qn_" + "é" * 43]
)
def test_malformed_tokens_are_not_well_formed(text: str) -> None:
    assert not auth.well_formed(text)


def test_roles_grant_what_the_issue_lists() -> None:
    p = auth.Permission

    def grants(role: str) -> set[auth.Permission]:
        return {x for x in p if auth.Principal("t", role).may(x)}

    assert grants("reader") == {p.PUBLIC, p.READ}
    assert grants("producer") == {p.PUBLIC, p.READ, p.PUSH}
    assert grants("consumer") == {p.PUBLIC, p.READ, p.CONSUME}
    assert grants("admin") == set(p)


def test_queue_globs() -> None:
    scoped = auth.Principal("t", "reader", auth.parse_queues("orders-*, audit"))
    assert scoped.scoped
    assert scoped.covers("orders-eu") and scoped.covers("audit")
    assert not scoped.covers("audits") and not scoped.covers("billing")
    assert auth.parse_queues("a,*") == ("*",)
    assert not auth.Principal("t", "reader", auth.parse_queues("*")).scoped
    for bad in ("", " , ", "a b", "x/y"):
        with pytest.raises(InvalidInput):
            auth.parse_queues(bad)


def stored(token: str, name: str = "t", rate: float | None = None) -> StoredToken:
    return StoredToken(name, auth.token_hash(token), "reader", "*", rate)


def test_the_verifier_asks_the_database_once_per_period() -> None:
    token, clock, asked = auth.make_token(), Clock(), []

    def find(digest: bytes) -> StoredToken | None:
        asked.append(digest)
        return stored(token) if digest == auth.token_hash(token) else None

    verifier = TokenVerifier(find, clock)
    for _ in range(50):
        principal = verifier.verify(token)
        assert principal is not None and principal.name == "t"
        assert verifier.verify(auth.make_token()) is None
    assert len(asked) == 51  # the token once, each unknown token once
    clock.now += TOKEN_TTL_S
    assert verifier.verify(token) is not None
    assert len(asked) == 52


def test_a_revoked_token_is_refused_after_the_period() -> None:
    token, clock = auth.make_token(), Clock()
    live = {auth.token_hash(token): stored(token)}
    verifier = TokenVerifier(live.get, clock)
    assert verifier.verify(token) is not None
    live.clear()  # revoked
    clock.now += TOKEN_TTL_S * 0.9
    assert verifier.verify(token) is not None  # still trusted from the cache
    clock.now += TOKEN_TTL_S * 0.2
    assert verifier.verify(token) is None


def test_a_row_whose_hash_differs_is_not_trusted() -> None:
    token = auth.make_token()
    verifier = TokenVerifier(lambda digest: stored(auth.make_token()), Clock())
    assert verifier.verify(token) is None


def test_rate_buckets_refill_at_their_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert [limiter.wait_s("a", 2) for _ in range(2)] == [0.0, 0.0]
    wait = limiter.wait_s("a", 2)
    assert wait == pytest.approx(0.5)
    assert limiter.wait_s("b", 2) == 0.0  # buckets are per token
    clock.now += 0.5
    assert limiter.wait_s("a", 2) == 0.0
    assert limiter.wait_s("a", 2) > 0
    slow = [limiter.wait_s("slow", 0.1) for _ in range(2)]
    assert slow[0] == 0.0 and slow[1] == pytest.approx(10.0)
    assert retry_after(0.01) == "1" and retry_after(2.1) == "3"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_protected_mode() -> None:
    check_exposure(Settings.from_env({}))  # 127.0.0.1 by default
    with pytest.raises(SettingError, match="refusing to listen on 0.0.0.0") as refused:
        check_exposure(Settings.from_env({"HOST": "0.0.0.0"}))
    assert "\n" not in str(refused.value)
    check_exposure(Settings.from_env({"HOST": "0.0.0.0", "QUEEN_AUTH": "off"}))
    check_exposure(Settings.from_env({"HOST": "0.0.0.0", "QUEEN_AUTH": "on"}))
    assert Settings.from_env({"QUEEN_AUTH": "ON"}).auth_on
    assert not Settings.from_env({"QUEEN_AUTH": "off"}).auth_on


@pytest.mark.parametrize(
    ("var", "value"), [("QUEEN_AUTH", "yes"), ("QUEEN_METRICS_AUTH", "1"), ("QUEEN_AUTH", "of")]
)
def test_on_off_settings_refuse_other_values(var: str, value: str) -> None:
    with pytest.raises(SettingError, match=var):
        Settings.from_env({var: value})
