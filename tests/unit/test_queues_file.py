"""The CLI's queue options are the server's."""

from __future__ import annotations

from queen.client.queues_file import OPTION_FLAGS, OPTION_TYPES
from queen.models import QUEUE_OPTIONS


def test_the_clis_options_are_the_servers() -> None:
    assert {o.name: o.type for o in QUEUE_OPTIONS} == OPTION_TYPES
    assert {o.name: o.column for o in QUEUE_OPTIONS} == OPTION_FLAGS
