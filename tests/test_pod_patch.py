"""The JSON patch the Pod webhook answers with (webhook.pod_admission.pod_patch): applied to the
Pod as admitted, it gives the compressed Pod, and it names only the values that changed, so the
limits and everything else the user wrote are never rewritten."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from webhook.pod_admission import pod_patch


def pod(containers: list[dict[str, Any]], pod_resources: dict[str, Any] | None = None,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    if pod_resources is not None:
        spec["resources"] = pod_resources
    return {"metadata": {"name": "p", "annotations": {"team": "a"}}, "spec": spec}


def container(resources: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": "c", "image": "x"} if resources is None else {"name": "c", "image": "x", "resources": resources}


LIMITS = {"cpu": "2", "memory": "1Gi"}
CASES = {
    "a request lowered, the limits as they were": (
        pod([container({"requests": {"cpu": "1", "memory": "512Mi"}, "limits": LIMITS})]),
        pod([container({"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": LIMITS})]),
        [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "250m"}]),
    "a requests map given to a container with limits only": (
        pod([container({"limits": LIMITS})]),
        pod([container({"limits": LIMITS, "requests": {"cpu": "1"}})]),
        [{"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"cpu": "1"}}]),
    "resources given to a container without any": (
        pod([container(None)]),
        pod([container({"requests": {"cpu": "100m"}})]),
        [{"op": "add", "path": "/spec/containers/0/resources", "value": {"requests": {"cpu": "100m"}}}]),
    "pod-level requests lowered": (
        pod([container(None)], {"requests": {"cpu": "4"}, "limits": {"cpu": "8"}}),
        pod([container(None)], {"requests": {"cpu": "1"}, "limits": {"cpu": "8"}}),
        [{"op": "replace", "path": "/spec/resources/requests/cpu", "value": "1"}]),
    "an init container's request removed, and an annotation added": (
        pod([container(None)], init=[container({"requests": {"cpu": "1", "memory": "1Gi"}})]),
        {**pod([container(None)], init=[container({"requests": {"memory": "1Gi"}})]),
         "metadata": {"name": "p", "annotations": {"team": "a", "oversale/compression": "cpu x2"}}},
        [{"op": "add", "path": "/metadata/annotations/oversale~1compression", "value": "cpu x2"},
         {"op": "remove", "path": "/spec/initContainers/0/resources/requests/cpu"}]),
}


@pytest.mark.parametrize("admitted, compressed, expected", CASES.values(), ids=CASES.keys())
def test_the_patch_turns_the_admitted_pod_into_the_compressed_one_and_names_only_what_changed(
        admitted, compressed, expected):
    patch = pod_patch(admitted, compressed)
    assert sorted(patch, key=lambda op: op["path"]) == sorted(expected, key=lambda op: op["path"])
    assert jsonpatch.apply_patch(copy.deepcopy(admitted), patch) == compressed


def test_a_pod_compression_left_as_it_came_gets_an_empty_patch():
    admitted = CASES["a request lowered, the limits as they were"][0]
    assert pod_patch(admitted, admitted) == []
    assert pod_patch(admitted, copy.deepcopy(admitted)) == []
