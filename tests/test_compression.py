"""The compression policy as pure functions: examples a user would check, then properties."""

from __future__ import annotations

import copy
import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oversale.annotations import AnnotationKeys
from oversale.compression import (
    CompressionConfig,
    compress_requests,
    compress_running_pod,
    effective_annotations,
    policy_from_annotations,
    recorded_pod_request,
)
from oversale.limitrange import NO_BOUNDS, bounds_from_limit_ranges, quota_room, scope_holds
from oversale.pods import effective_request, qos_class, requests_of
from oversale.quantity import format_bytes, format_millicores, parse_amount

KEYS = AnnotationKeys()
CONFIG = CompressionConfig()


def policy(cpu: str | None = None, memory: str | None = None, config: CompressionConfig = CONFIG, **extra: str):
    annotations = {**extra}
    if cpu is not None:
        annotations[KEYS.cpu_requests_ratio] = cpu
    if memory is not None:
        annotations[KEYS.memory_requests_ratio] = memory
    return policy_from_annotations(annotations, KEYS, config)


def container(name: str, cpu: str | None = None, memory: str | None = None, limits: dict | None = None, **extra):
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    resources: dict = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def pod(*containers, init=(), annotations=None, **spec):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "default", "annotations": annotations or {}},
        "spec": {"containers": list(containers), "initContainers": list(init), **spec},
    }


def cpu_quota(hard: str, used: str, **spec) -> dict:
    """A ResourceQuota on requests.cpu as the quota controller reports it, ``used`` of ``hard``."""
    return {"spec": {"hard": {"requests.cpu": hard}, **spec},
            "status": {"hard": {"requests.cpu": hard}, "used": {"requests.cpu": used}}}


def audit(p) -> str:
    """The audit annotation a user reads on the Pod."""
    return p["metadata"]["annotations"][KEYS.compression]


def requests(p, name):
    for c in [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]:
        if c["name"] == name:
            return c.get("resources", {}).get("requests", {})
    raise KeyError(name)


def test_ratio_two_halves_cpu_and_leaves_memory_and_limits_alone():
    original = pod(container("app", "500m", "256Mi", limits={"cpu": "1", "memory": "512Mi"}))
    result = compress_requests(original, policy(cpu="2"))
    assert requests(result.pod, "app") == {"cpu": "250m", "memory": "256Mi"}
    assert result.pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert result.freed == {"cpu": 250}
    assert original["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m", "input not modified"
    recorded = json.loads(result.pod["metadata"]["annotations"][KEYS.original_requests])
    assert recorded == {"app": {"cpu": "500m", "memory": "256Mi"}}
    assert "cpu ratio 2" in audit(result.pod)


def test_memory_is_compressed_only_with_its_own_annotation():
    result = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="2", memory="4"))
    assert requests(result.pod, "app") == {"cpu": "500m", "memory": "256Mi"}


def test_decimal_ratio_is_exact_and_rounds_up():
    # 1000m / 3.7 = 270.27..m: the request must never drop below orig / ratio, so 271m.
    result = compress_requests(pod(container("app", "1")), policy(cpu="3.7"))
    assert requests(result.pod, "app")["cpu"] == "271m"
    # 370m / 3.7 is exactly 100m; a binary float would give 100.00000000000001 -> 101m.
    result = compress_requests(pod(container("app", "370m")), policy(cpu="3.7"))
    assert requests(result.pod, "app")["cpu"] == "100m"


def test_ratio_one_means_no_compression():
    original = pod(container("app", "1"))
    result = compress_requests(original, policy(cpu="1"))
    assert result.pod == original and result.skipped == "no compression ratio set"


def test_floors_hold_and_never_raise_a_smaller_request():
    result = compress_requests(pod(container("a", "15m", "20Mi"), container("b", "5m", "8Mi")),
                               policy(cpu="4", memory="4"))
    assert requests(result.pod, "a") == {"cpu": "10m", "memory": "16Mi"}
    assert requests(result.pod, "b") == {"cpu": "5m", "memory": "8Mi"}
    assert audit(result.pod) == ("cpu ratio 4: 20m -> 15m; memory ratio 4: 28Mi -> 24Mi; guards: a/cpu floor 10m, "
                                 "b/cpu floor 10m, a/memory floor 16Mi, b/memory floor 16Mi")
    # A Pod whose every request is at its floor already is left as it came, and says why.
    floored = pod(container("b", "5m", "8Mi"))
    left = compress_requests(floored, policy(cpu="4", memory="4"))
    assert left.pod == floored and left.skipped == "requests already at their floors"
    exact = compress_requests(pod(container("a", "40m")), policy(cpu="4"))
    assert audit(exact.pod) == "cpu ratio 4: 40m -> 10m", "at the floor, not held"


def test_a_request_left_as_it_was_keeps_its_spelling_and_no_record_of_a_raise_is_written():
    # cpu stays at its floor (freed 0): the user's "0.005" is not rewritten as "5m", and a
    # compression writes no written-requests record: that one is for raises only.
    result = compress_requests(pod(container("app", "0.005", "1Gi")), policy(cpu="2", memory="2"))
    assert requests(result.pod, "app") == {"cpu": "0.005", "memory": "512Mi"}
    assert result.freed == {"cpu": 0, "memory": 2**29}
    assert KEYS.written_requests not in result.pod["metadata"]["annotations"]
    raised = compress_requests(pod(container("app", "1")), policy(cpu="0.5")).pod
    assert json.loads(raised["metadata"]["annotations"][KEYS.written_requests]) == {"app": {"cpu": "2"}}


def test_a_container_with_a_limit_alone_is_compressed_from_it_and_recorded():
    # The API server defaults a missing request to the limit: that is what the scheduler reserves.
    limited = pod(container("app", limits={"cpu": "1"}))
    result = compress_requests(limited, policy(cpu="2"))
    assert requests(result.pod, "app") == {"cpu": "500m"}
    assert json.loads(result.pod["metadata"]["annotations"][KEYS.original_requests]) == {"app": {"cpu": "1"}}
    assert compress_requests(result.pod, policy(cpu="2")).pod == result.pod, "idempotent"


def test_init_containers_and_native_sidecars_shrink_too():
    p = pod(
        container("app", "1", "1Gi"),
        init=[container("migrate", "2", "512Mi"), container("proxy", "400m", "128Mi", restartPolicy="Always")],
    )
    before = effective_request(p, "cpu")
    result = compress_requests(p, policy(cpu="2"))
    assert requests(result.pod, "migrate")["cpu"] == "1"
    assert requests(result.pod, "proxy")["cpu"] == "200m"
    assert before == 2000  # max(init 2000, app 1000 + sidecar 400)
    assert effective_request(result.pod, "cpu") == 1000


def test_pod_level_requests_follow_the_same_rule():
    p = pod(container("app", "1"), resources={"requests": {"cpu": "2", "memory": "1Gi"}})
    result = compress_requests(p, policy(cpu="2"))
    assert result.pod["spec"]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert json.loads(result.pod["metadata"]["annotations"][KEYS.original_requests])["(pod)"] == {
        "cpu": "2", "memory": "1Gi"}
    # The floor holds there too: 20m / 4 would be 5m.
    small = compress_requests(pod(container("app", "10m"), resources={"requests": {"cpu": "20m"}}), policy(cpu="4"))
    assert small.pod["spec"]["resources"]["requests"] == {"cpu": "10m"}


