import dataclasses
import re
import subprocess
import sys
from decimal import Decimal
from functools import cached_property

import pytest

from oversale.annotations import AnnotationKeys
from oversale.budget import budget_quantile, compression_percentile
from oversale.compression import CompressionConfig
from oversale.errors import SettingsError
from oversale.estimator import CompressionEstimator, OversaleEstimator, StabilityConfig
from oversale.node_oversale import OversaleLimits
from oversale.remediation import RemediationConfig, RuntimeWatermarks
from oversale.resize import ResizeLimits
from oversale.settings import REPLACED, Settings, unread_variables
from oversale.usage import LoadConfig, Watermarks
from tests.conftest import ROOT


def test_defaults_match_the_documented_ones():
    settings = Settings.from_env({})
    assert settings.annotation_prefix == "stke.platform"
    assert settings.max_ratio == Decimal(8) and settings.min_ratio == Decimal("0.5")
    assert settings.compression.min_ratio == settings.compression_estimator().min_ratio == Decimal("0.5")
    assert settings.cpu_floor_millicores == 10
    assert settings.memory_floor_bytes == 16 * 2**20
    assert settings.skips_namespace("kube-system") and settings.skips_namespace("oversale")
    assert not settings.skips_namespace("default")


def test_environment_overrides_with_quantities_and_lists():
    settings = Settings.from_env({
        "OVERSALE_CPU_FLOOR": "0.05", "OVERSALE_MEMORY_FLOOR": "32Mi", "OVERSALE_MAX_RATIO": "2.5",
        "OVERSALE_EXCLUDED_NAMESPACES": "a, b,,", "POD_NAMESPACE": "platform",
        "OVERSALE_ALLOW_GUARANTEED_DOWNGRADE": "TRUE", "OVERSALE_ANNOTATION_PREFIX": "example.com",
    })
    assert settings.cpu_floor_millicores == 50
    assert settings.memory_floor_bytes == 32 * 2**20
    assert settings.max_ratio == Decimal("2.5")
    assert settings.excluded_namespaces == frozenset({"a", "b"})
    assert settings.skips_namespace("platform")
    assert settings.allow_guaranteed_downgrade
    assert settings.keys.cpu_requests_ratio == "example.com/cpu-requests-ratio"


def test_every_estimator_knob_set_in_the_environment_reaches_the_reconcilers_estimators():
    """The reconcilers read their estimators from Settings alone: a variable that parses but is
    not passed on would be documented, accepted and ignored."""
    settings = Settings.from_env({
        "OVERSALE_CPU_HOT_TIME_BUDGET": "0.01", "OVERSALE_MEMORY_HOT_TIME_BUDGET": "0.002",
        "OVERSALE_BUDGET_CALIBRATION": "2", "OVERSALE_COMPRESSION_MARGIN": "0.2", "OVERSALE_MAX_RATIO": "3",
        "OVERSALE_MIN_RATIO": "0.8", "OVERSALE_MIN_HISTORY": "2d", "OVERSALE_MIN_SAMPLES": "50",
        "OVERSALE_FULL_CONFIDENCE": "14d", "OVERSALE_MIN_CHANGE": "0.2", "OVERSALE_MAX_RAISE": "0.5",
        "OVERSALE_CPU_TARGET": "0.8", "OVERSALE_MEMORY_TARGET": "0.5", "OVERSALE_MAX_CPU_OVERSALE_RATIO": "4",
        "OVERSALE_RECONCILE_MAX_MEMORY_RATIO": "1.1", "OVERSALE_FLOOR_MARGIN": "0.1", "OVERSALE_STALENESS": "30m",
        "OVERSALE_STALE_DECAY": "0.25",
    })
    stability = StabilityConfig(Decimal("0.2"), Decimal("0.5"))
    assert settings.compression_estimator() == CompressionEstimator(
        percentile=compression_percentile(0.01, 2.0), margin=Decimal("0.2"), max_ratio=Decimal(3),
        min_ratio=Decimal("0.8"), min_coverage_seconds=2 * 86400.0, min_samples=50,
        full_confidence_seconds=14 * 86400.0, stability=stability)
    assert settings.oversale_estimator() == OversaleEstimator(
        percentile=budget_quantile(0.01, 2.0), memory_percentile=budget_quantile(0.002, 2.0), budget_scale=2.0,
        cpu_target=Decimal("0.8"), memory_target=Decimal("0.5"), cpu_max_ratio=Decimal(4),
        memory_max_ratio=Decimal("1.1"), floor_margin=Decimal("0.1"), min_coverage_seconds=2 * 86400.0,
        min_samples=50, staleness_seconds=1800.0, decay=Decimal("0.25"), stability=stability)
    assert settings.compression_estimator() != Settings().compression_estimator()
    assert settings.oversale_estimator() != Settings().oversale_estimator()


