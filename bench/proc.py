"""What Linux says about a process's memory and cpu, for the benchmarks that measure another process."""

from __future__ import annotations

import os
from pathlib import Path


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, resident now; ``VmHWM``, the peak since
    exec); 0 when the field is absent (a zombie). Raises OSError when the process is gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """The cpu time ``pid`` has used since it started, user and system, all its threads (fields
    14 and 15 of ``/proc/<pid>/stat``, in clock ticks; counted after the command's closing
    parenthesis, since the command itself may hold spaces). Raises OSError when it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