def test_guaranteed_pods_are_left_alone_with_a_warning_unless_allowed():
    p = pod(container("db", "2", "4Gi", limits={"cpu": "2", "memory": "4Gi"}))
    assert qos_class(p) == "Guaranteed"
    result = compress_requests(p, policy(cpu="2"))
    assert result.pod == p and result.skipped == "Guaranteed Pod"
    assert result.warnings == ["Guaranteed Pod not compressed: lower requests would make it Burstable (set "
                               "OVERSALE_ALLOW_GUARANTEED_DOWNGRADE=true to allow)"]
    allowed = compress_requests(p, policy(cpu="2", config=CompressionConfig(allow_guaranteed_downgrade=True)))
    assert requests(allowed.pod, "db")["cpu"] == "1"
    assert qos_class(allowed.pod) == "Burstable"
    # Guaranteed by its pod-level resources, whatever its containers say.
    both = {"cpu": "2", "memory": "4Gi"}
    pod_level = pod(container("db", "1", "2Gi"), resources={"requests": both, "limits": both})
    assert compress_requests(pod_level, policy(cpu="2")).skipped == "Guaranteed Pod"


def test_a_pod_asking_for_exclusive_cpus_keeps_its_cpu_request():
    # The extender gives it as many whole CPUs as its cpu request: halving the request would halve
    # its cores, and 1.5 would make it fractional and lose the binding altogether.
    bound = pod(container("app", "4", "4Gi", limits={"cpu": "8", "memory": "8Gi"}),
                annotations={KEYS.cpu_bind_policy: "FullPCPUs"})
    for ratio in ("2", "1.5", "0.5"):
        result = compress_requests(bound, policy(cpu=ratio))
        assert result.pod == bound
        assert result.skipped == ("cpu request kept: it asks for exclusive CPUs (stke.platform/cpu-bind-policy: "
                                  "FullPCPUs), as many as its cpu request")
        assert result.warnings == ["cpu request not compressed: it asks for exclusive CPUs "
                                   "(stke.platform/cpu-bind-policy: FullPCPUs), as many as its cpu request"]
    both = compress_requests(bound, policy(cpu="2", memory="2"))
    assert requests(both.pod, "app") == {"cpu": "4", "memory": "2Gi"}, "memory still follows its ratio"
    assert both.freed == {"memory": 2 * 2**30}
    memory_only = compress_requests(bound, policy(memory="2"))
    assert requests(memory_only.pod, "app") == {"cpu": "4", "memory": "2Gi"}
    assert memory_only.warnings == [], "no cpu ratio asked: nothing to say of its cpus"
    # A Pod already holding a cpuset (written at bind) keeps it too; a policy name nobody serves does not count.
    holding = pod(container("app", "4", "4Gi"), annotations={KEYS.resource_status: '{"cpuset":"0-3","numaNode":0}'})
    assert compress_requests(holding, policy(cpu="2")).skipped == (
        f"cpu request kept: it holds exclusive CPUs ({KEYS.resource_status}), as many as its cpu request")
    unknown = pod(container("app", "4", "4Gi"), annotations={KEYS.cpu_bind_policy: "Always"})
    assert requests(compress_requests(unknown, policy(cpu="2")).pod, "app")["cpu"] == "2"


def test_invalid_annotation_leaves_only_that_resource_alone():
    result = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="abc", memory="2"))
    assert requests(result.pod, "app") == {"cpu": "1", "memory": "512Mi"}
    assert [p.key for p in policy(cpu="abc", memory="2").problems] == [KEYS.cpu_requests_ratio]
    assert result.warnings == [f"annotation {KEYS.cpu_requests_ratio}='abc' ignored: 'abc' is not a plain decimal "
                               "number such as 1, 1.5 or 2.25; cpu not compressed"]


def test_ratio_above_maximum_is_clamped_with_a_warning():
    result = compress_requests(pod(container("app", "1")), policy(cpu="10"))
    assert requests(result.pod, "app")["cpu"] == "125m"
    assert any("above the maximum 8" in w for w in result.warnings)
    at_most = compress_requests(pod(container("app", "1")), policy(cpu="8"))
    assert requests(at_most.pod, "app")["cpu"] == "125m" and at_most.warnings == [], "the maximum itself is allowed"


def test_switch_off_disables_even_with_a_ratio():
    original = pod(container("app", "1"))
    result = compress_requests(original, policy(cpu="2", **{KEYS.enable_resource_compress: "No"}))
    assert result.pod == original and result.skipped == f"disabled by {KEYS.enable_resource_compress}"


def test_a_resource_no_container_requests_is_left_out_of_the_record():
    """A Pod requesting memory only, under ratios for both: its cpu (none) is not compressed to
    nothing, and the audit annotation names memory alone."""
    result = compress_requests(pod(container("app", memory="512Mi")), policy(cpu="2", memory="2"))
    assert audit(result.pod) == "memory ratio 2: 512Mi -> 256Mi"
    assert result.applied.keys() == {"memory"} and result.freed == {"memory": 256 * 2**20}


def test_a_switch_nobody_can_read_is_said_and_the_ratio_still_applies():
    result = compress_requests(pod(container("app", "1")), policy(cpu="2", **{KEYS.enable_resource_compress: "maybe"}))
    assert requests(result.pod, "app")["cpu"] == "500m", "a typo does not switch compression off"
    assert result.warnings == [f"annotation {KEYS.enable_resource_compress}='maybe' ignored: 'maybe' is not one of "
                               "y, yes, true, n, no, false"]


def test_pod_annotations_override_the_workload_per_key():
    merged = effective_annotations(
        {KEYS.cpu_requests_ratio: "2", KEYS.memory_requests_ratio: "2", "unrelated": "x"},
        {KEYS.cpu_requests_ratio: "3"},
        KEYS,
    )
    assert merged == {KEYS.cpu_requests_ratio: "3", KEYS.memory_requests_ratio: "2"}


def test_a_container_without_the_request_is_passed_over_not_the_end_of_the_pod():
    result = compress_requests(pod(container("logger"), container("app", "1")), policy(cpu="2"))
    assert requests(result.pod, "app") == {"cpu": "500m"} and requests(result.pod, "logger") == {}


def test_mirror_pods_and_pods_without_requests_are_skipped():
    mirror = pod(container("etcd", "1"), annotations={"kubernetes.io/config.mirror": "abc"})
    assert compress_requests(mirror, policy(cpu="2")).skipped.startswith("mirror")
    assert compress_requests(pod(container("app")), policy(cpu="2")).skipped == "no cpu or memory requests"


def test_container_limitrange_min_and_limit_request_ratio_cap_the_compression():
    bounds = bounds_from_limit_ranges([{"spec": {"limits": [
        {"type": "Container", "min": {"cpu": "100m"}, "maxLimitRequestRatio": {"memory": "2"}},
    ]}}])
    p = pod(container("app", "300m", "2Gi", limits={"memory": "3Gi"}))
    result = compress_requests(p, policy(cpu="4", memory="4"), bounds)
    assert requests(result.pod, "app") == {"cpu": "100m", "memory": "1536Mi"}
    assert audit(result.pod) == ("cpu ratio 4: 300m -> 100m; memory ratio 4: 2Gi -> 1536Mi; "
                                 "guards: app/cpu LimitRange, app/memory LimitRange")
    # Landing exactly on the minimum is no cap: the audit names no guard.
    exact = compress_requests(pod(container("app", "400m")), policy(cpu="4"), bounds)
    assert requests(exact.pod, "app") == {"cpu": "100m"}
    assert audit(exact.pod) == "cpu ratio 4: 400m -> 100m"


