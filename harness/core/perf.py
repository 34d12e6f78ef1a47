"""Process-level tuning for the harness's own processes (CLI commands and sweep workers).

glibc's malloc serves large blocks (a [64, 4096] float64 temporary is 2 MiB) with a fresh mmap
and returns them with munmap, so every tensor operation on such blocks pays page faults for
memory it just gave back.  On CPU this made the vectorized GAE 3-6x slower inside a process that
had allocated and freed many tensors before (measured in benchmarks/bench_gae.py), and it taxes
every training step the same way.  Raising the mmap and trim thresholds keeps freed blocks in the
heap for reuse, as tcmalloc or jemalloc would.  Library users keep their own allocator settings:
only ``harness`` entry points call :func:`tune_malloc`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_THRESHOLD = 512 * 1024 * 1024  # glibc's ceiling for the mmap threshold on 64-bit


@functools.lru_cache(maxsize=1)
def tune_malloc() -> bool:
    """Keep freed large blocks in the heap (glibc only); returns whether it took effect."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, _THRESHOLD) == 1 and ok
    return ok
