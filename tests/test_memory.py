"""dra_driver.memory: freed heap goes back to the kernel, and the arena cap is taken (glibc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import sys
    from dra_driver import memory

    def rss_mb():
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) // 1024

    assert memory.limit_arenas()
    blocks = [bytearray(100_000) for _ in range(2000)]  # below the mmap threshold: on the heap
    keep = bytearray(100_000)  # above them, so free() alone cannot shrink the heap
    del blocks
    before = rss_mb()
    memory.trim()
    print(before, rss_mb())
    """
)


def test_trim_hands_freed_heap_back_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 150, (before, after)  # ~200 MB were freed but still resident