def test_names_paths_and_queries_are_read_without_the_spaces_around_them():
    """A value from a YAML block scalar ends in a newline, a templated one may be only spaces:
    a query of spaces alone would be sent to Prometheus (a parse error) instead of the default."""
    settings = Settings.from_env({
        "OVERSALE_PROMETHEUS_NODE_CPU_QUERY": " instance:node_cpu:rate:sum\n",
        "OVERSALE_PROMETHEUS_NODE_MEMORY_QUERY": "  ",
        "OVERSALE_PROMETHEUS_BEARER_TOKEN_FILE": " /var/run/token\n", "OVERSALE_PROMETHEUS_CA_FILE": "\n",
        "OVERSALE_NAMESPACE": "platform\n", "POD_NAME": " extender-0 ",
    })
    assert settings.prometheus_node_cpu_query == "instance:node_cpu:rate:sum"
    assert settings.prometheus_node_memory_query == "" and settings.prometheus_ca_file == ""
    assert (settings.prometheus_bearer_token_file, settings.namespace, settings.pod_name) == \
        ("/var/run/token", "platform", "extender-0")


def test_every_webhook_placement_remediation_and_resize_knob_set_in_the_environment_reaches_its_policy():
    """As for the estimators: each policy reads its knobs from Settings alone, so a variable that
    parses but is not passed on would be documented, accepted and ignored."""
    settings = Settings.from_env({
        "OVERSALE_MAX_RATIO": "3", "OVERSALE_MIN_RATIO": "0.8", "OVERSALE_CPU_FLOOR": "20m",
        "OVERSALE_MEMORY_FLOOR": "8Mi", "OVERSALE_ALLOW_GUARANTEED_DOWNGRADE": "true",
        "OVERSALE_CPU_SCHEDULING_WATERMARK": "0.6", "OVERSALE_CPU_PEAK_SCHEDULING_WATERMARK": "0.8",
        "OVERSALE_MEMORY_SCHEDULING_WATERMARK": "0.75", "OVERSALE_METRICS_MAX_AGE": "2m",
        "OVERSALE_LOAD_HISTORY_WINDOW": "12h", "OVERSALE_LOAD_HISTORY_INTERVAL": "10m",
        "OVERSALE_BOUND_POD_SETTLE": "0",
        "OVERSALE_CPU_USAGE_ESTIMATE": "0.5", "OVERSALE_MEMORY_USAGE_ESTIMATE": "0.6",
        "OVERSALE_LOAD_SCORE_WEIGHT": "3", "OVERSALE_PACKING_SCORE_WEIGHT": "2",
        "OVERSALE_CPU_RUNTIME_WATERMARK": "0.9", "OVERSALE_MEMORY_RUNTIME_WATERMARK": "0.8",
        "OVERSALE_HOT_OBSERVATIONS": "4", "OVERSALE_EVICTION_MIN_POD_AGE": "0", "OVERSALE_EVICTION_MIN_REPLICAS": "3",
        "OVERSALE_EVICTIONS_PER_NODE": "2", "OVERSALE_EVICTIONS_PER_NAMESPACE": "4", "OVERSALE_EVICTIONS_PER_PASS": "9",
        "OVERSALE_NODE_COOLDOWN": "5m", "OVERSALE_WORKLOAD_COOLDOWN": "1h", "OVERSALE_REMEDIATION_INTERVAL": "30s",
        "OVERSALE_HOT_NODE_TAINT": "false",
        "OVERSALE_RESIZE_MAX_PER_PASS": "7", "OVERSALE_RESIZE_MAX_PER_WORKLOAD": "2",
        "OVERSALE_RESIZE_MIN_INTERVAL": "0",
        "OVERSALE_MAX_CPU_OVERSALE_RATIO": "3", "OVERSALE_MAX_MEMORY_OVERSALE_RATIO": "1.5",
    })
    assert settings.compression == CompressionConfig(Decimal(3), Decimal("0.8"), 20, 8 * 2**20, True)
    assert settings.load == LoadConfig(
        watermarks=Watermarks(Decimal("0.6"), Decimal("0.8"), Decimal("0.75")), max_age_seconds=120.0,
        history_peak_seconds=12 * 3600.0, history_max_age_seconds=1800.0, settle_seconds=0.0,
        cpu_estimate=Decimal("0.5"), memory_estimate=Decimal("0.6"), load_weight=3, packing_weight=2)
    assert settings.remediation_config == RemediationConfig(
        watermarks=RuntimeWatermarks(Decimal("0.9"), Decimal("0.8")), observations=4, min_pod_age_seconds=0.0,
        min_replicas=3, max_per_node=2, max_per_namespace=4, max_per_pass=9, node_cooldown_seconds=300.0,
        workload_cooldown_seconds=3600.0, interval_seconds=30.0, taint_hot_nodes=False)
    assert settings.resize_limits == ResizeLimits(7, 2, 0.0)
    assert settings.oversale_limits == OversaleLimits(Decimal(3), Decimal("1.5"))
    defaults = Settings()
    for policy in ("compression", "load", "remediation_config", "resize_limits", "oversale_limits"):
        assert getattr(settings, policy) != getattr(defaults, policy), policy


