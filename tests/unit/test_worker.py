"""The gunicorn worker's handler: what it does instead of gevent's own code, it does alike."""

from __future__ import annotations

from gevent.pywsgi import format_date_time  # type: ignore[attr-defined]

from queen.server import worker


def test_the_date_header_is_gevents_for_the_second_asked() -> None:
    second = 1_767_225_599  # 2025-12-31 23:59:59 UTC; the next one starts a year
    assert worker._http_date(second) == format_date_time(second) == b"Wed, 31 Dec 2025 23:59:59 GMT"
    assert worker._http_date(second + 1) == format_date_time(second + 1)
    assert worker._http_date(second + 1) == b"Thu, 01 Jan 2026 00:00:00 GMT"
    assert worker._http_date(second) == format_date_time(second)  # a clock set back
