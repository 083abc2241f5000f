"""queen.headers parses request headers exactly as gevent's own parser does."""

from __future__ import annotations

from io import BytesIO

import pytest
from gevent.pywsgi import headers_factory  # type: ignore[import-untyped]

from queen import headers

TYPICAL = (
    b"Host: 127.0.0.1:8080\r\nUser-Agent: python-requests/2.32\r\n"
    b"Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n"
    b"Content-Type: application/json\r\nContent-Length: 42\r\n\r\n"
)
BLOCKS = [
    TYPICAL,
    TYPICAL + b'{"rest": "is the body, not read"}',
    b"\r\n",
    b"",
    b"Host: x\n\n",  # bare LF line ends
    b"Host: x",  # the stream ends inside a header
    b"Host:x\r\nX-Empty:\r\nX-Spaces: \t  padded  \r\n\r\n",
    b"X-A: 1\r\nx-a: 2\r\nX-A: 3\r\n\r\n",  # repeated, in any case
    b"X-Latin: caf\xe9 \xff\r\n\r\n",
    b"X-Nul: a\x00b\r\n\r\n",
    # Lines the fast path leaves to the email parser:
    b"X-Folded: one\r\n two\r\n\tthree\r\nHost: x\r\n\r\n",
    b" Leading: continuation first\r\nHost: x\r\n\r\n",
    b"No colon here\r\nHost: x\r\n\r\n",
    b": no name\r\nHost: x\r\n\r\n",
    b"From someone\r\nHost: x\r\n\r\n",
    b"Host: x\r\nFrom someone: y\r\n\r\n",
    b"X-Cr: a\rb\r\nHost: x\r\n\r\n",  # a stray CR splits the line for the email parser
    b"X-Cr: a\r\r\nHost: x\r\n\r\n",
    b"Bad Name: x\r\nHost: y\r\n\r\n",
    b"Content-Type: multipart/form-data; boundary=zz\r\nHost: x\r\n\r\n",
    b"Content-Type: message/rfc822\r\nHost: x\r\n\r\n",
]


def parsed(parser, block: bytes):
    fp = BytesIO(block)
    message = parser(fp, 0)
    return (
        list(message._headers),
        message.status,
        fp.tell(),
        message.get("content-length"),
        message.typeheader,
        list(message.headers),
    )


@pytest.mark.parametrize("block", BLOCKS)
def test_same_as_gevents_parser(block: bytes) -> None:
    assert parsed(headers.parse, block) == parsed(headers_factory, block)


def test_a_line_too_long_is_reported_like_gevent() -> None:
    block = b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n"
    assert parsed(headers.parse, block)[1] == parsed(headers_factory, block)[1] == "Line too long"


def test_too_many_headers_are_invalid_client_input() -> None:
    """gevent prints a traceback for an HTTPException from its parser, and only logs a line
    for a ValueError: ours raises the latter (the client gets a 400 either way)."""
    block = b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n"
    with pytest.raises(ValueError, match="more than 100 headers"):
        headers.parse(BytesIO(block), 0)