# Those whose whole message is checked (test_a_refused_value_says_what_would_be_taken) are not repeated here.
@pytest.mark.parametrize(("name", "value"), [
    ("OVERSALE_CPU_FLOOR", "lots"), ("OVERSALE_MIN_RATIO", "0"), ("OVERSALE_MIN_RATIO", "NaN"),
    ("OVERSALE_CPU_HOT_TIME_BUDGET", "1.01"),
    ("OVERSALE_MEMORY_HOT_TIME_BUDGET", "-0.1"), ("OVERSALE_CPU_HOT_TIME_BUDGET", "NaN"),
    ("OVERSALE_OWNER_LOOKUP_TIMEOUT", "-1"),
    ("OVERSALE_LOAD_HISTORY_WINDOW", "a day"), ("OVERSALE_BUDGET_CALIBRATION", "0"),
    ("OVERSALE_PROMETHEUS_URL", "http:///api"),
    ("OVERSALE_PROMETHEUS_URL", "http://:9090"), ("OVERSALE_PROMETHEUS_URL", "http://prometheus:ninety"),
    ("OVERSALE_CPU_RUNTIME_WATERMARK", "0"),  # every node hot
    ("OVERSALE_MEMORY_SCHEDULING_WATERMARK", "85%"),
    ("OVERSALE_PROMETHEUS_SELECTOR", "cluster=prod"), ("OVERSALE_PROMETHEUS_SELECTOR", 'cluster="a" env="b"'),
    ("OVERSALE_MIN_CHANGE", "1.5"), ("OVERSALE_COMPRESSION_MARGIN", "Infinity"),  # beyond their range
    ("OVERSALE_EXTENDER_LEASE_NAME", ""),
    ("OVERSALE_NAMESPACE", " "),  # the Leases' namespace: an empty one is no path the API serves
    *[("OVERSALE_KUBELET_USERNAME", template) for template in (  # a field other than {node}, or a stray brace
        "system:node:{node}{0}", "{node}.{node.name}", "system:node:{node}{")],
])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


FREE_TEXT = {
    "OVERSALE_ANNOTATION_PREFIX", "OVERSALE_NAMESPACE", "OVERSALE_EXCLUDED_NAMESPACES", "OVERSALE_POOL_LABELS",
    "OVERSALE_PROMETHEUS_NODE_LABEL", "OVERSALE_PROMETHEUS_NODE_CPU_QUERY", "OVERSALE_PROMETHEUS_NODE_MEMORY_QUERY",
    "OVERSALE_PROMETHEUS_BEARER_TOKEN_FILE", "OVERSALE_PROMETHEUS_CA_FILE", "OVERSALE_SQLITE_PATH",
    "OVERSALE_LEASE_NAME", "OVERSALE_EXTENDER_LEASE_NAME", "OVERSALE_SCHEDULER_NAMES", "POD_NAME",
}
"""Settings whose value is a name, a path, a label or a query: any text may be one."""


