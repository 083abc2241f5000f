"""Request headers parsed without the email package (gevent's parser), same results.

gevent.pywsgi reads a request's headers with http.client.parse_headers, which hands
them to email.parser, a visible share of a worker's CPU end to end. Header lines of the
usual shape (a name, a colon, a value on one line) are split here directly into the
message class gevent uses; a block with any other line (folded, without a name, with a stray CR, a "From "
line) goes to the email parser as before, so every request gets what gevent's own
parser would give it.
"""

from __future__ import annotations

import re
from http import client
from io import BytesIO
from typing import Any

from gevent.pywsgi import OldMessage  # type: ignore[import-untyped]

MAX_LINE = 65536  # http.client's limits (_MAXLINE, _MAXHEADERS)
MAX_HEADERS = 100


class InvalidHeaders(ValueError):
    """The request's header block cannot be read (gevent answers 400 and logs one line)."""


# A field name as the email parser recognises one (printable ASCII but ':'), then ':'.
FIELD = re.compile(r"[\x21-\x39\x3b-\x7e]+:")


def parse(fp: Any, *_args: Any) -> Any:
    """Read the header block from fp; return gevent's message for it."""
    lines = []
    while True:
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            message = OldMessage()
            message.status = "Line too long"
            return message
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise InvalidHeaders(f"more than {MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    message = OldMessage()
    for line in lines[:-1]:
        text = line.decode("iso-8859-1")
        if text.endswith("\r\n"):
            body = text[:-2]
        elif text.endswith("\n"):
            body = text[:-1]
        else:
            body = text  # the last line of a stream that ended
        if "\r" in body or "\n" in body or not FIELD.match(body):
            try:
                return client.parse_headers(BytesIO(b"".join(lines)), _class=OldMessage)
            except client.HTTPException as exc:
                raise InvalidHeaders(str(exc) or type(exc).__name__) from exc
        name, value = body.split(":", 1)
        message.set_raw(name, value.lstrip(" \t"))
    return message
