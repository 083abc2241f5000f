"""Reading request bodies: sized, chunked, and too large either way."""

from __future__ import annotations

import falcon
import falcon.testing
import pytest

from queen import api


def _request(body: bytes, *, chunked: bool) -> falcon.Request:
    env = falcon.testing.create_environ(method="POST", path="/api/v1/push", body=body)
    if chunked:
        env.pop("CONTENT_LENGTH", None)
        env["HTTP_TRANSFER_ENCODING"] = "chunked"
    return falcon.Request(env)


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(api, "MAX_BODY", 100)
    return 100


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_reads_the_whole_body(chunked: bool) -> None:
    body = b'{"items": [{"queue": "q", "payload": 1}]}'
    assert api.read_body(_request(body, chunked=chunked)) == body


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_body_at_the_limit_is_read(small_limit: int, chunked: bool) -> None:
    body = b"x" * small_limit
    assert api.read_body(_request(body, chunked=chunked)) == body


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_body_over_the_limit_is_413(small_limit: int, chunked: bool) -> None:
    with pytest.raises(falcon.HTTPContentTooLarge):
        api.read_body(_request(b"x" * (small_limit + 1), chunked=chunked))


def test_no_body() -> None:
    assert api.read_body(_request(b"", chunked=False)) == b""
