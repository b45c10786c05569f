"""The trace formats the replay reads: their names and the header that identifies each.

Kept apart from ``simulator.trace`` (which needs numpy) so the command-line parsers can offer the
names without loading the replay.
"""

from __future__ import annotations

BITBRAINS_COLUMNS = ("vm_id", "timestamp_s", "cpu_cores", "cpu_capacity_provisioned_mhz", "cpu_usage_mhz",
                     "memory_capacity_provisioned_kb", "memory_usage_kb")
GENERIC_COLUMNS = ("workload", "timestamp_s", "cpu_request_cores", "cpu_usage_cores", "memory_request_bytes",
                   "memory_usage_bytes")
FIXED_COLUMN = "fixed_resources"
"""Optional ``generic`` column: resources whose requests no right-sizing changes for that workload,
space-separated (``cpu``, ``cpu memory``; ``python -m reconcilers plan`` writes it for workloads a
HorizontalPodAutoscaler scales on that resource's utilization, which the live reconciler leaves
alone)."""
FORMATS = {"bitbrains-long": BITBRAINS_COLUMNS, "generic": GENERIC_COLUMNS}
"""Long formats: one row per (workload, time), identified by holding all of these columns."""
AZURE_STEP = "step_5min"
"""First column of the Azure Public Dataset V1 cpu readings as DataCenterSim repackages them: one
row per 5-minute step, one column per VM, values in percent of the VM's allocated vCPUs."""
WIDE_FORMATS = {"azure-wide": AZURE_STEP}
"""Wide formats: one row per time step, identified by their first column."""
BITBRAINS_RAW = "bitbrains-raw"
"""GWA-T-12 as the archive ships it: one file per VM (``rnd/2013-7/1.csv``), named by the VM,
columns separated by ``;`` and a tab; a directory of them (months in subdirectories) is a trace."""
BITBRAINS_RAW_COLUMNS = ("Timestamp [ms]", "CPU cores", "CPU capacity provisioned [MHZ]", "CPU usage [MHZ]",
                         "Memory capacity provisioned [KB]", "Memory usage [KB]")
"""The columns of a per-VM file the replay reads, in ``BITBRAINS_COLUMNS``' order after ``vm_id``."""
FORMAT_NAMES = (*FORMATS, *WIDE_FORMATS, BITBRAINS_RAW)
