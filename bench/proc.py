"""What Linux says about a process's memory, for the benchmarks that measure another process."""

from __future__ import annotations

from pathlib import Path


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, resident now; ``VmHWM``, the peak since
    exec); 0 when the field is absent (a zombie). Raises OSError when the process is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0
