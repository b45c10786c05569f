"""Every knob of the service: one dataclass, read from the environment in one place.

Each field names its environment variable in ``metadata["env"]``; docs/settings.md's table
lists them all (a test keeps the two in step).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cached_property
from typing import Any

from oversale.annotations import DEFAULT_PREFIX, AnnotationKeys
from oversale.budget import (
    AccountConfig,
    HotTimeBudget,
    budget_quantile,
    compression_percentile,
    parse_hot_time_budget,
)
from oversale.compression import CompressionConfig
from oversale.errors import QuantityError, SettingsError
from oversale.estimator import CompressionEstimator, OversaleEstimator, StabilityConfig
from oversale.node_oversale import OversaleLimits
from oversale.quantity import parse_bytes, parse_millicores
from oversale.remediation import RemediationConfig, RuntimeWatermarks
from oversale.resize import ResizeLimits
from oversale.usage import LoadConfig, Watermarks, parse_watermark

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

NODE_WINDOW_DAYS = 7
"""The history each node ratio is computed from, by default (``OVERSALE_HISTORY_WINDOW``): a
week, which holds every day of the week once, so a weekly peak is always in view."""

COMPRESSION_WINDOW_DAYS = 14
"""The history each workload's request is sized from, by default: two weeks, where the node
ratios read one (``OVERSALE_HISTORY_WINDOW``). After a quiet week a one-week window lowers every
request and packs the cluster onto fewer nodes just before load returns; on the backtest's tuning
days, over 5 placements, two weeks kept 19 of the 25 goal budgets x placements where one kept 17
(docs/backtest.md, round 5). The node ratios gain nothing from it and their queries are the
costly ones, so they keep a week. Two weeks is also the most a Prometheus at its default
retention (15 days) holds whole."""


def _env(name: str) -> dict[str, Any]:
    return {"env": name}


@dataclass(frozen=True)
class Settings:
    """Runtime settings of the webhook (and, later, of the other components)."""

    annotation_prefix: str = field(default=DEFAULT_PREFIX, metadata=_env("OVERSALE_ANNOTATION_PREFIX"))
    """Prefix of every annotation key read or written, e.g. ``stke.platform/cpu-requests-ratio``."""

    max_ratio: Decimal = field(default=Decimal(8), metadata=_env("OVERSALE_MAX_RATIO"))
    """Largest compression ratio applied; larger annotations are clamped to it with a warning."""

    min_ratio: Decimal = field(default=Decimal("0.5"), metadata=_env("OVERSALE_MIN_RATIO"))
    """Smallest ratio applied: below 1 a ratio *raises* requests (0.5: at most doubled), for
    workloads that use more than they request. Smaller annotations are clamped with a warning;
    1 switches raising off."""

    cpu_floor_millicores: int = field(default=10, metadata=_env("OVERSALE_CPU_FLOOR"))
    """No CPU request is compressed below this (a quantity such as ``10m``)."""

    memory_floor_bytes: int = field(default=16 * 2**20, metadata=_env("OVERSALE_MEMORY_FLOOR"))
    """No memory request is compressed below this (a quantity such as ``16Mi``)."""

    allow_guaranteed_downgrade: bool = field(default=False, metadata=_env("OVERSALE_ALLOW_GUARANTEED_DOWNGRADE"))
    """Compress Guaranteed Pods too (they become Burstable). Off: they are left alone, with a warning."""

    namespace: str = field(default="oversale", metadata=_env("OVERSALE_NAMESPACE"))
    """The service's own namespace (always excluded). Defaults to ``POD_NAMESPACE`` when that is set."""

    excluded_namespaces: frozenset[str] = field(
        default=frozenset(SYSTEM_NAMESPACES), metadata=_env("OVERSALE_EXCLUDED_NAMESPACES")
    )
    """Comma-separated namespaces whose Pods are never touched (the own namespace is added)."""

    max_cpu_oversale_ratio: Decimal = field(default=Decimal(5), metadata=_env("OVERSALE_MAX_CPU_OVERSALE_RATIO"))
    """Largest node CPU oversale ratio (inclusive); larger annotations are clamped."""

    max_memory_oversale_ratio: Decimal = field(default=Decimal(2), metadata=_env("OVERSALE_MAX_MEMORY_OVERSALE_RATIO"))
    """Largest node memory oversale ratio (inclusive); larger annotations are clamped."""

    kubelet_username: str = field(default="system:node:{node}", metadata=_env("OVERSALE_KUBELET_USERNAME"))
    """How a node's own kubelet authenticates; ``{node}`` is the Node name. Only its writes (and
    Node CREATE) may refresh the real allocatable/capacity."""

    pod_lookup_timeout_seconds: float = field(default=3.0, metadata=_env("OVERSALE_POD_LOOKUP_TIMEOUT"))
    """Timeout of the live Pod list the node validating webhook makes when a ratio is lowered."""

    max_body_bytes: int = field(default=6 * 2**20, metadata=_env("OVERSALE_MAX_BODY_BYTES"))
    """AdmissionReview bodies larger than this get a 400 (a quantity such as ``6Mi``)."""

    kubernetes: str = field(default="auto", metadata=_env("OVERSALE_KUBERNETES"))
    """``auto``: use in-cluster config, else the kubeconfig, else run with Pod annotations only;
    ``off``: never contact an API server."""

    owner_lookup_timeout_seconds: float = field(default=1.0, metadata=_env("OVERSALE_OWNER_LOOKUP_TIMEOUT"))
    """Timeout of the one GET made when an owner is not in the watch cache yet."""

    watch_timeout_seconds: int = field(default=300, metadata=_env("OVERSALE_WATCH_TIMEOUT"))
    """Server-side timeout of each watch request; the cache re-watches from its last version."""

    workers: int = field(default=2, metadata=_env("OVERSALE_WORKERS"))
    """gunicorn worker processes (``--workers`` overrides)."""

    threads: int = field(default=4, metadata=_env("OVERSALE_THREADS"))
    """Threads per gunicorn gthread worker (``--threads`` overrides)."""

    keepalive_seconds: int = field(default=75, metadata=_env("OVERSALE_KEEPALIVE"))
    """How long an idle keep-alive connection stays open; the API server reuses connections."""

    node_series_ttl_seconds: float = field(default=900.0, metadata=_env("OVERSALE_NODE_SERIES_TTL"))
    """A node's ``oversale_node_*`` series leave ``/metrics`` when no review of that node came for
    this long: the kubelet reports status at least every ``nodeStatusReportFrequency`` (5 min by
    default) even when nothing changed, so a node still there is reviewed well within it, and a
    deleted one stops showing its last values (a duration such as ``15m``)."""

    log_level: str = field(default="INFO", metadata=_env("OVERSALE_LOG_LEVEL"))
    """Python log level name (DEBUG logs every admission)."""

    # -- reconcilers ---------------------------------------------------------------------------
    prometheus_url: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_URL"))
    """Prometheus base URL; empty: sample metrics-server into SQLite instead."""

    prometheus_timeout_seconds: float = field(default=30.0, metadata=_env("OVERSALE_PROMETHEUS_TIMEOUT"))
    """Timeout of each PromQL query."""

    prometheus_step_seconds: float = field(default=300.0, metadata=_env("OVERSALE_PROMETHEUS_STEP"))
    """Subquery resolution: one evaluated point per series and step (a duration such as ``5m``)."""

    prometheus_concurrency: int = field(default=4, metadata=_env("OVERSALE_PROMETHEUS_CONCURRENCY"))
    """PromQL queries the reconcilers keep in flight at once, over all their reads (Prometheus
    evaluates each query on one core; 1: one after another)."""

    prometheus_rate_window_seconds: float = field(default=300.0, metadata=_env("OVERSALE_PROMETHEUS_RATE_WINDOW"))
    """Window of ``rate()`` over CPU counters: at least four scrape intervals."""

    prometheus_late_seconds: float = field(default=3 * 3600.0, metadata=_env("OVERSALE_PROMETHEUS_LATE_SAMPLES"))
    """How long a gap in the history kept between passes (the hot-time account's hours, the node
    quantiles' samples) with samples on both sides is read again, for samples that reach the store
    late: a remote-write sender cut off from its store resends what it buffered (Prometheus in
    agent mode about 2 hours; vmagent as much as its disk holds). 0: never."""

    prometheus_node_label: str = field(default="instance", metadata=_env("OVERSALE_PROMETHEUS_NODE_LABEL"))
    """Label holding the node name on node-exporter series (``host:port`` is cut at the colon)."""

    prometheus_node_cpu_query: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_NODE_CPU_QUERY"))
    """PromQL giving the cpu cores a node uses by the node label (a recording rule such as
    ``instance:node_cpu:rate:sum``); empty: the rate of node-exporter's ``node_cpu_seconds_total``
    in every mode but idle, iowait and steal, per cpu, summed at every step of the history."""

    prometheus_node_memory_query: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_NODE_MEMORY_QUERY"))
    """PromQL giving used node memory in bytes by the node label; empty: MemTotal - MemAvailable."""

    prometheus_headers: tuple[tuple[str, str], ...] = field(default=(), metadata=_env("OVERSALE_PROMETHEUS_HEADERS"))
    """HTTP headers sent with every query, ``Name=value`` separated by commas (a Mimir, Cortex or
    Thanos tenant: ``X-Scope-OrgID=prod``). A ``user:password@`` in the URL is sent as basic auth."""

    prometheus_bearer_token_file: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_BEARER_TOKEN_FILE"))
    """A file whose token is sent as ``Authorization: Bearer``, read again for every query (a
    projected ServiceAccount token rotates); empty: none."""

    prometheus_ca_file: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_CA_FILE"))
    """PEM certificates an ``https://`` Prometheus is verified against instead of the system's
    (a private or cluster CA); empty: the system's."""

    prometheus_selector: str = field(default="", metadata=_env("OVERSALE_PROMETHEUS_SELECTOR"))
    """Label matchers every series read must also match, such as ``cluster="prod-eu"``, where one
    Prometheus (a Thanos querier, VictoriaMetrics, a federation) holds several clusters whose
    namespaces, workloads and Pods share names; empty: every series."""

    prometheus_partial_answers: bool = field(default=False, metadata=_env("OVERSALE_PROMETHEUS_PARTIAL_ANSWERS"))
    """Whether an answer holding part of the store's data (a Thanos store or a VictoriaMetrics
    storage node unreachable) is read. By default every query asks for the whole answer or an
    error, and the ratios are held meanwhile: a week's quantile read without the store holding
    its older days would come from hours."""

    sqlite_path: str = field(default="/var/lib/oversale/history.db", metadata=_env("OVERSALE_SQLITE_PATH"))
    """The embedded history file (put it on a volume to keep history across restarts)."""

    sample_interval_seconds: float = field(default=300.0, metadata=_env("OVERSALE_SAMPLE_INTERVAL"))
    """How often a sample of metrics-server is written into SQLite."""

    sample_reads: int = field(default=5, metadata=_env("OVERSALE_SAMPLE_READS"))
    """Readings of metrics-server averaged into each SQLite sample, evenly over the interval (5:
    one a minute, as VPA's recommender reads it). Each reading's cpu is a rate over metrics-server's
    short window (15 s by default): their mean is the interval's average use, as a Prometheus rate
    and the backtest count it, where one reading alone would be 15 seconds of it."""

    history_retention_seconds: float = field(default=(COMPRESSION_WINDOW_DAYS + 1) * 86400.0,
                                             metadata=_env("OVERSALE_HISTORY_RETENTION"))
    """SQLite samples older than this are deleted: a day more than the longest window, so that
    window is always full."""

    history_max_bytes: int = field(default=1536 * 2**20, metadata=_env("OVERSALE_HISTORY_MAX_SIZE"))
    """The most the SQLite history may hold; past it the oldest samples go (below the volume's size:
    the kubelet evicts a Pod whose emptyDir outgrows its sizeLimit)."""

    history_window_seconds: float = field(default=NODE_WINDOW_DAYS * 86400.0,
                                          metadata=_env("OVERSALE_HISTORY_WINDOW"))
    """How much history each node ratio is computed from (:data:`NODE_WINDOW_DAYS`)."""

    compression_window_seconds: float = field(default=COMPRESSION_WINDOW_DAYS * 86400.0,
                                              metadata=_env("OVERSALE_COMPRESSION_WINDOW"))
    """How much history each workload's compression ratio (its requests) is computed from
    (:data:`COMPRESSION_WINDOW_DAYS`)."""

    reconcile_interval_seconds: float = field(default=300.0, metadata=_env("OVERSALE_RECONCILE_INTERVAL"))
    """Time between two reconcile passes."""

    cpu_hot_time_budget: float = field(default=0.001, metadata=_env("OVERSALE_CPU_HOT_TIME_BUDGET"))
    """The one risk knob: the share of node-time (0..1) an oversold node may spend with real cpu
    usage above its real allocatable (0.001: about 1.4 minutes a day). The node ratio is the
    largest whose predicted exceedance is within it, the compression percentile follows from it,
    and the account backs a node off when it overspends (``oversale.budget``). Per node or pool:
    the node annotation or label ``<prefix>/cpu-hot-time-budget``."""

    memory_hot_time_budget: float = field(default=0.0001, metadata=_env("OVERSALE_MEMORY_HOT_TIME_BUDGET"))
    """The same for memory (0.0001: about 9 seconds a day); memory contention kills Pods."""

    budget_calibration: float = field(default=4.0, metadata=_env("OVERSALE_BUDGET_CALIBRATION"))
    """The node's quantile is 1 - calibration x budget: how much the window's exceedance
    over-states what follows. Chosen on the backtest's tuning days (``python -m simulator.tune``);
    change it only after running that on your own history."""

    pool_labels: tuple[str, ...] = field(
        default=("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "kubernetes.azure.com/agentpool"),
        metadata=_env("OVERSALE_POOL_LABELS"))
    """Node labels naming a node's pool (first present wins; none: pool ``default``), for the
    account's per-pool figures."""

    compression_margin: Decimal = field(default=Decimal("0.05"), metadata=_env("OVERSALE_COMPRESSION_MARGIN"))
    """Headroom added to the demand: demand = percentile x (1 + margin)."""

    min_history_seconds: float = field(default=86400.0, metadata=_env("OVERSALE_MIN_HISTORY"))
    """No ratio is raised above 1 with less history than this."""

    min_samples: int = field(default=100, metadata=_env("OVERSALE_MIN_SAMPLES"))
    """No ratio is raised above 1 with fewer samples than this."""

    full_confidence_seconds: float = field(default=7 * 86400.0, metadata=_env("OVERSALE_FULL_CONFIDENCE"))
    """With less history than this, compression ratios are pulled toward 1 in proportion."""

    min_change: Decimal = field(default=Decimal("0.10"), metadata=_env("OVERSALE_MIN_CHANGE"))
    """Ratio changes smaller than this fraction are ignored."""

    max_raise: Decimal = field(default=Decimal("0.25"), metadata=_env("OVERSALE_MAX_RAISE"))
    """A ratio grows by at most this fraction per pass (lowering is immediate)."""

    rescale_hpa: bool = field(default=False, metadata=_env("OVERSALE_RESCALE_HPA"))
    """Compress workloads with a utilization HPA and scale the HPA target by the ratio (off: skip them)."""

    cpu_target_utilization: Decimal = field(default=Decimal("1"), metadata=_env("OVERSALE_CPU_TARGET"))
    """Share of real CPU the node's predicted peak may reach: ratio = target x requested / peak."""

    memory_target_utilization: Decimal = field(default=Decimal("0.6"), metadata=_env("OVERSALE_MEMORY_TARGET"))
    """Node memory utilization the oversale ratio aims at."""

    reconcile_max_memory_oversale_ratio: Decimal = field(
        default=Decimal("1.2"), metadata=_env("OVERSALE_RECONCILE_MAX_MEMORY_RATIO"))
    """Largest memory oversale ratio the reconciler writes (cpu: OVERSALE_MAX_CPU_OVERSALE_RATIO)."""

    floor_margin: Decimal = field(default=Decimal("0.05"), metadata=_env("OVERSALE_FLOOR_MARGIN"))
    """Safety above requests / real allocatable that a lowered node ratio stops at (a hot node is
    held where it is, not raised into this margin, so it gains no room for more Pods)."""

    staleness_seconds: float = field(default=3600.0, metadata=_env("OVERSALE_STALENESS"))
    """Node metrics older than this are stale: the ratio decays toward 1 (never below the floor)."""

    stale_decay: Decimal = field(default=Decimal("0.5"), metadata=_env("OVERSALE_STALE_DECAY"))
    """Fraction of (ratio - 1) kept per stale pass."""

    apply_node_status: bool = field(default=False, metadata=_env("OVERSALE_APPLY_NODE_STATUS"))
    """Write the node status with a new ratio at once instead of waiting for the kubelet's next sync."""

    write_concurrency: int = field(default=4, metadata=_env("OVERSALE_WRITE_CONCURRENCY"))
    """Objects the reconciler writes to at the same time (each object's writes stay in order)."""

    lease_name: str = field(default="oversale-reconciler", metadata=_env("OVERSALE_LEASE_NAME"))
    """coordination.k8s.io Lease (in the own namespace) that elects the one writing replica."""

    lease_duration_seconds: float = field(default=15.0, metadata=_env("OVERSALE_LEASE_DURATION"))
    """A leader that has not renewed for this long loses the lease; it stops writing before that."""

    reconciler_metrics_port: int = field(default=8080, metadata=_env("OVERSALE_RECONCILER_METRICS_PORT"))
    """Port of the reconciler's /metrics."""

    reconciler_metrics_address: str = field(default="0.0.0.0",
                                            metadata=_env("OVERSALE_RECONCILER_METRICS_ADDRESS"))
    """Address the reconciler's /metrics listens on: ``0.0.0.0`` every IPv4 address (Prometheus
    scrapes the Pod IP), ``::`` every IPv6 one (an IPv6-only cluster; IPv4 too where the kernel
    allows dual stack), ``127.0.0.1`` this host only."""

    inplace_resize: bool = field(default=True, metadata=_env("OVERSALE_INPLACE_RESIZE"))
    """The compression reconciler applies new ratios to running Pods through ``pods/resize``
    (Kubernetes 1.35, or 1.33/1.34 with InPlacePodVerticalScaling on); off: at the next rollout."""

    resize_max_per_pass: int = field(default=50, metadata=_env("OVERSALE_RESIZE_MAX_PER_PASS"))
    """In-place resizes sent in one pass at most (the rest wait for the next pass)."""

    resize_max_per_workload: int = field(default=10, metadata=_env("OVERSALE_RESIZE_MAX_PER_WORKLOAD"))
    """In-place resizes of one workload's Pods in one pass at most."""

    resize_min_interval_seconds: float = field(default=600.0, metadata=_env("OVERSALE_RESIZE_MIN_INTERVAL"))
    """A Pod is resized in place at most once per this interval."""

    remediation: bool = field(default=False, metadata=_env("OVERSALE_REMEDIATION"))
    """The reconciler moves Pods off oversold nodes that run hot (evictions through the Eviction
    API). Off by default: it evicts Pods, so a user turns it on knowingly."""

    remediation_interval_seconds: float = field(default=60.0, metadata=_env("OVERSALE_REMEDIATION_INTERVAL"))
    """Time between remediation passes (each pass is one observation of every node)."""

    remediate_all_nodes: bool = field(default=False, metadata=_env("OVERSALE_REMEDIATE_ALL_NODES"))
    """Remediate every node, not only those this project oversells."""

    cpu_runtime_watermark: Decimal = field(default=Decimal("0.95"), metadata=_env("OVERSALE_CPU_RUNTIME_WATERMARK"))
    """A node whose cpu usage is above this share of real cpu is hot (per node: ``cpu-runtime-watermark``)."""

    memory_runtime_watermark: Decimal = field(default=Decimal("0.90"),
                                              metadata=_env("OVERSALE_MEMORY_RUNTIME_WATERMARK"))
    """The same for memory (``memory-runtime-watermark``)."""

    hot_observations: int = field(default=10, metadata=_env("OVERSALE_HOT_OBSERVATIONS"))
    """Consecutive hot observations before Pods are moved (a spike is not a trend)."""

    eviction_min_pod_age_seconds: float = field(default=600.0, metadata=_env("OVERSALE_EVICTION_MIN_POD_AGE"))
    """Pods younger than this are not evicted."""

    eviction_min_replicas: int = field(default=1, metadata=_env("OVERSALE_EVICTION_MIN_REPLICAS"))
    """A Pod whose controller has fewer Ready Pods than this is not evicted (the descheduler's
    ``minReplicas``; 1, the default, as the descheduler's: any may be, a PodDisruptionBudget
    still holds). 2 keeps every single-replica workload where it is."""

    evictions_per_node: int = field(default=1, metadata=_env("OVERSALE_EVICTIONS_PER_NODE"))
    """Evictions from one node per pass at most."""

    evictions_per_namespace: int = field(default=2, metadata=_env("OVERSALE_EVICTIONS_PER_NAMESPACE"))
    """Evictions in one namespace per pass at most."""

    evictions_per_pass: int = field(default=5, metadata=_env("OVERSALE_EVICTIONS_PER_PASS"))
    """Evictions per pass at most."""

    node_cooldown_seconds: float = field(default=600.0, metadata=_env("OVERSALE_NODE_COOLDOWN"))
    """After an eviction a node is left alone this long, so its load settles before it is judged again."""

    workload_cooldown_seconds: float = field(default=1800.0, metadata=_env("OVERSALE_WORKLOAD_COOLDOWN"))
    """After an eviction the workload's Pods are left alone this long."""

    reservation_seconds: float = field(default=300.0, metadata=_env("OVERSALE_RESERVATION_TTL"))
    """How long room held on the target node waits for the evicted Pod's replacement."""

    hot_node_taint: bool = field(default=True, metadata=_env("OVERSALE_HOT_NODE_TAINT"))
    """After an eviction, taint the node ``PreferNoSchedule`` for its cooldown, so replacements placed
    by other schedulers than the ``oversale`` profile avoid it too."""

    scheduler_names: frozenset[str] = field(default=frozenset({"oversale"}), metadata=_env("OVERSALE_SCHEDULER_NAMES"))
    """Scheduler profiles (``spec.schedulerName``) whose Pods the extender binds; it refuses others."""

    extender_probe_port: int = field(default=8445, metadata=_env("OVERSALE_EXTENDER_PROBE_PORT"))
    """Plain-HTTP port of the extender's /healthz, /readyz and /metrics when its verbs are served over
    mutual TLS (probes and scrapes carry no client certificate); 0: none."""

    extender_lease_name: str = field(default="oversale-extender", metadata=_env("OVERSALE_EXTENDER_LEASE_NAME"))
    """Lease (in the own namespace) that elects the one extender replica kube-scheduler talks to."""

    extender_lease_duration_seconds: float = field(default=10.0,
                                                   metadata=_env("OVERSALE_EXTENDER_LEASE_DURATION"))
    """A standby extender takes over this long after the leader's last renewal (plus a third of it)."""

    extender_bind_timeout_seconds: float = field(default=4.0, metadata=_env("OVERSALE_EXTENDER_BIND_TIMEOUT"))
    """The extender answers a bind within this long: the API requests of one bind (the Pod's read,
    its cpuset, the Binding) share it. Keep it under kube-scheduler's ``httpTimeout`` for the
    extender (5 s in ``deploy/``): kube-scheduler stops waiting then, and a thread still waiting on
    the API server serves no one while filter calls queue for it."""

    pod_name: str = field(default="", metadata=_env("POD_NAME"))
    """This replica's own Pod (the downward API sets it): the extender leader labels it so that its
    Service routes kube-scheduler there alone; empty outside a Pod (no label)."""

    load_aware: bool = field(default=False, metadata=_env("OVERSALE_LOAD_AWARE"))
    """The extender filters and scores nodes by their real usage (metrics.k8s.io), not only requests.
    Off by default: the backtest does not show it paying off yet (docs/scheduler.md, "Load-aware placement")."""

    metrics_poll_interval_seconds: float = field(default=30.0, metadata=_env("OVERSALE_METRICS_POLL_INTERVAL"))
    """How often the extender reads NodeMetrics and PodMetrics."""

    metrics_max_age_seconds: float = field(default=180.0, metadata=_env("OVERSALE_METRICS_MAX_AGE"))
    """Node metrics older than this are stale: the node is neither filtered nor favoured by load."""

    load_history: str = field(default="metrics-api", metadata=_env("OVERSALE_LOAD_HISTORY"))
    """``metrics-api``: the cpu maximum the peak watermark reads comes from the extender's own
    samples of the last hour. ``prometheus``: also from Prometheus (``OVERSALE_PROMETHEUS_URL``,
    node-exporter's series) over ``OVERSALE_LOAD_HISTORY_WINDOW``, read every
    ``OVERSALE_LOAD_HISTORY_INTERVAL``; the higher of the two counts. A restarted extender then
    has its window at once, and a longer window remembers older bursts. With ``prometheus``, a
    Pod whose workload has no Pod in PodMetrics is also estimated by what its workload's Pods used
    over ``OVERSALE_WORKLOAD_HISTORY_WINDOW`` (cAdvisor's and kube-state-metrics' series)."""

    load_history_window_seconds: float = field(default=6 * 3600.0, metadata=_env("OVERSALE_LOAD_HISTORY_WINDOW"))
    """Window of the cpu maximum read from Prometheus. 6 hours: on the backtest's tuning days it
    freed a little more than 1 hour, at a little less hot time (24 hours: the same as 6); the
    backtest's load-aware system replays it (docs/backtest.md)."""

    load_history_interval_seconds: float = field(default=300.0, metadata=_env("OVERSALE_LOAD_HISTORY_INTERVAL"))
    """How often the extender reads it (one query a read, whatever the number of nodes); a read
    older than three intervals is no longer used."""

    workload_history_window_seconds: float = field(default=86400.0, metadata=_env("OVERSALE_WORKLOAD_HISTORY_WINDOW"))
    """Window of the workload history read from Prometheus (with ``OVERSALE_LOAD_HISTORY=prometheus``,
    every ``OVERSALE_LOAD_HISTORY_INTERVAL``): each Pod's mean usage over the part of it the Pod
    ran, averaged over its workload's Pods. A day holds a nightly CronJob's last run and the day of
    a workload scaled to zero overnight."""

    cpu_scheduling_watermark: Decimal = field(default=Decimal("0.65"),
                                              metadata=_env("OVERSALE_CPU_SCHEDULING_WATERMARK"))
    """No new Pods on a node whose 5-minute average cpu usage is above this share of real cpu
    (per node: the ``cpu-scheduling-watermark`` annotation or label)."""

    cpu_peak_scheduling_watermark: Decimal = field(default=Decimal("0.85"),
                                                   metadata=_env("OVERSALE_CPU_PEAK_SCHEDULING_WATERMARK"))
    """The same for the 1-hour maximum of cpu usage (``cpu-peak-scheduling-watermark``)."""

    memory_scheduling_watermark: Decimal = field(default=Decimal("0.85"),
                                                 metadata=_env("OVERSALE_MEMORY_SCHEDULING_WATERMARK"))
    """The same for memory usage (``memory-scheduling-watermark``)."""

    bound_pod_settle_seconds: float = field(default=300.0, metadata=_env("OVERSALE_BOUND_POD_SETTLE"))
    """A Pod bound this recently and not yet in PodMetrics counts by its estimated usage."""

    cpu_usage_estimate: Decimal = field(default=Decimal("0.85"), metadata=_env("OVERSALE_CPU_USAGE_ESTIMATE"))
    """Estimated cpu usage of a Pod not yet in the metrics, as a share of its request, where no Pod
    of its workload is in the metrics either (else what those use each counts)."""

    memory_usage_estimate: Decimal = field(default=Decimal("0.7"), metadata=_env("OVERSALE_MEMORY_USAGE_ESTIMATE"))
    """Estimated memory usage of a Pod not yet in the metrics, as a share of its request, where no
    Pod of its workload is in the metrics either."""

    load_score_weight: int = field(default=1, metadata=_env("OVERSALE_LOAD_SCORE_WEIGHT"))
    """Weight of "stays coolest after placing" in the extender's score (0: load only filters)."""

    packing_score_weight: int = field(default=1, metadata=_env("OVERSALE_PACKING_SCORE_WEIGHT"))
    """Weight of the packing score (requests, NUMA, fragmentation) in the extender's score."""

    @cached_property
    def keys(self) -> AnnotationKeys:
        return AnnotationKeys(self.annotation_prefix)

    @cached_property
    def compression(self) -> CompressionConfig:
        return CompressionConfig(
            max_ratio=self.max_ratio,
            min_ratio=self.min_ratio,
            cpu_floor_millicores=self.cpu_floor_millicores,
            memory_floor_bytes=self.memory_floor_bytes,
            allow_guaranteed_downgrade=self.allow_guaranteed_downgrade,
        )

    @cached_property
    def load(self) -> LoadConfig:
        return LoadConfig(
            watermarks=Watermarks(self.cpu_scheduling_watermark, self.cpu_peak_scheduling_watermark,
                                  self.memory_scheduling_watermark),
            max_age_seconds=self.metrics_max_age_seconds,
            history_peak_seconds=self.load_history_window_seconds,
            history_max_age_seconds=3 * self.load_history_interval_seconds,
            settle_seconds=self.bound_pod_settle_seconds,
            cpu_estimate=self.cpu_usage_estimate,
            memory_estimate=self.memory_usage_estimate,
            load_weight=self.load_score_weight,
            packing_weight=self.packing_score_weight,
        )

    @cached_property
    def resize_limits(self) -> ResizeLimits:
        return ResizeLimits(self.resize_max_per_pass, self.resize_max_per_workload, self.resize_min_interval_seconds)

    @cached_property
    def remediation_config(self) -> RemediationConfig:
        return RemediationConfig(
            watermarks=RuntimeWatermarks(self.cpu_runtime_watermark, self.memory_runtime_watermark),
            observations=self.hot_observations,
            min_pod_age_seconds=self.eviction_min_pod_age_seconds,
            min_replicas=self.eviction_min_replicas,
            max_per_node=self.evictions_per_node,
            max_per_namespace=self.evictions_per_namespace,
            max_per_pass=self.evictions_per_pass,
            node_cooldown_seconds=self.node_cooldown_seconds,
            workload_cooldown_seconds=self.workload_cooldown_seconds,
            interval_seconds=self.remediation_interval_seconds,
            taint_hot_nodes=self.hot_node_taint,
        )

    @cached_property
    def oversale_limits(self) -> OversaleLimits:
        return OversaleLimits(self.max_cpu_oversale_ratio, self.max_memory_oversale_ratio)

    def is_kubelet_of(self, username: str, node: str) -> bool:
        return username == self.kubelet_username.format(node=node)

    @property
    def account(self) -> AccountConfig:
        return AccountConfig()

    @property
    def budget(self) -> HotTimeBudget:
        return HotTimeBudget(self.cpu_hot_time_budget, self.memory_hot_time_budget)

    @property
    def compression_percentile(self) -> float:
        """From the cpu budget: a container's demand is exceeded no more often than a node may be hot."""
        return compression_percentile(self.cpu_hot_time_budget, self.budget_calibration)

    @property
    def node_percentile(self) -> float:
        return budget_quantile(self.cpu_hot_time_budget, self.budget_calibration)

    @property
    def memory_node_percentile(self) -> float:
        return budget_quantile(self.memory_hot_time_budget, self.budget_calibration)

    def compression_estimator(self) -> CompressionEstimator:
        return CompressionEstimator(
            percentile=self.compression_percentile,
            margin=self.compression_margin,
            max_ratio=self.max_ratio,
            min_ratio=self.min_ratio,
            min_coverage_seconds=self.min_history_seconds,
            min_samples=self.min_samples,
            full_confidence_seconds=self.full_confidence_seconds,
            stability=StabilityConfig(self.min_change, self.max_raise),
        )

    def oversale_estimator(self) -> OversaleEstimator:
        return OversaleEstimator(
            percentile=self.node_percentile,
            memory_percentile=self.memory_node_percentile,
            budget_scale=self.budget_calibration,
            cpu_target=self.cpu_target_utilization,
            memory_target=self.memory_target_utilization,
            cpu_max_ratio=self.max_cpu_oversale_ratio,
            memory_max_ratio=min(self.reconcile_max_memory_oversale_ratio, self.max_memory_oversale_ratio),
            floor_margin=self.floor_margin,
            min_coverage_seconds=self.min_history_seconds,
            min_samples=self.min_samples,
            staleness_seconds=self.staleness_seconds,
            decay=self.stale_decay,
            stability=StabilityConfig(self.min_change, self.max_raise),
        )

    def skips_namespace(self, namespace: str) -> bool:
        return namespace in self.excluded_namespaces or namespace == self.namespace

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Read every field from ``environ``; unset variables keep their defaults.

        Raises SettingsError naming the variable and the value when one cannot be used.
        """
        for name, replacement in REPLACED.items():
            if name in environ:
                raise SettingsError(f"{name}={environ[name]!r}: no longer read; {replacement}")
        values: dict[str, Any] = {}
        if environ.get("POD_NAMESPACE"):
            values["namespace"] = environ["POD_NAMESPACE"]
        for spec in dataclasses.fields(cls):
            name = spec.metadata["env"]
            if name not in environ:
                continue
            try:
                values[spec.name] = _PARSERS[spec.name](environ[name])
            except (ValueError, InvalidOperation, QuantityError) as error:
                raise SettingsError(f"{name}={environ[name]!r}: {error}") from None
        if values.get("load_history") == "prometheus" and not values.get("prometheus_url"):
            raise SettingsError("OVERSALE_LOAD_HISTORY='prometheus' needs OVERSALE_PROMETHEUS_URL (where "
                                "node-exporter's series are)")
        return cls(**values)


def unread_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``OVERSALE_*`` variable no setting reads, with the closest name when there
    is one: a misspelt knob would otherwise leave its default in force, and nothing would say so.

    >>> unread_variables({"OVERSALE_CPU_HOT_TIME_BUGDET": "0.0005", "OVERSALE_MAX_RATIO": "4", "HOME": "/"})
    ['OVERSALE_CPU_HOT_TIME_BUGDET is not a setting; ignored (did you mean OVERSALE_CPU_HOT_TIME_BUDGET?)']
    """
    known = [spec.metadata["env"] for spec in dataclasses.fields(Settings)]
    warnings = []
    for name in sorted(environ):
        if name.startswith("OVERSALE_") and name not in known and name not in REPLACED:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            warnings.append(f"{name} is not a setting; ignored" + (f" (did you mean {close[0]}?)" if close else ""))
    return warnings


REPLACED = {
    "OVERSALE_NODE_PERCENTILE": "the hot-time budget sets it: OVERSALE_CPU_HOT_TIME_BUDGET (percentile = 1 - budget)",
    "OVERSALE_COMPRESSION_PERCENTILE": "the hot-time budget sets it: OVERSALE_CPU_HOT_TIME_BUDGET "
                                       "(percentile = 1 - budget, at least 0.9)",
}
"""Variables of earlier versions: set, they stop the start with what replaces them, rather than
being silently ignored."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _positive_float(text: str, what: str = "a positive number of seconds") -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"must be {what}")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "y", "on"}:
        return True
    if lowered in {"0", "false", "no", "n", "off", ""}:
        return False
    raise ValueError("must be true or false")


def _max_ratio(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError("must be a number >= 1") from None
    if not value.is_finite() or value < 1:
        raise ValueError("must be a number >= 1")
    return value


def _min_ratio(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError("must be a number above 0 and at most 1") from None
    if not value.is_finite() or not 0 < value <= 1:
        raise ValueError("must be a number above 0 and at most 1")
    return value


def _username_template(text: str) -> str:
    if "{node}" not in text:
        raise ValueError("must contain {node}, e.g. system:node:{node}")
    try:
        text.format(node="x")
    except (ValueError, KeyError, IndexError, AttributeError):
        # str.format raises KeyError for another {field}, IndexError for {0}, AttributeError for {node.x}.
        raise ValueError("must contain {node} and no other {...}, e.g. system:node:{node}") from None
    return text


def _prefix(text: str) -> str:
    if not text or "/" in text or len(text) > 253:
        raise ValueError("must be a DNS subdomain such as stke.platform (no slash)")
    return text


def _choice(*allowed: str) -> Any:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


def _level(text: str) -> str:
    level = text.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


_PARSERS: dict[str, Any] = {
    "annotation_prefix": _prefix,
    "max_ratio": _max_ratio,
    "min_ratio": _min_ratio,
    "cpu_floor_millicores": lambda text: _not_negative(parse_millicores(text), "such as 10m (0: no floor)"),
    "memory_floor_bytes": lambda text: _not_negative(parse_bytes(text), "such as 16Mi (0: no floor)"),
    "allow_guaranteed_downgrade": _bool,
    "namespace": lambda text: _nonempty(text),
    "excluded_namespaces": lambda text: frozenset(n.strip() for n in text.split(",") if n.strip()),
    "max_cpu_oversale_ratio": _max_ratio,
    "max_memory_oversale_ratio": _max_ratio,
    "kubelet_username": _username_template,
    "pod_lookup_timeout_seconds": _positive_float,
    # 0 would refuse every review: the webhooks would admit everything unchanged, and say so only
    # in their logs.
    "max_body_bytes": lambda text: _positive_size(text),
    "kubernetes": _choice("auto", "off"),
    "owner_lookup_timeout_seconds": _positive_float,
    "watch_timeout_seconds": _positive_int,
    "workers": _positive_int,
    "threads": _positive_int,
    "keepalive_seconds": _positive_int,
    "node_series_ttl_seconds": lambda text: _duration(text),
    "log_level": _level,
    "prometheus_url": lambda text: parse_base_url(text) if text.strip() else "",
    "prometheus_timeout_seconds": lambda text: _duration(text),
    "prometheus_step_seconds": lambda text: _duration(text),
    "prometheus_rate_window_seconds": lambda text: _duration(text),
    "prometheus_late_seconds": lambda text: _duration(text, allow_zero=True),
    "prometheus_concurrency": _positive_int,
    "prometheus_node_label": lambda text: _nonempty(text),
    "prometheus_node_cpu_query": str.strip,
    "prometheus_node_memory_query": str.strip,
    "prometheus_headers": lambda text: parse_headers(text),
    "prometheus_bearer_token_file": str.strip,
    "prometheus_ca_file": str.strip,
    "prometheus_selector": lambda text: parse_selector(text),
    "prometheus_partial_answers": _bool,
    "sqlite_path": lambda text: _nonempty(text),
    "sample_interval_seconds": lambda text: _duration(text),
    "sample_reads": _positive_int,
    "history_retention_seconds": lambda text: _duration(text),
    "history_max_bytes": lambda text: _positive_size(text),
    "history_window_seconds": lambda text: _duration(text),
    "compression_window_seconds": lambda text: _duration(text),
    "reconcile_interval_seconds": lambda text: _duration(text),
    "cpu_hot_time_budget": parse_hot_time_budget,
    "memory_hot_time_budget": parse_hot_time_budget,
    "budget_calibration": lambda text: parse_budget_calibration(text),
    "pool_labels": lambda text: tuple(label.strip() for label in text.split(",") if label.strip()),
    "compression_margin": lambda text: _decimal_between(text, 0, 10),
    "min_history_seconds": lambda text: _duration(text, allow_zero=True),
    "min_samples": lambda text: _nonnegative_int(text),
    "full_confidence_seconds": lambda text: _duration(text),
    "min_change": lambda text: _decimal_between(text, 0, 1),
    "max_raise": lambda text: _decimal_between(text, 0, 10),
    "rescale_hpa": _bool,
    "cpu_target_utilization": lambda text: _decimal_between(text, 0, 1),
    "memory_target_utilization": lambda text: _decimal_between(text, 0, 1),
    "reconcile_max_memory_oversale_ratio": _max_ratio,
    "floor_margin": lambda text: _decimal_between(text, 0, 10),
    "staleness_seconds": lambda text: _duration(text),
    "stale_decay": lambda text: _decimal_between(text, 0, 1),
    "apply_node_status": _bool,
    "write_concurrency": _positive_int,
    "lease_name": lambda text: _nonempty(text),
    "lease_duration_seconds": lambda text: _duration(text),
    "reconciler_metrics_port": lambda text: _port(text),
    "reconciler_metrics_address": lambda text: _ip_address(text),
    "inplace_resize": _bool,
    "resize_max_per_pass": _positive_int,
    "resize_max_per_workload": _positive_int,
    "resize_min_interval_seconds": lambda text: _duration(text, allow_zero=True),
    "remediation": _bool,
    "hot_node_taint": _bool,
    "remediation_interval_seconds": lambda text: _duration(text),
    "remediate_all_nodes": _bool,
    "cpu_runtime_watermark": lambda text: _watermark(text),
    "memory_runtime_watermark": lambda text: _watermark(text),
    "hot_observations": _positive_int,
    "eviction_min_pod_age_seconds": lambda text: _duration(text, allow_zero=True),
    "eviction_min_replicas": _positive_int,
    "evictions_per_node": _positive_int,
    "evictions_per_namespace": _positive_int,
    "evictions_per_pass": _positive_int,
    "node_cooldown_seconds": lambda text: _duration(text, allow_zero=True),
    "workload_cooldown_seconds": lambda text: _duration(text, allow_zero=True),
    "reservation_seconds": lambda text: _duration(text),
    "scheduler_names": lambda text: _names(text),
    "extender_probe_port": lambda text: _port(text),
    "extender_lease_name": lambda text: _nonempty(text),
    "pod_name": lambda text: text.strip(),
    "extender_lease_duration_seconds": lambda text: _duration(text),
    "extender_bind_timeout_seconds": lambda text: _duration(text),
    "load_aware": _bool,
    "metrics_poll_interval_seconds": lambda text: _duration(text),
    "metrics_max_age_seconds": lambda text: _duration(text),
    "load_history": _choice("metrics-api", "prometheus"),
    "load_history_window_seconds": lambda text: _duration(text),
    "load_history_interval_seconds": lambda text: _duration(text),
    "workload_history_window_seconds": lambda text: _duration(text),
    "cpu_scheduling_watermark": lambda text: _watermark(text),
    "cpu_peak_scheduling_watermark": lambda text: _watermark(text),
    "memory_scheduling_watermark": lambda text: _watermark(text),
    "bound_pod_settle_seconds": lambda text: _duration(text, allow_zero=True),
    "cpu_usage_estimate": lambda text: _decimal_between(text, 0, 10),
    "memory_usage_estimate": lambda text: _decimal_between(text, 0, 10),
    "load_score_weight": lambda text: _nonnegative_int(text),
    "packing_score_weight": lambda text: _nonnegative_int(text),
}


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_budget_calibration(text: str) -> float:
    """``OVERSALE_BUDGET_CALIBRATION``: a positive, finite factor (ValueError), as the tuner's
    candidates are too."""
    return _positive_float(text, "a positive factor (quantile 1 - calibration x budget)")


def parse_duration(text: str) -> float:
    """A positive duration in seconds from ``300``, ``300s``, ``5m``, ``24h`` or ``7d`` (ValueError)."""
    return _duration(text)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110's token)."""


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``Name=value`` pairs separated by commas (ValueError naming the first bad one).

    >>> parse_headers("X-Scope-OrgID=prod, X-Extra = a=b")
    (('X-Scope-OrgID', 'prod'), ('X-Extra', 'a=b'))
    """
    headers = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not equals or not _HEADER_NAME.fullmatch(name) or any(c in value for c in "\r\n"):
            raise ValueError(f"{item!r} is no Name=value header (several: separated by commas)")
        headers.append((name, value))
    return tuple(headers)


_MATCHER = re.compile(r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')\s*""")


