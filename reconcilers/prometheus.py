"""Usage history from Prometheus's HTTP API.

One pass issues a fixed number of instant queries (9), each a subquery over the whole window, so
Prometheus does the per-series work and returns one number per series: never one query per
object. Container usage comes from cAdvisor (``container_cpu_usage_seconds_total``,
``container_memory_working_set_bytes``), node usage from node-exporter (``node_cpu_seconds_total``,
``MemTotal - MemAvailable``, or a query of your own).

A query refused for loading too many samples is split into consecutive sub-windows, combined
conservatively (the highest quantile of the parts: never lower than the exact one would be on
smooth data, and the safe side when it is not).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from oversale.budget import HotTime
from oversale.estimator import UsageStats
from oversale.settings import Settings
from reconcilers.history import ContainerKey, HistoryUnavailable, ResourceStats

log = logging.getLogger(__name__)

CONTAINER_CPU = ('sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total'
                 '{container!="", container!="POD", pod!=""}[$RATE])) * 1000')
CONTAINER_MEMORY = ('max by (namespace, pod, container) (container_memory_working_set_bytes'
                    '{container!="", container!="POD", pod!=""})')
NODE_CPU = 'sum by ({label}) (rate(node_cpu_seconds_total{{mode!~"idle|iowait|steal"}}[$RATE])) * 1000'
NODE_MEMORY = "sum by ({label}) (node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes)"
Points = list[tuple[float, float]]
"""(epoch seconds, value) of one series"""
SPLIT_ERRORS = ("too many samples", "maximum resolution", "exceeded maximum")


@dataclass
class PrometheusHistory:
    url: str
    timeout: float = 30.0
    resolution: float = 300.0
    """Subquery step in seconds (one evaluated point per step and series)."""
    node_label: str = "instance"
    """The label carrying the node name on node-exporter series (``:port`` is stripped)."""
    node_memory_query: str | None = None
    """An expression giving used memory in bytes per node (label ``node_label``)."""
    rate_window: float = 300.0
    """Window of the CPU ``rate()``: at least four scrape intervals."""
    max_splits: int = 8
    queries: int = 0
    """Queries sent so far (for the pass report and the benchmark)."""
    query_seconds: float = 0.0
    """Time spent waiting for Prometheus so far."""

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusHistory:
        return cls(settings.prometheus_url, settings.prometheus_timeout_seconds, settings.prometheus_step_seconds,
                   settings.prometheus_node_label, settings.prometheus_node_memory_query or None,
                   settings.prometheus_rate_window_seconds)

    def container_stats(self, window: float, quantile: float) -> dict[ContainerKey, ResourceStats]:
        keys = ("namespace", "pod", "container")
        cpu = self._summaries(CONTAINER_CPU, window, quantile, keys, with_peak=False)
        memory = self._summaries(CONTAINER_MEMORY, window, quantile, keys, with_peak=True, counts=cpu)
        return {(key[0], key[1], key[2]): ResourceStats(cpu[key], memory.get(key, _EMPTY)) for key in cpu}

    def node_stats(self, window: float, quantile: float,
                   memory_quantile: float | None = None) -> dict[str, ResourceStats]:
        label = self.node_label
        expressions = self._node_expressions()
        cpu = self._summaries(expressions["cpu"], window, quantile, (label,), with_peak=False)
        memory = self._summaries(expressions["memory"], window,
                                 quantile if memory_quantile is None else memory_quantile, (label,), with_peak=False,
                                 counts=cpu)
        return {_node_name(key[0]): ResourceStats(cpu[key], memory.get(key, _EMPTY)) for key in cpu}

    def node_hot_time(self, windows: Sequence[float],
                      real: dict[str, dict[str, float]]) -> list[dict[str, dict[str, HotTime]]]:
        return [self._hot_time_over(window, real) for window in windows]

    def _hot_time_over(self, window: float, real: dict[str, dict[str, float]]) -> dict[str, dict[str, HotTime]]:
        """One count query per resource and distinct real allocatable (the nodes of a pool share
        theirs), plus one count of all samples: the number of queries does not grow with nodes."""
        label, now = self.node_label, time.time()
        expressions = self._node_expressions()
        totals = self._per_window(f"count_over_time(({expressions['cpu']})[$WINDOW:$STEP])", window, now,
                                  (label,), sum)
        samples = {_node_name(key[0]): int(count) for key, count in totals.items()}
        result: dict[str, dict[str, HotTime]] = {}
        for resource, expression in expressions.items():
            for threshold in sorted({values[resource] for values in real.values() if resource in values}):
                above = self._per_window(f"count_over_time((({expression}) > {threshold:.0f})[$WINDOW:$STEP])",
                                         window, now, (label,), sum)
                hot = {_node_name(key[0]): int(count) for key, count in above.items()}
                for node, values in real.items():
                    if values.get(resource) == threshold and node in samples:
                        result.setdefault(node, {})[resource] = HotTime(min(hot.get(node, 0), samples[node]),
                                                                         samples[node])
        return result

    def node_peaks(self, window: float) -> dict[str, dict[str, float]]:
        label, now = self.node_label, time.time()
        result: dict[str, dict[str, float]] = {}
        for resource, expression in self._node_expressions().items():
            for key, value in self._per_window(f"max_over_time(({expression})[$WINDOW:$STEP])", window, now,
                                               (label,), max).items():
                result.setdefault(_node_name(key[0]), {})[resource] = value
        return result

    def _node_expressions(self) -> dict[str, str]:
        """Per resource, the PromQL of a node's usage (node-exporter's, or the configured memory query)."""
        return {"cpu": NODE_CPU.format(label=self.node_label).replace("$RATE", _duration(self.rate_window)),
                "memory": self.node_memory_query or NODE_MEMORY.format(label=self.node_label)}

    # -- queries -----------------------------------------------------------------------------
    def _summaries(
        self,
        expression: str,
        window: float,
        quantile: float,
        keys: tuple[str, ...],
        with_peak: bool,
        counts: dict[tuple[str, ...], UsageStats] | None = None,
    ) -> dict[tuple[str, ...], UsageStats]:
        """quantile (and peak) per series; sample count and last-sample age are queried only when
        ``counts`` (the same series' counts from an earlier call) is not given."""
        now = time.time()
        expression = expression.replace("$RATE", _duration(self.rate_window))
        quantiles = self._per_window(f"quantile_over_time({quantile}, ({expression})[$WINDOW:$STEP])", window, now,
                                     keys, max)
        peaks = self._per_window(f"max_over_time(({expression})[$WINDOW:$STEP])", window, now, keys, max) \
            if with_peak else {}
        if counts is None:
            samples = self._per_window(f"count_over_time(({expression})[$WINDOW:$STEP])", window, now, keys, sum)
            last = self._per_window(f"max_over_time(timestamp({expression})[$WINDOW:$STEP])", window, now, keys, max)
        result = {}
        for key, value in quantiles.items():
            if counts is not None:
                known = counts.get(key)
                count = known.samples if known else 0
                age = known.age_seconds if known else None
            else:
                count = int(samples.get(key, 0))
                age = now - last[key] if key in last else None
            result[key] = UsageStats(value, peaks.get(key, value) if with_peak else None, count,
                                     max(0.0, (count - 1) * self.resolution), age)
        return result

    def _per_window(self, template: str, window: float, now: float, keys: tuple[str, ...],
                    combine: Callable[[list[float]], float]) -> dict[tuple[str, ...], float]:
        """Evaluate over the whole window; if Prometheus refuses the size, over 2, 4, ... parts."""
        parts = 1
        while True:
            try:
                values: dict[tuple[str, ...], list[float]] = {}
                span = window / parts
                for index in range(parts):
                    at = now - index * span
                    query = template.replace("$WINDOW", _duration(span)).replace("$STEP", _duration(self.resolution))
                    for key, value in self._instant(query, at, keys).items():
                        values.setdefault(key, []).append(value)
                return {key: combine(found) for key, found in values.items()}
            except _TooLarge as error:
                if parts >= self.max_splits:
                    raise HistoryUnavailable(f"query too large even in {parts} parts: {error}") from None
                parts *= 2
                log.info("prometheus refused a %s window (%s); splitting in %d", _duration(window), error, parts)

    def _instant(self, query: str, at: float, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        self.queries += 1
        started = time.perf_counter()
        try:
            return self._send(query, at, keys)
        finally:
            self.query_seconds += time.perf_counter() - started

    def query_range(self, query: str, start: float, end: float) -> list[tuple[dict[str, str], Points]]:
        """A range query at ``resolution``: each series' labels and its (time, value) points."""
        self.queries += 1
        payload = self._post("query_range", {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                             "step": f"{self.resolution:g}s"})
        return [(series["metric"], [(float(t), float(v)) for t, v in series["values"] if v != "NaN"])
                for series in payload["data"]["result"]]

    def _send(self, query: str, at: float, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        payload = self._post("query", {"query": query, "time": f"{at:.3f}"})
        result = {}
        for series in payload["data"]["result"]:
            value = float(series["value"][1])
            if value != value:  # NaN: no data in the window for this series
                continue
            result[tuple(series["metric"].get(k, "") for k in keys)] = value
        return result

    def _post(self, endpoint: str, parameters: dict[str, str]) -> dict[str, Any]:
        body = urllib.parse.urlencode({**parameters, "timeout": f"{self.timeout:g}s"}).encode()
        request = urllib.request.Request(f"{self.url.rstrip('/')}/api/v1/{endpoint}", data=body,
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout + 5) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as error:
            payload = _error_payload(error)
            if any(marker in payload.get("error", "") for marker in SPLIT_ERRORS):
                raise _TooLarge(payload["error"]) from None
            reason = payload.get("error", error.reason)
            raise HistoryUnavailable(f"prometheus answered {error.code}: {reason}") from None
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as error:
            raise HistoryUnavailable(f"prometheus at {self.url} unreachable: {error}") from None
        if payload.get("status") != "success":
            error_text = payload.get("error", "unknown error")
            if any(marker in error_text for marker in SPLIT_ERRORS):
                raise _TooLarge(error_text)
            raise HistoryUnavailable(f"prometheus query failed: {error_text}")
        for warning in payload.get("warnings") or []:
            log.warning("prometheus warning (partial data possible): %s", warning)
        result: dict[str, Any] = payload
        return result


class _TooLarge(Exception):
    pass


_EMPTY = UsageStats(None, None, 0, 0.0, None)


def _error_payload(error: urllib.error.HTTPError) -> dict[str, str]:
    try:
        payload: dict[str, str] = json.loads(error.read())
    except ValueError:
        return {}
    return payload


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _node_name(instance: str) -> str:
    host, _, port = instance.rpartition(":")
    return host if host and port.isdigit() else instance