@pytest.mark.parametrize("name", sorted(spec.metadata["env"] for spec in dataclasses.fields(Settings)
                                        if spec.metadata["env"] not in FREE_TEXT))
@pytest.mark.parametrize("value", ["nonsense", "-1"])
def test_every_number_duration_switch_and_choice_refuses_nonsense_and_negatives(name, value):
    # A setting that took either would run with a value nobody meant, and say nothing.
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: value})
    assert str(refused.value).startswith(f"{name}={value!r}: "), str(refused.value)


@pytest.mark.parametrize(("name", "text", "value"), [
    *[("OVERSALE_ALLOW_GUARANTEED_DOWNGRADE", spelled, True) for spelled in ("1", "true", "Yes", "y", "ON")],
    *[("OVERSALE_ALLOW_GUARANTEED_DOWNGRADE", spelled, False) for spelled in ("0", "False", "no", "N", "off", "")],
    *[("OVERSALE_LOG_LEVEL", level.lower(), level) for level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")],
    ("OVERSALE_MAX_RATIO", "1", Decimal(1)),           # 1: compression off
    ("OVERSALE_MIN_RATIO", "1", Decimal(1)),           # 1: raising off
    ("OVERSALE_CPU_FLOOR", "0", 0),                    # no floor
    ("OVERSALE_COMPRESSION_MARGIN", "0", Decimal(0)),
    ("OVERSALE_NODE_SERIES_TTL", "1", 1.0),
    ("OVERSALE_PROMETHEUS_LATE_SAMPLES", "0", 0.0),    # the one duration that may be 0
    ("OVERSALE_RECONCILER_METRICS_PORT", "0", 0),
    ("OVERSALE_RECONCILER_METRICS_PORT", "65535", 65535),
    # As written in a URL or bare, and with YAML's spaces: the listener takes it bare.
    *[("OVERSALE_RECONCILER_METRICS_ADDRESS", written, "::") for written in ("::", "[::]", " :: ")],
    ("OVERSALE_RECONCILER_METRICS_ADDRESS", "127.0.0.1", "127.0.0.1"),
    ("OVERSALE_ANNOTATION_PREFIX", "a" * 253, "a" * 253),  # a DNS subdomain's longest
    ("OVERSALE_MIN_SAMPLES", "0", 0),
    ("OVERSALE_MAX_BODY_BYTES", "1", 1),
    ("OVERSALE_RESIZE_MIN_INTERVAL", " 5m ", 300.0),     # spaces around a duration, as YAML may leave them
    *[(name, "1", Decimal(1)) for name in ("OVERSALE_MIN_CHANGE", "OVERSALE_CPU_TARGET", "OVERSALE_MEMORY_TARGET",
                                           "OVERSALE_STALE_DECAY")],  # shares: at most all of it
    *[(name, "10", Decimal(10)) for name in ("OVERSALE_COMPRESSION_MARGIN", "OVERSALE_MAX_RAISE",
                                             "OVERSALE_FLOOR_MARGIN", "OVERSALE_CPU_USAGE_ESTIMATE",
                                             "OVERSALE_MEMORY_USAGE_ESTIMATE")],
    ("OVERSALE_KUBERNETES", "off", "off"),
    *[(name, "0", 0.0) for name in ("OVERSALE_MIN_HISTORY", "OVERSALE_NODE_COOLDOWN", "OVERSALE_WORKLOAD_COOLDOWN")],
    ("OVERSALE_PROMETHEUS_HEADERS", "X-Scope-OrgID=XYZ-prod", (("X-Scope-OrgID", "XYZ-prod"),)),
])
def test_each_setting_takes_the_values_at_its_documented_bounds(name, text, value):
    field = next(spec.name for spec in dataclasses.fields(Settings) if spec.metadata["env"] == name)
    assert getattr(Settings.from_env({name: text}), field) == value


@pytest.mark.parametrize(("name", "text"), [
    ("OVERSALE_NODE_SERIES_TTL", "0"), ("OVERSALE_RECONCILER_METRICS_PORT", "65536"),
    ("OVERSALE_ANNOTATION_PREFIX", "a" * 254), ("OVERSALE_MIN_RATIO", "0"),
    *[(name, "1.01") for name in ("OVERSALE_MIN_CHANGE", "OVERSALE_CPU_TARGET", "OVERSALE_MEMORY_TARGET",
                                  "OVERSALE_STALE_DECAY")],
    *[(name, "10.01") for name in ("OVERSALE_COMPRESSION_MARGIN", "OVERSALE_MAX_RAISE", "OVERSALE_FLOOR_MARGIN",
                                   "OVERSALE_CPU_USAGE_ESTIMATE", "OVERSALE_MEMORY_USAGE_ESTIMATE")],
])
def test_a_value_just_past_its_bound_is_refused(name, text):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: text})


