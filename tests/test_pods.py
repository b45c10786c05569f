"""The Pod facts in ``oversale.pods`` that are not policies: the shape check every adapter may use."""

from __future__ import annotations

import json

import pytest

from oversale.pods import shape_problem
from tests.conftest import POD_FIXTURES


@pytest.mark.shared
def test_every_real_pod_has_the_shape_the_policies_read():
    for path in POD_FIXTURES:
        assert shape_problem(json.loads(path.read_text())) is None, path.name


@pytest.mark.parametrize(("pod", "problem"), [
    ([], "the Pod is not an object"),
    ({"metadata": "p"}, "metadata is not an object"),
    ({"metadata": {"annotations": ["a"]}}, "metadata.annotations is not an object"),
    ({"metadata": {"ownerReferences": {"kind": "ReplicaSet"}}}, "metadata.ownerReferences is not a list of objects"),
    ({"spec": {"containers": {"name": "app"}}}, "spec.containers is not a list"),
    ({"spec": {"containers": [{"name": "app"}, "sidecar"]}}, "spec.containers[1] is not an object"),
    ({"spec": {"containers": [{"resources": {"limits": ["cpu"]}}]}},
     "spec.containers[0].resources.limits is not an object"),
    ({"spec": {"resources": "1"}}, "spec.resources is not an object"),
    ({"status": 3}, "status is not an object"),
])
def test_the_first_misshapen_field_is_named(pod, problem):
    assert shape_problem(pod) == problem


def test_missing_and_null_fields_are_fine():
    assert shape_problem({}) is None
    assert shape_problem({"metadata": None, "spec": {"containers": None, "initContainers": []},
                          "status": {}}) is None
    assert shape_problem({"spec": {"containers": [{"resources": None}, {"resources": {"requests": None}}]}}) is None