def test_pod_limitrange_min_caps_the_ratio_for_the_whole_pod():
    bounds = bounds_from_limit_ranges([{"spec": {"limits": [{"type": "Pod", "min": {"cpu": "800m"}}]}}])
    p = pod(container("a", "1"), container("b", "1"))
    result = compress_requests(p, policy(cpu="4"), bounds)
    assert effective_request(result.pod, "cpu") >= 800
    assert requests(result.pod, "a")["cpu"] == "400m"
    assert "capped by Pod LimitRange" in audit(result.pod)
    # A ratio under 2 capped alike is told alike.
    one_and_a_half = compress_requests(pod(container("a", "1")), policy(cpu="1.5"), bounds)
    assert audit(one_and_a_half.pod) == "cpu ratio 1.25 (asked 1.5, capped by Pod LimitRange): 1 -> 800m"
    # At the minimum already: nothing to take, and the account says what held it.
    held = compress_requests(pod(container("a", "400m"), container("b", "400m")), policy(cpu="4"), bounds)
    assert requests(held.pod, "a")["cpu"] == "400m" and requests(held.pod, "b")["cpu"] == "400m"
    assert held.reasons == ["guards: cpu kept by Pod LimitRange"] and held.applied == {}


def test_a_resource_a_guard_keeps_whole_leaves_the_other_to_its_ratio():
    at_minimum = bounds_from_limit_ranges([{"spec": {"limits": [{"type": "Pod", "min": {"cpu": "800m"}}]}}])
    kept = compress_requests(pod(container("a", "400m", "1Gi"), container("b", "400m")), policy(cpu="4", memory="2"),
                             at_minimum)
    assert requests(kept.pod, "a") == {"cpu": "400m", "memory": "512Mi"}
    assert kept.applied == {"memory": 2}
    full = cpu_quota("4", used="4")
    not_raised = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="0.5", memory="0.5"),
                                   bounds_from_limit_ranges([]).with_quotas([full]))
    assert requests(not_raised.pod, "app") == {"cpu": "1", "memory": "2Gi"}
    assert not_raised.applied == {"memory": Fraction(1, 2)}


def test_an_uncapped_ratio_says_only_what_it_did():
    result = compress_requests(pod(container("app", "1")), policy(cpu="2"))
    assert audit(result.pod) == "cpu ratio 2: 1 -> 500m"


def test_recorded_originals_make_repeated_calls_idempotent_even_after_a_ratio_change():
    first = compress_requests(pod(container("app", "1")), policy(cpu="2")).pod
    assert compress_requests(first, policy(cpu="2")).pod == first
    # A reinvocation that sees another ratio starts again from the recorded original.
    assert requests(compress_requests(first, policy(cpu="4")).pod, "app")["cpu"] == "250m"
    restored = compress_requests(first, policy(cpu="1")).pod
    assert requests(restored, "app")["cpu"] == "1"
    assert KEYS.original_requests not in restored["metadata"]["annotations"]


def test_pod_level_requests_start_again_from_their_record_on_reinvocation():
    first = compress_requests(pod(container("app", "1"), resources={"requests": {"cpu": "2"}}), policy(cpu="2")).pod
    assert first["spec"]["resources"]["requests"] == {"cpu": "1"}
    assert compress_requests(first, policy(cpu="2")).pod == first
    again = compress_requests(first, policy(cpu="4")).pod
    assert again["spec"]["resources"]["requests"] == {"cpu": "500m"}, "2 cores / 4, not 1 core / 4"
    assert requests(again, "app")["cpu"] == "250m"


def test_a_request_raised_by_another_webhook_after_us_is_the_new_original():
    first = compress_requests(pod(container("app", "1")), policy(cpu="2")).pod
    raised = copy.deepcopy(first)
    raised["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    assert requests(compress_requests(raised, policy(cpu="2")).pod, "app")["cpu"] == "1500m"


def test_a_record_entry_that_is_no_container_or_no_resource_of_ours_is_passed_over():
    record = '{"app": {"cpu": "1", "nvidia.com/gpu": "1"}, "sidecar": "2", "gone": {"cpu": "2"}}'
    result = compress_requests(pod(container("app", "500m"), container("sidecar", "100m"),
                                   annotations={KEYS.original_requests: record}), policy(cpu="2"))
    assert requests(result.pod, "app") == {"cpu": "500m"} and requests(result.pod, "sidecar") == {"cpu": "50m"}
    assert result.warnings == [] and audit(result.pod) == "cpu ratio 2: 1100m -> 550m"


def test_a_record_naming_a_container_the_pod_no_longer_has_still_restores_the_others():
    # Another mutating webhook may take a container out before this one is called again.
    first = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="2")).pod
    first["metadata"]["annotations"][KEYS.original_requests] = json.dumps(
        {"gone": {"cpu": "3"}, "app": {"cpu": "1", "memory": "1Gi"}})
    again = compress_requests(first, policy(cpu="2"))
    assert requests(again.pod, "app") == {"cpu": "500m", "memory": "1Gi"}, "1 core / 2, not 500m / 2"
    assert again.warnings == []


def test_a_broken_original_requests_annotation_is_reported_not_trusted():
    p = pod(container("app", "1"), annotations={KEYS.original_requests: "{not json"})
    result = compress_requests(p, policy(cpu="2"))
    assert requests(result.pod, "app")["cpu"] == "500m"
    assert any("original-requests ignored" in w for w in result.warnings)
    listed = compress_requests(pod(container("app", "1"), annotations={KEYS.original_requests: "[1]"}), policy(cpu="2"))
    assert f"annotation {KEYS.original_requests} ignored (not a JSON object); current requests taken as original" \
        in listed.warnings


def test_a_running_pod_is_right_sized_only_where_in_place_resize_reaches():
    # In place: only the resources asked for (memory may restart a container) and only app
    # containers and sidecars (a regular init container has finished; the API refuses it).
    p = pod(container("app", "1", limits={"memory": "1Gi"}),
            init=[container("migrate", "2", "1Gi"), container("proxy", "200m", "128Mi", restartPolicy="Always")])
    result = compress_running_pod(p, policy(cpu="2", memory="2"), NO_BOUNDS, frozenset({"cpu"}))
    assert requests(result.pod, "migrate") == {"cpu": "2", "memory": "1Gi"}
    assert requests(result.pod, "proxy") == {"cpu": "100m", "memory": "128Mi"}
    assert requests(result.pod, "app") == {"cpu": "500m"}, "its memory limit alone stays its memory request"
    # The scheduler still counts the finished init container's 2 cores: nothing is freed yet.
    assert result.freed == {"cpu": 0, "memory": 0}
    assert KEYS.written_requests not in result.pod["metadata"]["annotations"], "nothing raised"
    # The audit says what the Pod holds after the resize, and what a new Pod would get.
    assert audit(result.pod) == (
        "cpu ratio 2: 2 -> 2 in place (1 at the next rollout); "
        "memory ratio 2: 1152Mi -> 1152Mi in place (576Mi at the next rollout)")
    # Without the finished init container, cpu is resized as a new Pod would be admitted.
    plain = compress_running_pod(pod(container("app", "1", "1Gi")), policy(cpu="2"), NO_BOUNDS, frozenset({"cpu"}))
    assert audit(plain.pod) == "cpu ratio 2: 1 -> 500m"
    # Containers asking nothing (no requests, or no resources at all) are passed over.
    quiet = pod(container("app", "1"), container("logger"), {"name": "shell", "image": "busybox"})
    resized = compress_running_pod(quiet, policy(cpu="2", memory="2"), NO_BOUNDS, frozenset({"cpu"}))
    assert [requests(resized.pod, name) for name in ("app", "logger", "shell")] == [{"cpu": "500m"}, {}, {}]


