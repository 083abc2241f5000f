"""Falcon resources: parse and validate, call the store, serialise."""

from __future__ import annotations

from typing import Any

import falcon
import orjson

MAX_BODY = 64 * 1024 * 1024  # bytes; larger requests get 413


def read_body(req: falcon.Request) -> bytes:
    """Read the raw request body (sized or chunked), refusing bodies over MAX_BODY."""
    if req.content_length is not None and req.content_length > MAX_BODY:
        raise falcon.HTTPContentTooLarge(description=f"request body over {MAX_BODY} bytes")
    if req.content_length is None and "chunked" in (req.get_header("Transfer-Encoding") or ""):
        # bounded_stream reads nothing without a Content-Length; the server's input
        # stream decodes the chunks and ends with the body.
        body = req.stream.read(MAX_BODY + 1)
    else:
        body = req.bounded_stream.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise falcon.HTTPContentTooLarge(description=f"request body over {MAX_BODY} bytes")
    return body


def send_json(resp: falcon.Response, doc: Any, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(doc)