def parse_selector(text: str) -> str:
    """PromQL label matchers separated by commas, braces optional (ValueError naming the first
    bad one): written back in one form, ready to add inside a series selector's braces.

    >>> parse_selector('{cluster="prod-eu", env=~"prod|staging"}')
    'cluster="prod-eu", env=~"prod|staging"'
    """
    inner = text.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    matchers: list[str] = []
    at = 0
    while True:
        while at < len(inner) and inner[at] in " ,":
            at += 1
        if at == len(inner):
            return ", ".join(matchers)
        found = _MATCHER.match(inner, at)
        if found is None or (found.end() < len(inner) and inner[found.end()] != ","):
            rest = inner[at:].split(",", 1)[0].strip()
            raise ValueError(f"{rest!r} is no PromQL label matcher such as cluster=\"prod-eu\" (several: separated "
                             "by commas)")
        matchers.append(f"{found[1]}{found[2]}{found[3]}")
        at = found.end()


def parse_base_url(text: str) -> str:
    """An http(s) base URL such as ``http://prometheus.monitoring:9090`` (a path prefix allowed),
    without the trailing slash (ValueError otherwise): refused here, it is one line at start
    instead of an error on every query."""
    text = text.strip().rstrip("/")
    scheme, _, rest = text.partition("://")
    authority = rest.split("/", 1)[0].rpartition("@")[2]  # [user:password@]host[:port]
    host, port = authority, ""
    if ":" in authority and not authority.endswith("]"):  # "[::1]" is a host with no port
        host, _, port = authority.rpartition(":")
    valid_port = not port or (port.isascii() and port.isdecimal())
    if scheme.lower() not in ("http", "https") or host in ("", "[]") or not valid_port \
            or any(c.isspace() for c in text):
        raise ValueError("must be an http:// or https:// URL such as http://prometheus.monitoring:9090")
    return text