def test_a_running_pod_whose_ratio_is_taken_away_gets_back_what_resize_reaches_and_loses_our_record():
    admitted = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="2", memory="2")).pod
    assert requests(admitted, "app") == {"cpu": "500m", "memory": "512Mi"}
    result = compress_running_pod(admitted, policy(), NO_BOUNDS, frozenset({"cpu"}))
    assert result.skipped == "no compression ratio set"
    # Memory is not resized in place: it keeps what the Pod runs with until the next rollout.
    assert requests(result.pod, "app") == {"cpu": "1", "memory": "512Mi"}
    assert result.pod["metadata"]["annotations"] == {}, "no record, raise or audit of ours is left"
    assert result.applied == {} and result.freed == {}


def test_an_unreadable_record_is_refused_as_a_value_error():
    """``reconcilers plan`` counts such records and plans their Pods at their running requests."""
    for bad in ('{"app": 3}', '["app"]', '{"app": {"cpu": "1"}, "(pod)": "2"}'):
        with pytest.raises(ValueError, match=r"^not a JSON object of each container's requests$"):
            recorded_pod_request(bad, "cpu")
    with pytest.raises(ValueError):
        recorded_pod_request("{not json", "cpu")


def test_a_running_pod_left_as_it_is_is_not_touched():
    bare = pod(container("app"), container("sidecar", "10m"))  # at the cpu floor
    before = copy.deepcopy(bare)
    result = compress_running_pod(bare, policy(cpu="4"), NO_BOUNDS, frozenset({"cpu"}))
    assert result.pod is bare and bare == before and result.skipped == "requests already at their floors"


def test_a_running_pod_records_a_raise_only_where_it_is_resized():
    p = pod(container("app", "1", "1Gi"))
    raised_memory_only = compress_running_pod(p, policy(cpu="2", memory="0.5"), NO_BOUNDS, frozenset({"cpu"}))
    assert requests(raised_memory_only.pod, "app") == {"cpu": "500m", "memory": "1Gi"}
    assert KEYS.written_requests not in raised_memory_only.pod["metadata"]["annotations"]
    # Both raised, memory not in place: the record holds what this service wrote, 1Gi as it was.
    raised_both = compress_running_pod(p, policy(cpu="0.5", memory="0.5"), NO_BOUNDS, frozenset({"cpu"}))
    assert json.loads(raised_both.pod["metadata"]["annotations"][KEYS.written_requests]) == {
        "app": {"cpu": "2", "memory": "1Gi"}}
    assert audit(raised_both.pod) == \
        "cpu ratio 0.5: 1 -> 2; memory ratio 0.5: 1Gi -> 1Gi in place (2Gi at the next rollout)"
    both = compress_running_pod(p, policy(cpu="2", memory="0.5"), NO_BOUNDS, frozenset({"cpu", "memory"}))
    assert json.loads(both.pod["metadata"]["annotations"][KEYS.written_requests]) == {
        "app": {"cpu": "500m", "memory": "2Gi"}}
    assert both.freed == {"cpu": 500, "memory": -2**30}


# ---- properties -------------------------------------------------------------------------------

cpu_amounts = st.integers(min_value=1, max_value=64_000)
memory_amounts = st.integers(min_value=1, max_value=2**37)
ratios = st.decimals(min_value=1, max_value=6, places=2, allow_nan=False, allow_infinity=False)


@st.composite
def containers(draw, name):
    resources: dict = {"requests": {}, "limits": {}}
    for resource, amounts, fmt in (("cpu", cpu_amounts, format_millicores), ("memory", memory_amounts, format_bytes)):
        if draw(st.booleans()):
            amount = draw(amounts)
            resources["requests"][resource] = fmt(amount)
            if draw(st.booleans()):
                resources["limits"][resource] = fmt(amount * draw(st.integers(1, 4)))
    extra = {"restartPolicy": "Always"} if name.startswith("init") and draw(st.booleans()) else {}
    return {"name": name, "image": "x", "resources": {k: v for k, v in resources.items() if v}, **extra}


@st.composite
def pods(draw):
    apps = [draw(containers(f"app{i}")) for i in range(draw(st.integers(1, 3)))]
    inits = [draw(containers(f"init{i}")) for i in range(draw(st.integers(0, 2)))]
    return pod(*apps, init=inits)


@st.composite
def limit_ranges(draw):
    items = []
    for kind in ("Container", "Pod"):
        item: dict = {"type": kind}
        if draw(st.booleans()):
            item["min"] = {"cpu": format_millicores(draw(st.integers(1, 2000))),
                           "memory": format_bytes(draw(st.integers(1, 2**30)))}
        if draw(st.booleans()):
            item["maxLimitRequestRatio"] = {r: str(draw(st.integers(1, 5))) for r in ("cpu", "memory")}
        items.append(item)
    return [{"spec": {"limits": items}}]


def _units(p):
    return [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), ratios, ratios, limit_ranges(), st.booleans())
def test_compression_properties(p, cpu_ratio, memory_ratio, limit_range, downgrade):
    config = CompressionConfig(allow_guaranteed_downgrade=downgrade)
    chosen = policy(cpu=str(cpu_ratio), memory=str(memory_ratio), config=config)
    bounds = bounds_from_limit_ranges(limit_range)
    result = compress_requests(p, chosen, bounds)
    out = result.pod

    # Idempotent: applying it again gives the same Pod.
    assert compress_requests(out, chosen, bounds).pod == out
    # QoS class kept unless the downgrade of Guaranteed Pods is allowed.
    if not (downgrade and qos_class(p) == "Guaranteed"):
        assert qos_class(out) == qos_class(p)

    for before, after in zip(_units(p), _units(out), strict=True):
        assert after["resources"].get("limits") == before["resources"].get("limits"), "limits untouched"
        original, new = requests_of(before), requests_of(after)
        for resource in original:
            ratio = Fraction(cpu_ratio if resource == "cpu" else memory_ratio)
            assert new[resource] <= original[resource], "never above the original"
            assert new[resource] >= min(original[resource], CONFIG.floor(resource)), "never below the floor"
            bound = bounds.for_container(resource)
            if original[resource] >= bound.min:
                assert new[resource] >= bound.min, "never below LimitRange min"
            limit = (before["resources"].get("limits") or {}).get(resource)
            cap = bound.max_limit_request_ratio
            if limit and cap and parse_amount(resource, limit) / original[resource] <= cap:
                assert parse_amount(resource, limit) / new[resource] <= cap, "limit/request ratio kept"
            applied = result.applied.get(resource, Fraction(1))
            assert applied <= ratio
            assert new[resource] >= min(original[resource], math.ceil(original[resource] / applied)), "rounds up"

    for resource in ("cpu", "memory"):
        pod_bound = bounds.for_pod(resource)
        if effective_request(p, resource) >= pod_bound.min:
            assert effective_request(out, resource) >= pod_bound.min, "never below Pod LimitRange min"


@pytest.mark.parametrize("ratio", ["1.5", "2", "3.7", "4"])
def test_exact_ceiling_without_guards(ratio):
    for millicores in (100, 333, 1000, 2500, 7777):
        result = compress_requests(pod(container("app", format_millicores(millicores))), policy(cpu=ratio))
        expected = max(10, math.ceil(Fraction(millicores) / Fraction(Decimal(ratio))))
        assert parse_amount("cpu", requests(result.pod, "app")["cpu"]) == expected


