"""Prometheus's HTTP API, as every adapter reads it: instant and range queries, the node usage
expressions of node-exporter, and the errors a caller turns into "no history" (the reconcilers'
usage history, the extender's long load windows).

    >>> node_name("node-1:9100"), node_name("node-1"), duration(299.6), duration(0.2)
    ('node-1', 'node-1', '300s', '1s')
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube.client import first_few
from oversale.settings import Settings

log = logging.getLogger(__name__)

NODE_CPU = ('sum by ({label}) (max by ({label}, cpu, mode) '
            '(rate(node_cpu_seconds_total{{mode!~"idle|iowait|steal"}}[$RATE]))) * 1000')
"""Millicores a node's processes use (node-exporter), per node label. ``max by`` each cpu and mode
first: an exporter scraped by two jobs (or two Prometheus replicas federated) counts once."""
NODE_MEMORY = "max by ({label}) (node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes)"
"""Bytes of memory a node uses (node-exporter), per node label (``max``: one exporter scraped twice
counts once)."""
NODE_MEMORY_REPORTED = "max by ({label}) (node_memory_MemAvailable_bytes)"
"""A node's memory as reported at all: one of :data:`NODE_MEMORY`'s two gauges, scraped with the
other, so the steps it has are the steps the usage has, with no subtraction to evaluate at each.
Still aggregated at each step, not counted per series and then combined: the most of the series'
counts would miss the steps before an exporter's restart (its Pod's new name labels a new
series), their sum count an exporter scraped by two jobs twice."""
APP_CONTAINERS = '{container!="", container!="POD", pod!=""}'
"""cAdvisor's series of the app containers: not the pause container (``container="POD"``), nor the
Pod's own cgroup (``container=""``), which holds its containers' usage again."""
# cAdvisor names a container's cgroup in ``id``. The same ``id`` twice is one cgroup scraped twice
# (two jobs, or kubelet and a standalone cAdvisor): counted once. Two ``id`` of one container are
# its cgroups before and after a restart: each counter's rate covers part of the rate window, so
# they add up.
CONTAINER_CPU = ('sum by (namespace, pod, container) (max by (namespace, pod, container, id) '
                 f'(rate(container_cpu_usage_seconds_total{APP_CONTAINERS}[$RATE]))) * 1000')
"""Millicores each app container uses (cAdvisor)."""
CONTAINER_MEMORY = f"max by (namespace, pod, container) (container_memory_working_set_bytes{APP_CONTAINERS})"
"""Working-set bytes of each app container (cAdvisor)."""
POD_CPU = f"sum by (namespace, pod) ({CONTAINER_CPU})"
"""Millicores each Pod's app containers use together."""
POD_MEMORY = f"sum by (namespace, pod) ({CONTAINER_MEMORY})"
"""Working-set bytes of each Pod's app containers together."""
POD_OWNER = ('max by (namespace, pod, owner_kind, owner_name) '
             '(last_over_time(kube_pod_owner{owner_is_controller="true"}[$WINDOW]))')
"""Each Pod's controller seen over the window (kube-state-metrics)."""
OWNER_CONTROLLERS = {"ReplicaSet": ("kube_replicaset_owner", "replicaset"), "Job": ("kube_job_owner", "job_name")}
"""kube-state-metrics' series naming the controller of a Pod's owner: a ReplicaSet's Deployment,
a Job's CronJob (kind of the Pod's owner -> metric, label of the owner's name)."""
NO_OWNER = (None, "", "<none>")
"""What kube-state-metrics writes in ``owner_kind`` for an object without one."""


def controller_query(metric: str, label: str, window: float | None = None) -> str:
    """The PromQL of each object's controller in one of ``OWNER_CONTROLLERS``' series (``label``
    naming the object); with ``window``, every controller seen over it (for an instant query)."""
    series = f"last_over_time({metric}[{duration(window)}])" if window else metric
    return f"max by (namespace, {label}, owner_kind, owner_name) ({series})"
SPLIT_ERRORS = ("too many samples", "maximum resolution", "exceeded maximum", "-search.maxSamplesPerQuery",
                "-search.maxSamplesPerSeries", "-search.maxPointsPerTimeseries")