def _not_negative(amount: int, example: str) -> int:
    if amount < 0:
        raise ValueError(f"must be 0 or more, {example}")
    return amount


def _positive_size(text: str) -> int:
    """A size in bytes as a quantity: ``768Mi``, ``2Gi``, ``500M``."""
    size = parse_bytes(text)
    if size <= 0:
        raise ValueError("must be a size above 0, such as 768Mi or 2Gi")
    return size


def _duration(text: str, allow_zero: bool = False) -> float:
    """``300``, ``300s``, ``5m``, ``24h``, ``7d``."""
    text = text.strip()
    unit = _UNITS.get(text[-1:])
    number = text[:-1] if unit else text
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise ValueError("must be a duration such as 300, 5m, 24h or 7d") from None
    if not (value > 0 or (allow_zero and value == 0)) or value == float("inf"):
        raise ValueError("must be 0 or a positive duration" if allow_zero else "must be a positive duration")
    return value


def _watermark(text: str) -> Decimal:
    """A share of real capacity, as a node's watermark annotation takes it: 0 would call every node
    with any load hot (no Pod placed, or every node remediated), so it is refused; 1 turns the
    check off in practice."""
    value = parse_watermark(text)
    if value is None:
        raise ValueError("must be a number above 0 and at most 1 (a share of real capacity; 1: never exceeded)")
    return value


def _decimal_between(text: str, low: float, high: float) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"must be a number from {low} to {high}") from None
    if not value.is_finite() or not low <= value <= high:
        raise ValueError(f"must be a number from {low} to {high}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _names(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("must name at least one scheduler profile, e.g. oversale")
    return names


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _ip_address(text: str) -> str:
    # Written as in a URL ("[::]") or bare ("::"): the listener wants it bare.
    bare = text.strip().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        raise ValueError("must be an IP address such as 0.0.0.0, :: or 127.0.0.1") from None


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number")
    return value