def test_patches_of_flat_maps_escape_keys_and_apply_like_jsonpatch():
    import jsonpatch

    from oversale.patch import make_patch

    before = {"a/b": "1", "c~d": "2", "gone": "3"}
    after = {"a/b": "1", "c~d": "20", "new/key~": "4"}
    operations = make_patch(before, after, "/metadata/annotations")
    assert {"op": "replace", "path": "/metadata/annotations/c~0d", "value": "20"} in operations
    assert {"op": "add", "path": "/metadata/annotations/new~1key~0", "value": "4"} in operations
    document = {"metadata": {"annotations": dict(before)}}
    assert jsonpatch.apply_patch(document, operations) == {"metadata": {"annotations": after}}


_KEYS = st.sampled_from(["cpu", "a/b", "c~d", "~1", "requests", "0", ""])
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab/~", max_size=3),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=300)
@given(st.dictionaries(_KEYS, _JSON, max_size=4), st.dictionaries(_KEYS, _JSON, max_size=4),
       st.sampled_from(["/spec", "/metadata/annotations", "/spec/containers/0/resources"]),
       st.sampled_from(["both", "added", "removed"]))
def test_the_one_patch_builder_turns_any_object_into_any_other_in_place(original, mutated, at, present):
    """make_patch's operations, applied to a Pod holding ``original`` at pointer ``at``, leave
    ``mutated`` there and the rest untouched: nested maps and lists, keys with "/" and "~", a map
    added where there was none, or removed whole."""
    import jsonpatch

    from oversale.patch import make_patch

    before = None if present == "added" else original
    after = None if present == "removed" else mutated
    document: dict[str, Any] = {"kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{"name": "app"}]}}
    parent, name = at.rsplit("/", 1)
    if before is not None:
        jsonpatch.JsonPointer(parent).resolve(document)[name] = copy.deepcopy(before)
    operations = make_patch(before, after, at)
    patched = jsonpatch.apply_patch(document, operations)
    held = jsonpatch.JsonPointer(parent).resolve(patched)
    assert held.get(name) == after and (name in held) == (after is not None)
    assert patched["kind"] == "Pod" and patched["metadata"]["name"] == "web"
    assert (operations == []) == (before == after)


# ---- raising (ratios below 1) --------------------------------------------------------------------

def test_a_ratio_below_one_raises_up_to_the_limit_and_says_why():
    result = compress_requests(pod(container("app", "500m", "1Gi", limits={"cpu": "800m"})), policy(cpu="0.5"))
    assert requests(result.pod, "app")["cpu"] == "800m"  # 1 core asked, the limit is 800m
    assert result.freed["cpu"] == -300
    assert "app/cpu limit" in audit(result.pod)


def test_an_unguarded_raise_says_the_ratio_asked_and_passes_over_containers_without_the_request():
    p = pod(container("sidecar", memory="64Mi"), container("app", "1"))
    result = compress_requests(p, policy(cpu="0.6"))
    assert requests(result.pod, "sidecar") == {"memory": "64Mi"}
    assert requests(result.pod, "app")["cpu"] == "1667m"  # ceil(1000m / 0.6)
    assert result.applied == {"cpu": Fraction(3, 5)}
    assert audit(result.pod) == "cpu ratio 0.6: 1 -> 1667m"


def _priority(operator: str, *values: str) -> dict:
    return {"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": operator,
                                                    "values": list(values)}]}}


def _cross_namespace(kind: str, term: dict) -> dict:
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                         if "topologyKey" in term else {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}


@pytest.mark.parametrize(("quota_spec", "pod_spec", "binds"), [
    ({}, {}, True),
    ({"scopes": ["Terminating"]}, {"activeDeadlineSeconds": 0}, True),
    ({"scopes": ["Terminating"]}, {}, False),
    ({"scopes": ["NotTerminating"]}, {"activeDeadlineSeconds": 600}, False),
    ({"scopes": ["NotTerminating"]}, {}, True),
    ({"scopes": ["BestEffort"]}, {}, False),
    ({"scopes": ["NotBestEffort"]}, {}, True),
    (_priority("In", "batch"), {"priorityClassName": "batch"}, True),
    (_priority("In", "batch"), {"priorityClassName": "web"}, False),
    (_priority("NotIn", "batch"), {}, True),
    (_priority("Exists"), {}, False),
    (_priority("Exists"), {"priorityClassName": "web"}, True),
    (_priority("DoesNotExist"), {}, False),
    ({"scopes": ["PriorityClass"]}, {"priorityClassName": "web"}, True),  # a Pod with any class
    ({"scopes": ["PriorityClass"]}, {}, False),
    ({"scopes": ["CrossNamespacePodAffinity"]},
     _cross_namespace("podAntiAffinity", {"weight": 1, "podAffinityTerm": {"topologyKey": "zone",
                                                                           "namespaceSelector": {}}}), True),
    ({"scopes": ["CrossNamespacePodAffinity"]},
     _cross_namespace("podAffinity", {"topologyKey": "zone", "namespaces": ["db"]}), True),
    ({"scopes": ["CrossNamespacePodAffinity"]}, _cross_namespace("podAffinity", {"topologyKey": "zone"}), False),
    ({"scopes": ["NotTerminating", "NotBestEffort"]}, {"activeDeadlineSeconds": 600}, False),
    ({"scopes": ["VolumeAttributesClass"]}, {}, False),
])
def test_a_full_quota_stops_a_raise_only_of_the_pods_its_scopes_bind(quota_spec, pod_spec, binds):
    """The ResourceQuota admission plugin counts a Pod against a quota only when every one of the
    quota's scopes matches it; a quota that does not bind the Pod must not hold its raise back."""
    full = cpu_quota("4", used="4", **quota_spec)
    bounds = bounds_from_limit_ranges([]).with_quotas([full])
    raised = compress_requests(pod(container("app", "1", limits={"cpu": "4"}), **pod_spec), policy(cpu="0.5"), bounds)
    assert requests(raised.pod, "app")["cpu"] == ("1" if binds else "2")


def test_a_raise_is_capped_by_the_tightest_quota_that_binds_the_pod_and_names_it():
    def quota(name: str, left: str, **spec) -> dict:
        return {"metadata": {"name": name}, **cpu_quota("10", used=f"{10 - float(left)}", **spec)}

    bounds = bounds_from_limit_ranges([]).with_quotas([
        quota("team", "1.8"), quota("batch", "0", **_priority("In", "batch")),
        quota("jobs", "1.5", scopes=["Terminating"])])
    job = pod(container("app", "1", limits={"cpu": "4"}), activeDeadlineSeconds=3600)
    raised = compress_requests(job, policy(cpu="0.5"), bounds).pod
    assert requests(raised, "app")["cpu"] == "1500m"
    assert audit(raised).endswith("guards: cpu ResourceQuota headroom (jobs)")
    service = compress_requests(pod(container("app", "1", limits={"cpu": "4"})), policy(cpu="0.5"), bounds).pod
    assert requests(service, "app")["cpu"] == "1800m"


def test_a_pod_that_grew_leaves_less_room_only_in_the_quotas_that_bind_it():
    """Pods resized in one pass share their namespace's quotas: each raise takes its share of the
    room of every quota that binds the Pod, down to none (never below), and no other."""
    team = {"spec": {"hard": {"requests.cpu": "4", "requests.memory": "8Gi"}},
            "status": {"hard": {"requests.cpu": "4", "requests.memory": "8Gi"},
                       "used": {"requests.cpu": "3", "requests.memory": "4Gi"}}}
    jobs = cpu_quota("4", used="2", scopes=["Terminating"])
    bounds = bounds_from_limit_ranges([]).with_quotas([team, jobs])
    grown = bounds.after_growth(pod(container("app", "1")), {"cpu": 1500})
    assert [q.headroom for q in grown.quotas] == [{"cpu": 0, "memory": 4 * 2**30}, {"cpu": 2000}]


