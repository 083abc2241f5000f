"""CPU time and memory of processes, read from /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """Return user + system CPU seconds of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def machine() -> str:
    """Describe the CPUs and the load average now, e.g. "2 vCPUs AMD EPYC, load 2.2 2.4 2.8"."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "?"
    return f"{os.cpu_count()} vCPUs {model}, load average {load}"


def rss_bytes(pid: int) -> int:
    """Return the resident set size of a process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def children(pid: int) -> list[int]:
    """Return the direct children of a process."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def pids_named(name: str) -> list[int]:
    """Return the pids whose command name is `name`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == name:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def machine_cpu() -> tuple[float, float]:
    """Return (busy, total) CPU seconds of the whole machine, all cores."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / TICKS, total / TICKS


@dataclass
class CpuMeter:
    """CPU seconds used by named groups of processes between start() and stop()."""

    groups: dict[str, list[int]] = field(default_factory=dict)
    _before: dict[str, float] = field(default_factory=dict)
    _machine: tuple[float, float] = (0.0, 0.0)
    result: dict[str, float] = field(default_factory=dict)

    def start(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self._before = {g: sum(cpu_seconds(p) for p in pids) for g, pids in groups.items()}
        self._machine = machine_cpu()

    def stop(self) -> dict[str, float]:
        """Return each group's share of the machine (1.0 = all cores busy), plus idle/other."""
        busy0, total0 = self._machine
        busy1, total1 = machine_cpu()
        elapsed = max(total1 - total0, 1e-9)
        shares = {}
        for group, pids in self.groups.items():
            used = sum(cpu_seconds(p) for p in pids) - self._before[group]
            shares[group] = max(0.0, used) / elapsed
        busy = (busy1 - busy0) / elapsed
        shares["other"] = max(0.0, busy - sum(shares.values()))
        shares["idle"] = max(0.0, 1.0 - busy)
        self.result = shares
        return shares