"""What Prometheus (``--query.max-samples``, 11,000 points a series) and VictoriaMetrics (its
``-search.max*`` limits on the samples a query reads or the points it answers) say when a query's
window holds too many: split it and ask again."""
RANGE_STEPS = 10_000
"""Steps asked per range query: under Prometheus's limit of 11,000 points per series."""
Series = tuple["array[float]", "array[float]"]
"""One series of a range query: (epoch seconds, values), two arrays of doubles. 16 bytes a point,
where tuples of floats took about seven times that: a cluster's 14 days at 5 minutes are millions
of points."""


class PrometheusUnavailable(Exception):
    """Prometheus cannot answer: unreachable, an error status, a failed query."""


class QueryTooLarge(PrometheusUnavailable):
    """Prometheus refused the query for the samples it would load; a smaller window may pass."""


class QueryInvalid(PrometheusUnavailable):
    """Prometheus cannot run the query as written (``errorType`` bad_data: a parse error, an
    unknown function, a range where a vector is needed): asking again will not help."""


class QueryTimedOut(PrometheusUnavailable):
    """The query ran past its timeout, in Prometheus (``errorType`` timeout, or a context
    deadline met while it expanded the series) or waiting for the answer."""


@dataclass(frozen=True)
class PrometheusAccess:
    """What reaching this cluster's series takes besides Prometheus's URL: credentials where it
    sits behind authentication (an OpenShift or kube-rbac-proxy front wanting a ServiceAccount
    token, a Mimir, Cortex or Thanos tenant header, a private CA), and a selector where it holds
    several clusters. A ``user:password@`` in the URL is sent as basic auth."""

    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every query (``OVERSALE_PROMETHEUS_HEADERS``)."""
    bearer_token_file: str = ""
    """A file holding a bearer token, read again for every query: a projected ServiceAccount
    token is rotated by the kubelet while the process runs (``OVERSALE_PROMETHEUS_BEARER_TOKEN_FILE``)."""
    ca_file: str = ""
    """PEM certificates an https Prometheus is verified against instead of the system's
    (``OVERSALE_PROMETHEUS_CA_FILE``)."""
    selector: str = ""
    """Label matchers every series read must also match (``OVERSALE_PROMETHEUS_SELECTOR``, such
    as ``cluster="prod-eu"``): where one Prometheus, Thanos or VictoriaMetrics holds several
    clusters, as a tenant header picks a Mimir tenant. See :func:`scoped`."""
    partial_answers: bool = False
    """Whether an answer holding part of the store's data is read
    (``OVERSALE_PROMETHEUS_PARTIAL_ANSWERS``). By default each query asks for all of it or an
    error (:data:`WHOLE_ANSWERS`), and an answer marked partial anyway is refused."""

    @classmethod
    def from_settings(cls, settings: Settings) -> PrometheusAccess:
        return cls(settings.prometheus_headers, settings.prometheus_bearer_token_file, settings.prometheus_ca_file,
                   settings.prometheus_selector, settings.prometheus_partial_answers)


WHOLE_ANSWERS = {"partial_response": "false", "deny_partial_response": "1"}
"""Form parameters asking a store that spans several (a Thanos querier, a VictoriaMetrics
cluster's vmselect) for the whole answer or an error. Both answer with what the reachable stores
hold by default, Thanos with a warning, VictoriaMetrics with ``"isPartial": true``: a week's
quantile or hot-time count from a querier whose store gateway is down would come from the
sidecar's last hours, and kept between passes. Prometheus, Mimir and VictoriaMetrics single-node
ignore them."""


@dataclass
class PrometheusAPI:
    """One Prometheus (or a server speaking its HTTP API): instant and range queries, with the
    credentials of ``access``, and its failures as the errors callers turn into "no history"."""

    url: str
    """Its base URL; a ``user:password@`` in it is sent as basic auth, and never shown."""
    timeout: float = 30.0
    access: PrometheusAccess = field(default_factory=PrometheusAccess)
    shown: str = field(init=False)
    """The URL without its credentials: what messages name."""
    _base: str = field(init=False, repr=False)
    _basic: str | None = field(init=False, repr=False)
    _tls: ssl.SSLContext | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        # urllib takes "user:password@host" for the host name: the credentials go in a header.
        scheme, netloc, path, _, _ = urllib.parse.urlsplit(self.url.rstrip("/"))
        userinfo, at, host = netloc.rpartition("@")
        self._base = self.shown = urllib.parse.urlunsplit((scheme, host, path, "", ""))
        self._basic = None
        if at:
            user, _, password = userinfo.partition(":")
            pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
            self._basic = "Basic " + base64.b64encode(pair.encode()).decode()

    @property
    def described(self) -> str:
        """What a log line at start says is read: the URL without credentials, and the selector."""
        selector = self.access.selector
        return f"Prometheus at {self.shown}" + (f", series matching {{{selector}}}" if selector else "")

    def instant(self, query: str, at: float, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        """An instant query at ``at``: each series' value by the labels ``keys`` (NaN left out:
        no data in the window for that series)."""
        payload = self._post("query", {"query": query, "time": f"{at:.3f}"})
        result = {}
        try:
            for series in payload["data"]["result"]:
                value = float(series["value"][1])
                if value == value:
                    result[tuple(series["metric"].get(k, "") for k in keys)] = value
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise PrometheusUnavailable(f"prometheus at {self.shown} answered no instant vector ({error!r})") from None
        return result

    def query_range(self, query: str, start: float, end: float, step: float, part_steps: int = RANGE_STEPS,
                    on_request: Callable[[], None] | None = None) -> list[tuple[dict[str, str], Series]]:
        """A range query: each series' labels and its points. It is asked in consecutive parts of
        at most ``part_steps`` steps (:meth:`range_parts`) and each series' points joined."""
        series: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], Series]] = {}
        for part in self.range_parts(query, start, end, step, part_steps, on_request):
            for labels, (times, values) in part:
                joined = series.setdefault(tuple(sorted(labels.items())), (labels, (array("d"), array("d"))))[1]
                joined[0].extend(times)
                joined[1].extend(values)
        return list(series.values())

    def range_parts(self, query: str, start: float, end: float, step: float, part_steps: int = RANGE_STEPS,
                    on_request: Callable[[], None] | None = None, newest_first: bool = False,
                    part_points: int | None = None) -> Iterator[list[tuple[dict[str, str], Series]]]:
        """A range query in consecutive parts of at most ``part_steps`` steps, oldest first or
        ``newest_first``, each part's series as they come: Prometheus refuses more than 11,000
        steps per series (40 days at 5 minutes), and an answer's JSON takes about ten times the
        memory of its points while it is read, so a smaller part bounds that too. With
        ``part_points``, the parts after the first hold about that many points (steps x the
        series the part before had). A part Prometheus refuses for the samples it would load is
        asked again in halves (QueryTooLarge only when a single step is refused). ``on_request``
        is called before each request sent, for a caller counting them."""
        if not (step > 0 and math.isfinite(start) and math.isfinite(end) and 0 < part_steps <= RANGE_STEPS):
            raise ValueError(f"a range query needs a finite start and end, a positive step and 1 to {RANGE_STEPS} "
                             f"steps a part, not {start!r}, {end!r}, {step!r}, {part_steps!r}")
        # Points fall at start + k x step; the next part starts one step after this one's last
        # (or, newest first, ends one step before this one's first).
        steps = math.floor((end - start) / step + 1e-9) + 1
        low, high = 0, steps - 1  # the steps not asked yet
        while low <= high:
            size = min(part_steps, high - low + 1)
            first, last = (high - size + 1, high) if newest_first else (low, low + size - 1)
            try:
                if on_request is not None:
                    on_request()
                payload = self._post("query_range", {"query": query, "start": f"{start + first * step:.3f}",
                                                     "end": f"{start + last * step:.3f}",
                                                     "step": _api_duration(step)}, series_points=True)
            except QueryTooLarge as error:
                if size <= 1:
                    raise
                # --query.max-samples counts every sample a query loads: fewer steps load fewer.
                # Halved from the steps this part asked, not from a limit far above a short range's.
                part_steps = max(1, size // 2)
                log.info("prometheus refused a range of %s (%s); asking %d steps at a time",
                         duration(size * step), error, part_steps)
                continue
            part: list[tuple[dict[str, str], Series]] = []
            try:
                for found in payload["data"]["result"]:
                    points = found["values"]
                    if not isinstance(points, tuple):
                        raise TypeError(f"points {str(points)[:60]}")
                    part.append((found["metric"], points))
            except (KeyError, TypeError, ValueError) as error:
                raise PrometheusUnavailable(f"prometheus at {self.shown} answered no range vector "
                                            f"({error!r})") from None
            del payload  # before the next part is read
            yield part
            if part_points is not None and part:
                part_steps = max(1, min(RANGE_STEPS, part_points // len(part)))
            if newest_first:
                high = first - 1
            else:
                low = last + 1

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/x-www-form-urlencoded", **dict(self.access.headers)}
        if self._basic is not None:
            headers["Authorization"] = self._basic
        if self.access.bearer_token_file:
            try:
                token = Path(self.access.bearer_token_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as error:
                raise PrometheusUnavailable(f"cannot read the bearer token file for prometheus at {self.shown}: "
                                            f"{error}") from None
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _context(self) -> ssl.SSLContext | None:
        if self.access.ca_file and self._tls is None:
            try:
                self._tls = ssl.create_default_context(cafile=self.access.ca_file)
            except (OSError, ssl.SSLError) as error:
                raise PrometheusUnavailable(f"cannot load the CA file {self.access.ca_file} for prometheus at "
                                            f"{self.shown}: {error}") from None
        return self._tls

    def _post(self, endpoint: str, parameters: dict[str, str], series_points: bool = False) -> dict[str, Any]:
        """The answer's JSON; with ``series_points`` (a range query's), each series' points read
        into two arrays as soon as the series is (:func:`_series_points`)."""
        if self.access.selector:
            parameters = {**parameters, "query": scoped(parameters["query"], self.access.selector)}
        whole = {} if self.access.partial_answers else WHOLE_ANSWERS
        body = urllib.parse.urlencode({**parameters, **whole, "timeout": _api_duration(self.timeout)}).encode()
        request = urllib.request.Request(f"{self._base}/api/v1/{endpoint}", data=body, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout + 5, context=self._context()) as response:
                kind, text = response.headers.get_content_type(), response.read()
        except urllib.error.HTTPError as error:
            payload = _error_payload(error)
            if any(marker in payload.get("error", "") for marker in SPLIT_ERRORS):
                raise QueryTooLarge(payload["error"]) from None
            reason = payload.get("error", error.reason)
            if payload.get("errorType") == "timeout" or "deadline exceeded" in payload.get("error", ""):
                raise QueryTimedOut(f"prometheus at {self.shown} answered {error.code}: {reason}") from None
            if payload.get("errorType") == "bad_data":
                raise QueryInvalid(f"prometheus at {self.shown} answered {error.code}: {reason}") from None
            if error.code in (401, 403):
                reason = (f"{reason} (credentials: a user:password@ in the URL, OVERSALE_PROMETHEUS_BEARER_TOKEN_FILE "
                          "or OVERSALE_PROMETHEUS_HEADERS)")
            raise PrometheusUnavailable(f"prometheus at {self.shown} answered {error.code}: {reason}") from None
        except TimeoutError as error:
            raise QueryTimedOut(f"prometheus at {self.shown} did not answer within {self.timeout + 5:g}s: "
                                f"{error}") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            if isinstance(error, urllib.error.URLError) and isinstance(error.reason, TimeoutError):
                raise QueryTimedOut(f"prometheus at {self.shown} unreachable: {error}") from None
            raise PrometheusUnavailable(f"prometheus at {self.shown} unreachable: {error}") from None
        except http.client.HTTPException as error:
            # Another protocol's port (BadStatusLine) or an answer cut short (IncompleteRead).
            raise PrometheusUnavailable(f"prometheus at {self.shown} sent no complete HTTP answer: "
                                        f"{type(error).__name__}: {str(error).strip()[:120]}") from None
        try:
            answer: Any = json.loads(text, object_hook=_series_points if series_points else None)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            # A login page, a proxy's error page or Grafana's UI answer 200 too: name what came.
            raise PrometheusUnavailable(f"{self.shown} answered {kind}, not the Prometheus HTTP API's JSON "
                                        "(is it the URL of Prometheus itself?)")
        payload = answer
        if payload.get("status") != "success":
            error_text = payload.get("error", "unknown error")
            if any(marker in error_text for marker in SPLIT_ERRORS):
                raise QueryTooLarge(error_text)
            raise PrometheusUnavailable(f"prometheus query failed: {error_text}")
        partial: object = payload.get("isPartial")
        if partial is True:
            if not self.access.partial_answers:
                raise PrometheusUnavailable(
                    f"{self.shown} answered with part of its data (isPartial: a storage node unreachable), refused; "
                    "OVERSALE_PROMETHEUS_PARTIAL_ANSWERS=true reads such answers")
            log.warning("%s answered with part of its data (isPartial: a storage node unreachable)", self.shown)
        for warning in payload.get("warnings") or []:
            log.warning("prometheus warning (partial data possible): %s", warning)
        result: dict[str, Any] = payload
        return result


def _series_points(read: dict[str, Any]) -> dict[str, Any]:
    """A JSON object hook for a range query's answer: a series' ``values`` (``[time, "value"]``
    pairs) as two arrays, times and values (NaN left out), as soon as the series is read. The
    whole answer read as lists took 200 bytes a point, the arrays take 16: a request of 500,000
    points held 100 MB (two read at once, the bench's first pass peaked 270 MB higher). Left as
    it is where it is not such a list (the caller says the answer is no range vector)."""
    values = read.get("values")
    if "metric" not in read or not isinstance(values, list):
        return read
    times, numbers = array("d"), array("d")
    try:
        for t, v in values:
            if v != "NaN":
                times.append(float(t))
                numbers.append(float(v))
    except (TypeError, ValueError):
        return read
    read["values"] = (times, numbers)
    return read


def node_expressions(label: str, rate_window: float, memory_query: str | None = None,
                     cpu_query: str | None = None) -> dict[str, str]:
    """Per resource, the PromQL of a node's usage (cpu in millicores, memory in bytes):
    node-exporter's, or the configured queries (cpu in cores).

    A node-exporter reports one cpu counter per cpu and mode, so the default cpu expression rates
    and sums some 80 series per node of 16 cpus at every step of a week's history; a recording
    rule that already holds each node's sum (kube-prometheus-stack's ``instance:node_cpu:rate:sum``) is
    one series per node."""
    counters = NODE_CPU.format(label=label).replace("$RATE", duration(rate_window))
    return {"cpu": f"({cpu_query}) * 1000" if cpu_query else counters,
            "memory": memory_query or NODE_MEMORY.format(label=label)}


def pod_mean_expressions(window: float, rate_window: float, step: float) -> dict[str, str]:
    """Per resource, the PromQL of what each Pod's app containers used together on average over
    the part of ``window`` the Pod ran (cpu in millicores, memory in bytes): each container's
    usage summed over the window (each cgroup once, its restarts' cgroups added), divided by the
    Pod's time in the window (its longest-lived container's samples; cpu at ``step``).

    It is the mean of the Pod's summed usage at each step, with the aggregations outside the
    subquery: Prometheus evaluates an aggregation inside a subquery at every step, which took 3.5
    to 4 times as long for the same figures (``python -m bench.workload_history``).
    """
    rate = f"rate(container_cpu_usage_seconds_total{APP_CONTAINERS}[{duration(rate_window)}])"
    cpu = f"{rate}[{duration(window)}:{duration(step)}]"
    memory = f"container_memory_working_set_bytes{APP_CONTAINERS}[{duration(window)}]"

    def mean(samples: str) -> str:
        per_cgroup = "max by (namespace, pod, container, id)"
        per_container = f"sum by (namespace, pod, container) ({per_cgroup} (count_over_time({samples})))"
        return (f"sum by (namespace, pod) ({per_cgroup} (sum_over_time({samples}))) / on (namespace, pod) "
                f"max by (namespace, pod) ({per_container})")

    return {"cpu": f"{mean(cpu)} * 1000", "memory": mean(memory)}


_PROMQL_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<number>\.?\d[\w.]*)
  | (?P<name>[a-zA-Z_:][\w:]*)
  | (?P<other>.)""", re.VERBOSE | re.DOTALL)
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
"""Keywords a list of label names in parentheses follows: the names in it are no metrics."""
_OPERATORS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                 "quantile", "limitk", "limit_ratio"}


def scoped(query: str, selector: str) -> str:
    """``query`` with the label matchers ``selector`` added to each of its series selectors, so
    that every series it reads is one cluster's in a Prometheus that holds several (PromQL has no
    default matcher; Thanos's external labels are matched as series labels).

    >>> scoped('sum by (pod) (rate(cpu_total{container!=""}[5m])) / on (pod) mem', 'cluster="eu"')
    'sum by (pod) (rate(cpu_total{container!="", cluster="eu"}[5m])) / on (pod) mem{cluster="eu"}'
    >>> scoped('max_over_time(up[1h:5m] offset 1d) > bool 0', 'cluster="eu"')
    'max_over_time(up{cluster="eu"}[1h:5m] offset 1d) > bool 0'

    A query cut short (a setting's own query missing its last bracket) is scoped as far as it
    goes and sent, for Prometheus to name the parse error (:func:`explained` names the setting):

    >>> scoped('sum by (pod) (rate(x[5m', 'cluster="eu"')
    'sum by (pod) (rate(x{cluster="eu"}[5m'
    """
    tokens = [(match.lastgroup or "", match.group()) for match in _PROMQL_TOKEN.finditer(query)]
    out: list[str] = []
    at = 0

    def next_token(after: int) -> str:
        return next((text for kind, text in tokens[after:] if kind != "space"), "")

    def copy_through(closing: str) -> None:
        # Label names of a list, a range's duration: copied as written, strings kept whole.
        nonlocal at
        while at < len(tokens):
            out.append(tokens[at][1])
            at += 1
            if tokens[at - 1] == ("other", closing):
                return

    while at < len(tokens):
        kind, text = tokens[at]
        at += 1
        # PromQL's keywords are case-insensitive (``SUM BY``, ``NaN``); metric names are not.
        keyword = text.lower()
        if kind == "name" and keyword in _LABEL_LISTS:
            out.append(text)
            if next_token(at) == "(":
                copy_through(")")
        elif kind == "name" and keyword not in _OPERATORS and not (
                next_token(at) == "(" or (keyword in _AGGREGATIONS and next_token(at).lower() in ("by", "without"))):
            out.append(text)
            if next_token(at) != "{":
                out.append(f"{{{selector}}}")
        elif (kind, text) == ("other", "{"):
            matchers: list[str] = []
            while at < len(tokens) and tokens[at] != ("other", "}"):
                matchers.append(tokens[at][1])
                at += 1
            at += 1
            written = "".join(matchers).rstrip()
            out.append(f"{{{written}{', ' if written and not written.endswith(',') else ''}{selector}}}")
        elif (kind, text) == ("other", "["):
            out.append(text)
            copy_through("]")
        else:
            out.append(text)
    return "".join(out)


def node_name(instance: str) -> str:
    """The node of a node-exporter ``instance`` label (``host:port``: the port goes)."""
    host, _, port = instance.rpartition(":")
    return host if host and port.isdigit() else instance


def node_label_problem(found: Collection[str], nodes: Collection[str], label: str) -> str | None:
    """Why no node's usage is read although node-exporter's series are: the names their ``label``
    holds (without ``:port``) are none of the cluster's ``nodes``. Scraped through its Pods, a
    node-exporter's ``instance`` is the Pod's IP and port unless a relabelling sets the node's name
    (from ``__meta_kubernetes_pod_node_name``, in ``instance`` or a label of its own). None while
    one name matches, or either side is empty (nothing read yet, no node known yet).

    >>> print(node_label_problem(["10.0.3.7", "10.0.3.9"], ["ip-10-0-3-7.eu"], "instance"))
    node-exporter's series name 2 nodes by their 'instance' label (10.0.3.7, 10.0.3.9), none of them one of the \
cluster's 1 nodes (ip-10-0-3-7.eu): no node's usage is read; set OVERSALE_PROMETHEUS_NODE_LABEL to the label \
holding the node's name
    """
    if not found or not nodes or not set(found).isdisjoint(nodes):
        return None
    return (f"node-exporter's series name {len(found)} nodes by their {label!r} label "
            f"({first_few(sorted(found), 3)}), none of them one of the cluster's {len(nodes)} nodes "
            f"({first_few(sorted(nodes), 3)}): no node's usage is read; set "
            "OVERSALE_PROMETHEUS_NODE_LABEL to the label holding the node's name")


CPU_COUNTERS = {"cAdvisor": f"container_cpu_usage_seconds_total{APP_CONTAINERS}",
                "node-exporter": "node_cpu_seconds_total"}
"""The cpu counters whose ``rate()`` the history reads, by exporter."""

SLOW_NODE_CPU_HINT = ("node-exporter's cpu counters, one per cpu and mode, rated at every step of the window, are "
                      "most of what these queries evaluate: read a recording rule of each node's cores instead with "
                      "OVERSALE_PROMETHEUS_NODE_CPU_QUERY (kube-prometheus-stack records instance:node_cpu:rate:sum), "
                      "or raise OVERSALE_PROMETHEUS_TIMEOUT")


def explained(error: PrometheusUnavailable, query: str, own: Iterable[tuple[str, str | None]] = ()) -> str:
    """``error`` as one line; where ``query`` rated node-exporter's cpu counters and timed out, with
    what makes it slow and what to set. A node of 16 cpus publishes 128 counters (80 in the modes
    read): 26 hours of 500 such nodes took this Prometheus a minute a pass
    (``bench.reconcile_scale --node-cpus 16``), where a recording rule took about a second. Where
    Prometheus cannot run ``query`` as written and it wraps a query of the user's own (``own``:
    each setting and its text), that setting is named (the error's position counts in the whole
    query sent, not in the setting's text).

    >>> timed_out = QueryTimedOut("prometheus answered 503: query timed out")
    >>> explained(timed_out, "sum(rate(node_cpu_seconds_total[5m]))")[:70]
    "prometheus answered 503: query timed out (node-exporter's cpu counters"
    >>> explained(timed_out, "instance:node_cpu:rate:sum")
    'prometheus answered 503: query timed out'
    >>> invalid = QueryInvalid("prometheus answered 400: 1:12: parse error")
    >>> explained(invalid, "1000 * (sum(rate(x[5m]))", [("OVERSALE_NODE_QUERY", "sum(rate(x[5m])")])
    'prometheus answered 400: 1:12: parse error (in OVERSALE_NODE_QUERY: sum(rate(x[5m]))'
    """
    if isinstance(error, QueryTimedOut) and CPU_COUNTERS["node-exporter"] in query:
        return f"{error} ({SLOW_NODE_CPU_HINT})"
    if isinstance(error, QueryInvalid):
        named = [f"{setting}: {text}" for setting, text in own if text and text in query]
        if named:
            return f"{error} (in {'; '.join(named)})"
    return str(error)


def scrape_interval(api: PrometheusAPI, series: str, at: float) -> float | None:
    """How often ``series`` (a series selector) is scraped, in seconds: half an hour over the
    median count of its series' samples between an hour and half an hour before ``at``, a window
    the last scrape's lag does not cut short (the median: a series started or stopped then has
    fewer). None where none has two samples then. Raises :class:`PrometheusUnavailable`."""
    samples = api.instant(f"quantile(0.5, count_over_time({series}[1h]) - count_over_time({series}[30m]))",
                          at, ()).get(())
    return 1800 / samples if samples is not None and samples >= 2 else None


def rate_window_problem(exporter: str, scrape: float, rate_window: float) -> str | None:
    """What a ``rate()`` over ``rate_window`` seconds misses of an ``exporter``'s counter scraped
    every ``scrape`` seconds, or None. A rate needs two samples in its window, and four survive a
    missed scrape: Prometheus's own advice is a window of at least four scrape intervals.

    >>> rate_window_problem("node-exporter", 60, 300) is None
    True
    >>> print(rate_window_problem("cAdvisor", 300, 300))
    cAdvisor's cpu counters are scraped every 300s, and OVERSALE_PROMETHEUS_RATE_WINDOW (300s) holds 1 of \
their samples: a rate needs 2, so most of their usage is missing from the history and ratios are held \
for want of it; set it to 4 scrape intervals at least (20m)
    >>> print(rate_window_problem("cAdvisor", 120, 300))  # doctest: +ELLIPSIS
    cAdvisor's ... (300s) holds 2 of their samples: one missed scrape leaves a gap in the history; set ...
    """
    if rate_window >= 4 * scrape:
        return None
    held = int(rate_window // scrape)
    missing = ("a rate needs 2, so most of their usage is missing from the history and ratios are held for want of "
               "it" if held < 2 else "one missed scrape leaves a gap in the history")
    return (f"{exporter}'s cpu counters are scraped every {scrape:.0f}s, and OVERSALE_PROMETHEUS_RATE_WINDOW "
            f"({rate_window:.0f}s) holds {held} of their samples: {missing}; set it to 4 scrape intervals at least "
            f"({math.ceil(4 * scrape / 60):.0f}m)")


def warn_rate_window(api: PrometheusAPI, exporter: str, rate_window: float, at: float) -> None:
    """Reads how often ``exporter``'s cpu counters (:data:`CPU_COUNTERS`) are scraped and logs a
    warning where a ``rate()`` over ``rate_window`` seconds misses some of their usage
    (:func:`rate_window_problem`): a 5-minute rate of a counter scraped every 5 minutes holds one
    sample and gives nothing, so what reads it sees no usage, with nothing said why. One query;
    raises :class:`PrometheusUnavailable`."""
    scrape = scrape_interval(api, CPU_COUNTERS[exporter], at)
    problem = None if scrape is None else rate_window_problem(exporter, scrape, rate_window)
    if problem:
        log.warning("%s", problem)


RATE_WINDOW_RECHECK = 86400.0
"""How often a long-running reader checks its rate window again (:class:`RateWindowCheck`)."""


class RateWindowCheck:
    """When a reader checks its cpu rate window against how often the counters are scraped
    (:func:`warn_rate_window`): at its first chance, then every ``every`` seconds. A scrape
    interval raised under a running reconciler or extender (a job scraped less often to save
    storage) would otherwise empty its rates with nothing said until it restarts. A check that
    fails (Prometheus unreachable) is not recorded, so the next chance tries again."""

    def __init__(self, rate_window: float, every: float = RATE_WINDOW_RECHECK) -> None:
        self.rate_window = rate_window
        self.every = every
        self._checked: dict[str, float] = {}

    def due(self, exporter: str, now: float) -> bool:
        return now - self._checked.get(exporter, -math.inf) >= self.every

    def run(self, api: PrometheusAPI, exporter: str, now: float) -> None:
        """One query; raises :class:`PrometheusUnavailable`."""
        warn_rate_window(api, exporter, self.rate_window, now)
        self._checked[exporter] = now


class NodeNaming:
    """Tells when node-exporter's series start to name none of the cluster's nodes
    (:func:`node_label_problem`), and when they name them again: once each, not at every read."""

    def __init__(self, label: str, meanwhile: str) -> None:
        self.label = label
        self.meanwhile = meanwhile
        """What counts while no node's usage is read (said with the warning)."""
        self._told: str | None = None

    def check(self, found: Collection[str], nodes: Collection[str]) -> None:
        problem = node_label_problem(found, nodes, self.label)
        if problem and problem != self._told:
            log.warning("%s; %s", problem, self.meanwhile)
        elif problem is None and self._told:
            log.info("node-exporter's series name the cluster's nodes again")
        self._told = problem


def node_matcher(label: str, nodes: Iterable[str]) -> str:
    """The label matcher of ``nodes``' node-exporter series, for :func:`scoped`: the node label's
    value is the node's name, with or without ``:port`` (as :func:`node_name` reads it). A regex
    metacharacter in a name (its dots) is escaped for RE2, and each backslash for the PromQL string.

    >>> print(node_matcher("instance", ["n2", "ip-10-0-0-1.eu"]))
    instance=~"(?:ip-10-0-0-1\\\\.eu|n2)(?::[0-9]+)?"
    """
    names = "|".join(_REGEX_SPECIAL.sub(lambda special: "\\\\" + special.group(), name) for name in sorted(nodes))
    return f'{label}=~"(?:{names})(?::[0-9]+)?"'


_REGEX_SPECIAL = re.compile(r"[.^$*+?()\[\]{}|\\]")


def duration(seconds: float) -> str:
    """A PromQL duration, in whole seconds (at least one)."""
    return f"{max(1, round(seconds))}s"


def _api_duration(seconds: float) -> str:
    """A duration parameter of the HTTP API (``timeout``, ``step``), in whole milliseconds.
    Prometheus reads a duration string or plain seconds, and ``1.5s`` is neither: a fractional
    OVERSALE_PROMETHEUS_TIMEOUT sent as ``1.5s`` had every query refused with a 400, as had a
    step of a million seconds or more (``1e+06s``)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _error_payload(error: urllib.error.HTTPError) -> dict[str, str]:
    try:
        payload: dict[str, str] = json.loads(error.read())
    except ValueError:
        return {}
    return payload