def test_a_raise_near_the_quota_takes_the_room_left_though_rounding_overshoots_it_at_first():
    # Aimed at 1 core, 100m / 0.3 rounds up to 334m per container: 1002m, over the room; aimed
    # 2m lower, 333m each fits.
    one_core_left = cpu_quota("4", used="3")
    p = pod(container("a", "100m"), container("b", "100m"), container("c", "100m"))
    five_fold = policy(cpu="0.2", config=CompressionConfig(min_ratio=Decimal("0.1")))
    result = compress_requests(p, five_fold, bounds_from_limit_ranges([]).with_quotas([one_core_left]))
    assert [requests(result.pod, name)["cpu"] for name in "abc"] == ["333m", "333m", "333m"]
    assert result.applied == {"cpu": Fraction(300, 999)}



def test_a_quotas_room_reads_either_name_of_a_request_bound_and_the_tightest_counts():
    """A ResourceQuota bounds cpu requests as ``requests.cpu`` or by its short name ``cpu`` (the
    same bound); with both the tighter counts. A quota whose status the quota controller has not
    filled yet bounds by its spec, nothing used; one used past its hard (hard lowered since) has
    no room left, not a little."""
    room = quota_room({"status": {"hard": {"cpu": "3", "memory": "4Gi"}, "used": {"cpu": "2500m"}}})
    assert room is not None and room.headroom == {"cpu": 500, "memory": 4 * 2**30}
    both = quota_room({"status": {"hard": {"requests.cpu": "3", "cpu": "10"},
                                  "used": {"requests.cpu": "2", "cpu": "2"}}})
    assert both is not None and both.headroom == {"cpu": 1000}
    garbled = quota_room({"status": {"hard": {"requests.cpu": "x", "cpu": "3"}, "used": {"cpu": "2"}}})
    assert garbled is not None and garbled.headroom == {"cpu": 1000}
    new = quota_room({"metadata": {"name": "team"}, "spec": {"hard": {"requests.memory": "1Gi"}}})
    assert new is not None and new.headroom == {"memory": 2**30} and new.name == "team"
    over = quota_room({"status": {"hard": {"requests.cpu": "1"}, "used": {"requests.cpu": "1500m"}}})
    assert over is not None and over.headroom == {"cpu": 0}


def test_bounds_on_anything_but_cpu_and_memory_requests_hold_no_raise_back():
    """A namespace's LimitRange on PersistentVolumeClaims (storage) and its ResourceQuota on
    object counts (pods, count/deployments.apps) bound no cpu or memory request, even when full;
    nor does a value that is no quantity (the API server validates them, so only a hand-made
    object holds one): the raise goes through them whole."""
    bounds = bounds_from_limit_ranges([{"spec": {"limits": [
        {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}, "max": {"storage": "10Gi"}},
        {"type": "Container", "max": {"cpu": "lots"}}]}}]).with_quotas([
        {"spec": {"hard": {"pods": "10", "count/deployments.apps": "5"}},
         "status": {"hard": {"pods": "10", "count/deployments.apps": "5"}, "used": {"pods": "10"}}},
        {"spec": {"hard": {"requests.cpu": "x"}}, "status": {"hard": {"requests.cpu": "x"}, "used": {}}}])
    assert bounds.container == {} and bounds.pod == {} and bounds.quotas == ()
    raised = compress_requests(pod(container("app", "1", limits={"cpu": "4"})), policy(cpu="0.5"), bounds)
    assert requests(raised.pod, "app")["cpu"] == "2"

def test_a_best_effort_scope_binds_only_a_pod_without_requests_or_limits():
    best_effort, bounded = pod(container("app")), pod(container("app", limits={"memory": "1Gi"}))
    assert scope_holds({"scopeName": "BestEffort", "operator": "Exists"}, best_effort)
    assert not scope_holds({"scopeName": "NotBestEffort", "operator": "Exists"}, best_effort)
    assert not scope_holds({"scopeName": "BestEffort", "operator": "Exists"}, bounded)


def test_a_raise_capped_by_limits_and_the_pod_limitrange_max_names_each_guard_once():
    """Raised to their limits (2.7 cores), the containers exceed the Pod LimitRange max of 2.5:
    the raise is aimed lower and applied again, which meets b's limit again, told once."""
    bounds = bounds_from_limit_ranges([{"spec": {"limits": [{"type": "Pod", "max": {"cpu": "2500m"}}]}}])
    p = pod(container("a", "1", limits={"cpu": "1500m"}), container("b", "1", limits={"cpu": "1200m"}))
    result = compress_requests(p, policy(cpu="0.5"), bounds)
    assert [requests(result.pod, name) for name in ("a", "b")] == [{"cpu": "1250m"}, {"cpu": "1200m"}]
    assert audit(result.pod) == ("cpu ratio ~0.816 (asked 0.5, capped by a guard): 2 -> 2450m; "
                                 "guards: a/cpu limit, b/cpu limit, cpu Pod LimitRange max")


def test_a_raise_capped_by_the_container_limitrange_max_names_it():
    bounds = bounds_from_limit_ranges([{"spec": {"limits": [{"type": "Container", "max": {"cpu": "1500m"}}]}}])
    result = compress_requests(pod(container("app", "1")), policy(cpu="0.5"), bounds)
    assert audit(result.pod) == "cpu ratio ~0.667 (asked 0.5, capped by a guard): 1 -> 1500m; guards: app/cpu " \
                                "LimitRange max"


def test_a_raise_stops_at_the_limit_and_reaching_it_exactly_is_no_cap():
    exact = compress_requests(pod(container("app", "1", limits={"cpu": "2"})), policy(cpu="0.5"))
    assert audit(exact.pod) == "cpu ratio 0.5: 1 -> 2"
    capped = compress_requests(pod(container("app", "1", limits={"cpu": "1500m"})), policy(cpu="0.5"))
    assert audit(capped.pod) == \
        "cpu ratio ~0.667 (asked 0.5, capped by a guard): 1 -> 1500m; guards: app/cpu limit"


def test_a_raise_never_makes_a_burstable_pod_guaranteed():
    # cpu limit 1, memory request = limit: raising cpu to its limit would make the Pod Guaranteed.
    p = pod(container("app", "500m", "1Gi", limits={"cpu": "1", "memory": "1Gi"}))
    assert qos_class(p) == "Burstable"
    result = compress_requests(p, policy(cpu="0.5"))
    assert requests(result.pod, "app")["cpu"] == "999m"
    assert qos_class(result.pod) == "Burstable"
    assert audit(result.pod).endswith("guards: app/cpu limit, cpu kept Burstable")


def test_a_ratio_below_the_minimum_is_clamped_with_a_warning():
    result = compress_requests(pod(container("app", "1")), policy(cpu="0.1"))
    assert requests(result.pod, "app")["cpu"] == "2"
    assert any("below the minimum 0.5" in w for w in result.warnings)
    off = CompressionConfig(min_ratio=Decimal(1))  # OVERSALE_MIN_RATIO=1: raising switched off
    assert requests(compress_requests(pod(container("app", "1")), policy(cpu="0.5", config=off)).pod, "app") == \
        {"cpu": "1"}


