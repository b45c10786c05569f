"""Prometheus metrics of the reconcilers (one process: a plain registry)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReconcilerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.pass_duration = Gauge("oversale_reconcile_pass_duration_seconds", "Duration of the last pass.",
                                   ["reconciler"], registry=registry)
        self.evaluated = Gauge("oversale_reconcile_objects_evaluated", "Objects evaluated in the last pass.",
                               ["reconciler"], registry=registry)
        self.ratio = Gauge("oversale_reconcile_ratio", "Ratio an object carries after the last pass.",
                           ["kind", "namespace", "name", "resource"], registry=registry)
        self.skips = Counter("oversale_reconcile_skips", "Objects or resources not reconciled, by reason.",
                             ["reason"], registry=registry)
        self.writes = Counter("oversale_reconcile_writes", "Writes by kind and result (ok, conflict, error).",
                              ["kind", "result"], registry=registry)
        self.staleness = Gauge("oversale_history_staleness_seconds",
                               "Age of the freshest usage sample seen in the last pass (-1: source unavailable).",
                               ["scope"], registry=registry)
        self.history_span = Gauge("oversale_history_span_seconds",
                                  "From the oldest to the newest sample of the SQLite usage history: up to "
                                  "OVERSALE_HISTORY_RETENTION, less while young or once OVERSALE_HISTORY_MAX_SIZE "
                                  "cut the oldest samples.", registry=registry)
        self.last_pass = Gauge("oversale_reconcile_last_pass_timestamp_seconds",
                               "When this replica's last pass ended (Unix seconds; 0: none yet), by result: "
                               "complete (it decided everything), incomplete (history unavailable, a step the "
                               "API server failed or the Lease lost: the log says which), failed (an error, "
                               "in the log).", ["result"], registry=registry)
        for result in ("complete", "incomplete", "failed"):
            self.last_pass.labels(result).set(0)
        self.history_queries = Gauge("oversale_history_queries", "Queries the last pass sent to the history source.",
                                     registry=registry)
        self.usage_window = Gauge("oversale_history_usage_window_seconds",
                                  "Seconds each cpu sample of the SQLite usage history is a rate over "
                                  "(metrics-server's window, the nodes' median); a Prometheus history's is "
                                  "OVERSALE_PROMETHEUS_RATE_WINDOW (5m).", registry=registry)
        self.resizes = Counter("oversale_inplace_resizes", "In-place Pod resizes by result (ok, conflict, error, "
                               "infeasible).", ["result"], registry=registry)
        self.resize_supported = Gauge("oversale_inplace_resize_supported",
                                      "1 when the API server serves pods/resize, 0 when not (-1: not checked yet).",
                                      registry=registry)
        self.resize_supported.set(-1)
        self.last_observation = Gauge("oversale_remediation_last_observation_timestamp_seconds",
                                      "When this replica's remediator last read the nodes' usage and Pods (Unix "
                                      "seconds; 0: never). The leader's observes every OVERSALE_REMEDIATION_INTERVAL.",
                                      registry=registry)
        self.hot_nodes = Gauge("oversale_remediation_hot_nodes",
                               "Nodes hot for the required number of observations in the last pass.",
                               registry=registry)
        self.evictions = Counter("oversale_remediation_evictions", "Evictions asked for, by result (hot-node: "
                                 "accepted, refused-by-pdb, gone: deleted or recreated under its name since the "
                                 "pass read it, error).", ["result"], registry=registry)
        self.reservations = Counter("oversale_remediation_reservations",
                                    "Room reserved on target nodes before an eviction.", registry=registry)
        self.leader = Gauge("oversale_reconciler_leader", "1 while this replica holds the reconcilers' Lease.",
                            registry=registry)
        self.hot_time = Gauge("oversale_hot_time_ratio",
                              "Observed hot time: share of samples above real allocatable, by scope (node, pool, "
                              "cluster), name, resource and window (1d, 7d).",
                              ["scope", "name", "resource", "window"], registry=registry)
        self.hot_time_budget = Gauge("oversale_hot_time_budget_ratio", "The hot-time budget in force, per pool.",
                                     ["pool", "resource"], registry=registry)
        self.budget_multiplier = Gauge("oversale_hot_time_account_multiplier",
                                       "The account's multiplier of a node's ratio target (1: as the budget "
                                       "predicts; below 1: backed off).", ["node", "resource"], registry=registry)
        self.overspends = Counter("oversale_hot_time_overspends", "Back-offs for an overspent budget, by scope "
                                  "(node: its own account; pool: the pool's, every node of it backed off).",
                                  ["scope", "pool", "resource"], registry=registry)
        self.pool_multiplier = Gauge("oversale_hot_time_pool_multiplier",
                                     "The pool account's multiplier of its nodes' ratio targets (each node takes "
                                     "the lower of its own and its pool's).", ["pool", "resource"], registry=registry)
        self.predictions = Counter("oversale_budget_predictions",
                                   "Samples checked against the peak predicted for them (the budget's quantile).",
                                   ["pool", "resource"], registry=registry)
        self.predictions_exceeded = Counter("oversale_budget_predictions_exceeded",
                                            "Samples above the peak predicted for them; over "
                                            "oversale_budget_predictions_total: about calibration x budget for usage "
                                            "as steady as its window, about the budget where the "
                                            "calibration holds (one sample per pass).",
                                            ["pool", "resource"], registry=registry)
        self.node_utilization = Gauge("oversale_node_real_utilization",
                                      "Node usage over its real allocatable at the remediator's last observation.",
                                      ["node", "resource"], registry=registry)
        self._reported: dict[tuple[Gauge, str], set[tuple[str, ...]]] = {}

    def report(self, gauge: Gauge, owner: str, series: Mapping[tuple[str, ...], float]) -> None:
        """Set the series of objects ``owner`` observed this pass, and remove those it reported
        before and not now: an object gone from the cluster (a node deleted while hot, a pool, a
        workload) must stop being reported, or its last value stays on dashboards and alerts
        for as long as the process lives.

        >>> metrics = ReconcilerMetrics()
        >>> metrics.report(metrics.node_utilization, "remediator", {("n1", "cpu"): 1.2, ("n2", "cpu"): 0.4})
        >>> metrics.report(metrics.node_utilization, "remediator", {("n2", "cpu"): 0.5})
        >>> metrics.registry.get_sample_value("oversale_node_real_utilization", {"node": "n1", "resource": "cpu"})
        >>> metrics.registry.get_sample_value("oversale_node_real_utilization", {"node": "n2", "resource": "cpu"})
        0.5
        """
        key = (gauge, owner)
        for labels in self._reported.get(key, set()) - set(series):
            gauge.remove(*labels)
        for labels, value in series.items():
            gauge.labels(*labels).set(value)
        self._reported[key] = set(series)

    def forget_observations(self) -> None:
        """Stop reporting what only the leader observes (the per-object series of :meth:`report`,
        the history's staleness, the hot nodes), once this replica no longer leads. Alerts take
        the highest (or lowest) value across replicas, and a former leader's last values would
        stand beside the new leader's for as long as the process lives: a node hot at the
        handover reported hot forever, or a stale history hidden behind an old fresh figure.

        >>> metrics = ReconcilerMetrics()
        >>> metrics.report(metrics.node_utilization, "remediator", {("n1", "cpu"): 1.2})
        >>> metrics.hot_nodes.set(1)
        >>> metrics.forget_observations()
        >>> metrics.registry.get_sample_value("oversale_node_real_utilization", {"node": "n1", "resource": "cpu"})
        >>> metrics.registry.get_sample_value("oversale_remediation_hot_nodes")
        0.0
        """
        for gauge, owner in list(self._reported):
            self.report(gauge, owner, {})
        self.staleness.clear()
        self.hot_nodes.set(0)