@pytest.mark.parametrize(("name", "value", "wanted"), [
    ("OVERSALE_KUBERNETES", "maybe", "must be one of auto, off"),
    ("OVERSALE_LOAD_HISTORY", "thanos", "must be one of metrics-api, prometheus"),
    ("OVERSALE_ALLOW_GUARANTEED_DOWNGRADE", "perhaps", "must be true or false"),
    ("OVERSALE_MAX_RATIO", "abc", "must be a number >= 1"), ("OVERSALE_MAX_RATIO", "0.5", "must be a number >= 1"),
    ("OVERSALE_MIN_RATIO", "abc", "must be a number above 0 and at most 1"),
    ("OVERSALE_MIN_RATIO", "1.5", "must be a number above 0 and at most 1"),
    ("OVERSALE_MIN_CHANGE", "1.01", "must be a number from 0 to 1"),
    ("OVERSALE_ANNOTATION_PREFIX", "a/b", "must be a DNS subdomain such as stke.platform (no slash)"),
    ("OVERSALE_LOG_LEVEL", "LOUD", "must be DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    ("OVERSALE_PROMETHEUS_URL", "prometheus:9090",
     "must be an http:// or https:// URL such as http://prometheus.monitoring:9090"),
    ("OVERSALE_CPU_SCHEDULING_WATERMARK", "0",
     "must be a number above 0 and at most 1 (a share of real capacity; 1: never exceeded)"),
    ("OVERSALE_MIN_SAMPLES", "-1", "must be 0 or more"),
    ("OVERSALE_SCHEDULER_NAMES", " , ", "must name at least one scheduler profile, e.g. oversale"),
    ("OVERSALE_RECONCILER_METRICS_PORT", "65536", "must be a port number"),
    # A name would be resolved at each start, to whichever address comes first.
    *[("OVERSALE_RECONCILER_METRICS_ADDRESS", written, "must be an IP address such as 0.0.0.0, :: or 127.0.0.1")
      for written in ("localhost", "0.0.0.0:8080", "")],
    ("OVERSALE_LEASE_NAME", "  ", "must not be empty"),
    ("OVERSALE_CPU_FLOOR", "-10m", "must be 0 or more, such as 10m (0: no floor)"),
    ("OVERSALE_RECONCILE_INTERVAL", "often", "must be a duration such as 300, 5m, 24h or 7d"),
    ("OVERSALE_MEMORY_FLOOR", "-1Mi", "must be 0 or more, such as 16Mi (0: no floor)"),
    ("OVERSALE_WORKERS", "0", "must be at least 1"),
    ("OVERSALE_MAX_BODY_BYTES", "0", "must be a size above 0, such as 768Mi or 2Gi"),
    ("OVERSALE_MIN_CHANGE", "lots", "must be a number from 0 to 1"),
    ("OVERSALE_KUBELET_USERNAME", "system:node", "must contain {node}, e.g. system:node:{node}"),
    ("OVERSALE_KUBELET_USERNAME", "system:node:{node}{pool}",
     "must contain {node} and no other {...}, e.g. system:node:{node}"),
    # A line break in a value would end the header there and start another (header injection).
    ("OVERSALE_PROMETHEUS_HEADERS", "X-Scope-OrgID=prod\nX-Forwarded-For=10.0.0.1",
     "'X-Scope-OrgID=prod\\nX-Forwarded-For=10.0.0.1' is no Name=value header (several: separated by commas)"),
])
def test_a_refused_value_says_what_would_be_taken(name, value, wanted):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: value})
    assert str(refused.value) == f"{name}={value!r}: {wanted}"