def test_pod_level_requests_still_cover_the_containers_after_a_raise():
    p = pod(container("a", "300m"), container("b", "300m"),
            resources={"requests": {"cpu": "700m"}, "limits": {"cpu": "1"}})
    out = compress_requests(p, policy(cpu="0.5")).pod
    pod_level = parse_amount("cpu", out["spec"]["resources"]["requests"]["cpu"])
    assert pod_level == 1000  # 1.4 cores asked, the pod-level limit is 1
    assert sum(requests_of(c)["cpu"] for c in out["spec"]["containers"]) <= pod_level
    assert audit(out).endswith(
        "guards: cpu containers kept within pod-level requests")
    # Containers that sum to exactly the pod-level request fit: they are raised too.
    fitting = compress_requests(pod(container("a", "250m"), container("b", "250m"),
                                    resources={"requests": {"cpu": "700m"}, "limits": {"cpu": "1"}}), policy(cpu="0.5"))
    assert requests(fitting.pod, "a") == requests(fitting.pod, "b") == {"cpu": "500m"}
    assert "containers kept" not in audit(fitting.pod)
    # A container asking nothing counts as nothing in that sum, even where the raised app
    # container alone reaches the raised pod-level request.
    quiet = compress_requests(pod(container("app", "1"), container("logger"),
                                  resources={"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}), policy(cpu="0.5"))
    assert quiet.pod["spec"]["resources"]["requests"] == {"cpu": "2"} and requests(quiet.pod, "app") == {"cpu": "2"}
    assert "containers kept" not in audit(quiet.pod)
    # Pod-level limits alone: the containers are raised, and no pod-level request is made up.
    limits_only = compress_requests(pod(container("app", "1", limits={"cpu": "3"}), resources={"limits": {"cpu": "4"}}),
                                    policy(cpu="0.5"))
    assert limits_only.pod["spec"]["resources"] == {"limits": {"cpu": "4"}}
    assert audit(limits_only.pod) == "cpu ratio 0.5: 1 -> 2"


def test_pod_level_requests_stop_one_unit_below_their_limit_rather_than_turn_guaranteed():
    p = pod(container("app", "500m"),
            resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}})
    out = compress_requests(p, policy(cpu="0.5")).pod
    assert out["spec"]["resources"]["requests"] == {"cpu": "1999m", "memory": "1Gi"}
    assert qos_class(p) == qos_class(out) == "Burstable"
    assert requests(out, "app")["cpu"] == "1"


def test_pod_level_limits_alone_add_no_pod_level_request():
    p = pod(container("app", "1"), resources={"limits": {"cpu": "2"}})
    out = compress_requests(p, policy(cpu="2")).pod
    assert out["spec"]["resources"] == {"limits": {"cpu": "2"}}
    assert requests(out, "app")["cpu"] == "500m"


def test_pod_level_requests_no_quota_room_lets_grow_are_left_as_they_came():
    one_core_left = cpu_quota("4", used="3")
    p = pod(container("app", "500m"), resources={"requests": {"cpu": "1"}})
    result = compress_requests(p, policy(cpu="0.5"), bounds_from_limit_ranges([]).with_quotas([one_core_left]))
    assert result.pod == p
    assert result.reasons == ["guards: cpu ResourceQuota headroom, cpu not raised"]


def test_our_own_raise_is_undone_on_reinvocation_but_another_webhooks_is_kept():
    first = compress_requests(pod(container("app", "1")), policy(cpu="0.5")).pod
    assert requests(first, "app")["cpu"] == "2"
    assert compress_requests(first, policy(cpu="0.5")).pod == first
    lowered = compress_requests(first, policy(cpu="2")).pod
    assert requests(lowered, "app")["cpu"] == "500m"
    # Nothing raised now: the record of our raise goes, the originals stay.
    assert lowered["metadata"]["annotations"] == {KEYS.original_requests: '{"app":{"cpu":"1"}}',
                                                  KEYS.compression: "cpu ratio 2: 1 -> 500m"}
    other = copy.deepcopy(first)
    other["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    assert requests(compress_requests(other, policy(cpu="0.5")).pod, "app")["cpu"] == "6"


@pytest.mark.parametrize(("record", "why"), [
    ("{broken", "unexpected character, expected a string key: line 1 column 2 (char 1)"),
    ("[1, 2]", "not a JSON object"),
])
def test_a_broken_record_of_our_raises_is_said_and_the_raise_kept_as_anothers(record, why):
    first = compress_requests(pod(container("app", "1")), policy(cpu="0.5")).pod
    broken = copy.deepcopy(first)
    broken["metadata"]["annotations"][KEYS.written_requests] = record
    result = compress_requests(broken, policy(cpu="0.5"))
    assert requests(result.pod, "app")["cpu"] == "4", "2 is no longer known as ours: a new original"
    assert result.warnings == [f"annotation {KEYS.written_requests} ignored ({why}); a request above its "
                               "recorded original is taken as another webhook's raise"]


def test_requests_a_vpa_set_are_kept_as_it_set_them_and_our_record_goes():
    """The API server calls the mutating webhooks in the order of their configurations' names,
    so ours ("oversale") runs before VPA's ("vpa-webhook-config"), and again after it
    (reinvocationPolicy IfNeeded). On that second call the requests are VPA's recommendation:
    dividing them by the ratio again would leave the Pod far below its usage."""
    ours = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="4")).pod
    assert requests(ours, "app")["cpu"] == "250m"
    by_vpa = copy.deepcopy(ours)
    by_vpa["metadata"]["annotations"]["vpaUpdates"] = "Pod resources updated by web: container 0: cpu request"
    by_vpa["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "240m"  # its recommendation
    result = compress_requests(by_vpa, policy(cpu="4"))
    assert requests(result.pod, "app") == {"cpu": "240m", "memory": "1Gi"}, "neither divided nor restored to 1"
    assert not any(key in result.pod["metadata"]["annotations"]
                   for key in (KEYS.original_requests, KEYS.compression)), "the record no longer holds"
    assert result.pod["metadata"]["annotations"]["vpaUpdates"]
    assert result.skipped == "requests set by a VerticalPodAutoscaler"
    assert any("VerticalPodAutoscaler" in warning for warning in result.warnings)
    assert "vpaUpdates" not in ours["metadata"]["annotations"] and by_vpa["metadata"]["annotations"][
        KEYS.original_requests], "the Pod passed in is not modified"
    # VPA first (or alone): nothing to undo, nothing changes.
    fresh = pod(container("app", "300m"), annotations={"vpaUpdates": "Pod resources updated by web"})
    assert compress_requests(fresh, policy(cpu="2")).pod == fresh


def test_a_vpa_that_sets_memory_only_leaves_cpu_to_the_ratio():
    """VPA for memory (controlledResources: [memory]) and oversale for cpu: each keeps its own."""
    ours = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="4", memory="2")).pod
    assert requests(ours, "app") == {"cpu": "250m", "memory": "512Mi"}
    by_vpa = copy.deepcopy(ours)
    by_vpa["metadata"]["annotations"]["vpaUpdates"] = "Pod resources updated by web: container 0: memory request"
    by_vpa["spec"]["containers"][0]["resources"]["requests"]["memory"] = "300Mi"  # its recommendation
    result = compress_requests(by_vpa, policy(cpu="4", memory="2"))
    assert requests(result.pod, "app") == {"cpu": "250m", "memory": "300Mi"}, "cpu ours, memory VPA's"
    assert result.warnings == ["memory requests set by a VerticalPodAutoscaler not compressed: two "
                               "controllers would set them; remove the ratio or the VPA"]
    assert compress_requests(by_vpa, policy(cpu="4")).pod["spec"]["containers"][0]["resources"]["requests"] == \
        {"cpu": "250m", "memory": "300Mi"}, "no memory ratio: no warning needed, VPA's memory still stays"


