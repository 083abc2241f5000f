"""Give the memory of huge requests back to the system when they are done.

glibc's malloc serves a large allocation from its own mapping and unmaps it on free,
but after the first such free it raises that threshold to the size freed (up to
32 MiB), so the next huge bodies come from the heap, which keeps what it grew to: one
huge request leaves a worker well above its baseline. A fixed threshold keeps
every allocation from MMAP_THRESHOLD_BYTES up in its own mapping, returned on free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1024 * 1024


def return_large_frees() -> bool:
    """Fix malloc's mmap threshold (glibc); tell whether it was set."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc: nothing to tune
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.warning("could not fix malloc's mmap threshold")
        return False
    return True