def test_the_load_history_from_prometheus_needs_its_url():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"OVERSALE_LOAD_HISTORY": "prometheus"})
    assert str(refused.value) == \
        "OVERSALE_LOAD_HISTORY='prometheus' needs OVERSALE_PROMETHEUS_URL (where node-exporter's series are)"
    assert Settings.from_env({"OVERSALE_LOAD_HISTORY": "prometheus",
                              "OVERSALE_PROMETHEUS_URL": "http://prometheus:9090"}).load_history == "prometheus"


def test_a_duration_that_may_be_0_says_so_when_refused():
    with pytest.raises(SettingsError) as late:
        Settings.from_env({"OVERSALE_PROMETHEUS_LATE_SAMPLES": "-1s"})
    assert str(late.value) == "OVERSALE_PROMETHEUS_LATE_SAMPLES='-1s': must be 0 or a positive duration"
    with pytest.raises(SettingsError) as ttl:
        Settings.from_env({"OVERSALE_NODE_SERIES_TTL": "0"})
    assert str(ttl.value) == "OVERSALE_NODE_SERIES_TTL='0': must be a positive duration"


def test_the_prometheus_url_is_a_base_url_or_empty():
    assert Settings.from_env({"OVERSALE_PROMETHEUS_URL": " https://mon.example:9090/prom/ "}).prometheus_url == \
        "https://mon.example:9090/prom"
    assert Settings.from_env({"OVERSALE_PROMETHEUS_URL": "  "}).prometheus_url == ""



@pytest.mark.parametrize("url", ["http://[::1]:9090", "http://[fd00::7]", "HTTPS://mon.example",
                                 "http://reader:s3cret@prometheus.monitoring"])
def test_an_ipv6_host_an_upper_case_scheme_and_credentials_are_a_base_url(url):
    assert Settings.from_env({"OVERSALE_PROMETHEUS_URL": url}).prometheus_url == url


@pytest.mark.parametrize("url", ["http://prom etheus:9090", "http://[]:9090", "http://prometheus:\u0669\u0660"])
def test_a_space_inside_an_empty_ipv6_host_or_a_port_of_other_digits_is_refused(url):
    """Arabic-Indic digits are decimal to Python, not to an HTTP client."""
    with pytest.raises(SettingsError, match="OVERSALE_PROMETHEUS_URL"):
        Settings.from_env({"OVERSALE_PROMETHEUS_URL": url})


def test_a_selector_is_written_back_in_one_form_and_a_bad_matcher_is_named_alone():
    assert Settings.from_env({"OVERSALE_PROMETHEUS_SELECTOR": ' cluster="a" ,  env!="dev",'}).prometheus_selector == \
        'cluster="a", env!="dev"'
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"OVERSALE_PROMETHEUS_SELECTOR": 'cluster="a", env=dev , zone="b"'})
    assert "'env=dev' is no PromQL label matcher" in str(refused.value)


def test_a_load_history_read_is_used_for_three_read_intervals():
    """As docs/settings.md says of OVERSALE_LOAD_HISTORY_INTERVAL: a read older than three
    intervals is no longer used (one missed read is no outage)."""
    assert Settings.from_env({}).load.history_max_age_seconds == 900
    assert Settings.from_env({"OVERSALE_LOAD_HISTORY_INTERVAL": "10m"}).load.history_max_age_seconds == 1800


@pytest.mark.parametrize("selector", ['{cluster="a"', 'cluster="a"}'])
def test_a_selector_with_one_brace_is_refused_whole(selector):
    """Only a pair of braces is taken off; one alone is part of what is named as no matcher."""
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"OVERSALE_PROMETHEUS_SELECTOR": selector})
    assert f"{selector!r} is no PromQL label matcher" in str(refused.value)


def test_a_refused_value_is_explained_in_its_own_unit():
    with pytest.raises(SettingsError) as calibration:
        Settings.from_env({"OVERSALE_BUDGET_CALIBRATION": "-1"})
    assert str(calibration.value) == \
        "OVERSALE_BUDGET_CALIBRATION='-1': must be a positive factor (quantile 1 - calibration x budget)"
    with pytest.raises(SettingsError) as timeout:
        Settings.from_env({"OVERSALE_OWNER_LOOKUP_TIMEOUT": "-1"})
    assert str(timeout.value) == "OVERSALE_OWNER_LOOKUP_TIMEOUT='-1': must be a positive number of seconds"