def test_a_vpa_that_sets_cpu_only_leaves_memory_to_start_again_from_its_record():
    ours = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="4", memory="2")).pod
    by_vpa = copy.deepcopy(ours)
    by_vpa["metadata"]["annotations"]["vpaUpdates"] = "Pod resources updated by web: container 0: cpu request"
    by_vpa["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "240m"
    result = compress_requests(by_vpa, policy(cpu="4", memory="2"))
    assert requests(result.pod, "app") == {"cpu": "240m", "memory": "512Mi"}, "1Gi / 2, not 512Mi / 2"


def test_a_pod_we_raised_that_a_vpa_then_takes_over_loses_every_annotation_of_ours():
    ours = compress_requests(pod(container("app", "1", "1Gi")), policy(cpu="0.5", memory="0.5")).pod
    assert {KEYS.original_requests, KEYS.written_requests, KEYS.compression} <= set(ours["metadata"]["annotations"])
    by_vpa = copy.deepcopy(ours)
    by_vpa["metadata"]["annotations"]["vpaUpdates"] = ("Pod resources updated by web: container 0: cpu request, "
                                                       "memory request")
    result = compress_requests(by_vpa, policy(cpu="0.5", memory="0.5"))
    assert set(result.pod["metadata"]["annotations"]) == {"vpaUpdates"}


def test_resources_a_vpa_will_set_are_left_for_it_before_its_admission_runs():
    """Known from the workload's VerticalPodAutoscaler before VPA's own admission runs (this
    webhook's configuration sorts first): VPA scales each limit by recommendation / request, so a
    request lowered here first would have its limit raised by the ratio. It stays as it came."""
    original = pod(container("app", "1", "1Gi", limits={"cpu": "2", "memory": "2Gi"}))
    result = compress_requests(original, policy(cpu="2", memory="2"), vpa_resources=frozenset({"cpu"}))
    assert requests(result.pod, "app") == {"cpu": "1", "memory": "512Mi"}, "cpu VPA's, memory ours"
    assert result.warnings == ["cpu requests set by a VerticalPodAutoscaler not compressed: two controllers "
                               "would set them; remove the ratio or the VPA"]
    assert result.pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}
    both = compress_requests(original, policy(cpu="2", memory="2"), vpa_resources=frozenset({"cpu", "memory"}))
    assert both.pod == original and both.skipped == "requests set by a VerticalPodAutoscaler"
    assert both.warnings == ["cpu and memory requests set by a VerticalPodAutoscaler not compressed: two "
                             "controllers would set them; remove the ratio or the VPA"]
    # Compression switched off for the workload: no ratio competes with the VPA, nothing to say.
    off = compress_requests(original, policy(cpu="2", **{KEYS.enable_resource_compress: "false"}),
                            vpa_resources=frozenset({"cpu"}))
    assert off.pod == original and off.warnings == []


raise_ratios = st.decimals(min_value=Decimal("0.2"), max_value=Decimal("0.99"), places=2)
any_ratios = st.one_of(raise_ratios, st.decimals(min_value=1, max_value=8, places=2))


@st.composite
def bounds_for_raises(draw):
    items = []
    for kind in ("Container", "Pod"):
        item: dict = {"type": kind}
        if draw(st.booleans()):
            item["max"] = {"cpu": format_millicores(draw(st.integers(1, 200_000))),
                           "memory": format_bytes(draw(st.integers(1, 2**38)))}
        items.append(item)
    quotas = []
    if draw(st.booleans()):
        hard = draw(st.integers(1, 400_000))
        used = draw(st.integers(0, hard))
        quotas.append({"spec": {"hard": {"requests.cpu": format_millicores(hard)}},
                       "status": {"hard": {"requests.cpu": format_millicores(hard)},
                                  "used": {"requests.cpu": format_millicores(used)}}})
    return bounds_from_limit_ranges([{"spec": {"limits": items}}]).with_quotas(quotas)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), raise_ratios, raise_ratios, bounds_for_raises())
def test_raise_properties(p, cpu_ratio, memory_ratio, bounds):
    chosen = policy(cpu=str(cpu_ratio), memory=str(memory_ratio))
    result = compress_requests(p, chosen, bounds)
    out = result.pod

    assert compress_requests(out, chosen, bounds).pod == out, "idempotent on reinvocation"
    assert qos_class(out) == qos_class(p), "QoS class unchanged"
    for before, after in zip(_units(p), _units(out), strict=True):
        assert after["resources"].get("limits") == before["resources"].get("limits"), "limits untouched"
        original, new = requests_of(before), requests_of(after)
        for resource in original:
            ratio = max(Fraction(cpu_ratio if resource == "cpu" else memory_ratio), Fraction(1, 2))
            assert original[resource] <= new[resource] <= math.ceil(original[resource] / ratio)
            limit = (before["resources"].get("limits") or {}).get(resource)
            if limit and new[resource] > original[resource]:
                assert new[resource] <= parse_amount(resource, limit), "never above the limit"
            maximum = bounds.for_container(resource).max
            if maximum is not None and new[resource] > original[resource]:
                assert new[resource] <= maximum, "never above the LimitRange max"
    for resource in ("cpu", "memory"):
        raised = effective_request(out, resource) > effective_request(p, resource)
        headroom = bounds.bound_to(p).quota_headroom
        if raised and resource in headroom:
            assert effective_request(out, resource) <= headroom[resource], "within quota headroom"
        if raised and bounds.for_pod(resource).max is not None:
            assert effective_request(out, resource) <= bounds.for_pod(resource).max, "within Pod LimitRange max"


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), any_ratios, any_ratios)
def test_a_changed_ratio_is_computed_from_the_originals(p, first, second):
    """0.5 -> 2 -> 0.5 (and any other pair): the Pod always ends as if the last ratio were the first."""
    once = compress_requests(p, policy(cpu=str(first), memory=str(first))).pod
    again = compress_requests(once, policy(cpu=str(second), memory=str(second))).pod
    direct = compress_requests(p, policy(cpu=str(second), memory=str(second))).pod
    for a, b in zip(_units(again), _units(direct), strict=True):
        assert requests_of(a) == requests_of(b)
    back = compress_requests(again, policy(cpu=str(first), memory=str(first))).pod
    for a, b in zip(_units(back), _units(once), strict=True):
        assert requests_of(a) == requests_of(b)


@settings(max_examples=300)
@given(pods())
def test_the_guaranteed_shortcut_agrees_with_the_qos_class(p):
    from oversale.pods import is_guaranteed, qos_class

    assert is_guaranteed(p) == (qos_class(p) == "Guaranteed")
    for unit in _units(p):  # limits equal to requests everywhere: the slow path decides
        resources = unit.setdefault("resources", {})
        resources["limits"] = dict(resources.get("requests") or {"cpu": "1", "memory": "1Gi"})
        resources["requests"] = dict(resources["limits"])
    assert is_guaranteed(p) == (qos_class(p) == "Guaranteed")


def test_a_raise_that_would_reach_every_limit_stops_short_and_keeps_burstable():
    """Found by the property test above: cpu already at its limit, memory one unit below its. The
    first try raised memory to its limit (Guaranteed); the second, one unit short, computed the
    original amount and kept the first try's value."""
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-", "namespace": "default"},
         "spec": {"containers": [{"name": "app0", "image": "x", "resources": {
             "requests": {"cpu": "1m", "memory": "1"}, "limits": {"cpu": "1m", "memory": "2"}}}]}}
    out = compress_requests(p, policy(cpu="0.2", memory="0.2")).pod
    assert qos_class(out) == "Burstable"
    assert requests(out, "app0") == {"cpu": "1m", "memory": "1"}
