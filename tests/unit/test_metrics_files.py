"""Reading every worker's metrics files while a worker is still creating its own."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from queen.api.metrics import _WorkersCollector


def test_a_file_a_worker_is_still_creating_fails_no_scrape(tmp_path: Path) -> None:
    written = MmapedDict(str(tmp_path / "counter_101.db"))
    key = mmap_key("queen_messages", "queen_messages_total", ["operation"], ["pushed"], "")
    written.write_value(key, 21.0, 0.0)
    written.close()
    (tmp_path / "counter_102.db").touch()  # created, not yet sized by its worker
    with pytest.raises(struct.error):  # (what prometheus_client alone does with it)
        list(multiprocess.MultiProcessCollector(None, path=str(tmp_path)).collect())
    (metric,) = _WorkersCollector(None, path=str(tmp_path)).collect()
    assert [(s.name, s.labels, s.value) for s in metric.samples] == [
        ("queen_messages_total", {"operation": "pushed"}, 21.0)]