@pytest.mark.parametrize(("name", "percentile"), [
    ("OVERSALE_NODE_PERCENTILE", "percentile = 1 - budget"),
    ("OVERSALE_COMPRESSION_PERCENTILE", "percentile = 1 - budget, at least 0.9"),
])
def test_a_variable_of_an_earlier_version_stops_the_start_with_what_replaces_it(name, percentile):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: "0.99", "OVERSALE_MAX_RATIO": "4"})
    assert str(refused.value) == \
        f"{name}='0.99': no longer read; the hot-time budget sets it: OVERSALE_CPU_HOT_TIME_BUDGET ({percentile})"


def test_a_bad_setting_stops_the_server_with_the_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "--bind", "127.0.0.1:0", "--certs-dir", str(tmp_path)],
        cwd=ROOT, env={"OVERSALE_MAX_RATIO": "abc", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "OVERSALE_MAX_RATIO='abc'" in result.stderr


def test_the_settings_reference_documents_every_setting():
    reference = (ROOT / "docs" / "settings.md").read_text()
    for field in dataclasses.fields(Settings):
        assert f"`{field.metadata['env']}`" in reference, field.name



def test_every_annotation_and_label_the_project_reads_or_writes_is_named_in_the_docs():
    # A user sets these on their objects or meets them there (kubectl describe): each is named in
    # docs/ by its full key, or (a pair told together, "`cpu-...` / `memory-...`") by its hyphenated
    # name after the prefix in backticks.
    docs = "".join(page.read_text() for page in (ROOT / "docs").glob("*.md"))
    keys = AnnotationKeys()
    named = [getattr(keys, name) for name, value in vars(AnnotationKeys).items() if isinstance(value, cached_property)]
    assert len(named) >= 40 and all(key.startswith("stke.platform/") for key in named)
    unnamed = [key for key in named if not re.search(re.escape(key) + r"(?![\w-])", docs)  # not hot for hot-time
               and not ("-" in key and f"`{key.split('/', 1)[1]}`" in docs)]
    assert not unnamed

def test_every_documented_default_set_by_hand_is_the_default():
    # A user who copies a default from the reference into their manifest must get what they had:
    # the table says each default truly, and each setting's parser takes its own default.
    reference = (ROOT / "docs" / "settings.md").read_text()
    documented = dict(re.findall(r"^\| `((?:OVERSALE|POD)_[A-Z_]+)` \| `([^`]+)` \|", reference, re.MULTILINE))
    assert len(documented) >= 90, "the reference's table is read"
    settings = {spec.metadata["env"] for spec in dataclasses.fields(Settings)}
    assert set(documented) <= settings, set(documented) - settings
    assert Settings.from_env(documented) == Settings.from_env({}), \
        [name for name, value in documented.items() if Settings.from_env({name: value}) != Settings.from_env({})]


def test_the_readme_is_short_and_every_docs_page_is_linked_and_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, page.name
    for document in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", document.read_text()):
            if "://" not in target:
                assert (document.parent / target).exists(), f"{document.name} links to {target}"


def test_a_variable_no_setting_reads_is_named_with_the_closest_setting_only_where_one_is_close():
    assert unread_variables({"OVERSALE_MAX_RATO": "4", "OVERSALE_COLOUR": "blue", "OVERSALE_MAX_RATIO": "4",
                             "PATH": "/bin"}) == [
        "OVERSALE_COLOUR is not a setting; ignored",
        "OVERSALE_MAX_RATO is not a setting; ignored (did you mean OVERSALE_MAX_RATIO?)"]
    # A variable of an earlier version stops the start with what replaces it: it is not called unknown too.
    assert unread_variables(dict.fromkeys(REPLACED, "0.99")) == []


def test_scheduler_profiles_are_a_comma_separated_list_of_names():
    assert Settings.from_env({"OVERSALE_SCHEDULER_NAMES": " oversale, batch-scheduler ,,"}).scheduler_names == \
        frozenset({"oversale", "batch-scheduler"})
