"""Which workload a Pod belongs to, by its name alone (``oversale.workloads.PodIndex``): usage
history keeps the names of Pods long gone. Names are made here as Kubernetes makes them."""

from __future__ import annotations

import random

import pytest

from oversale.workloads import PodIndex

NS = "shop"
# k8s.io/apimachinery's utilrand.String: no vowels, so that no word is spelled by chance.
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
WORDS = "payments-reconciliation-worker-europe-west1-canary-blue-green-rollout-tier2-batch-export-v3"


def generated(prefix: str, rng: random.Random) -> str:
    """The API server's generateName: the prefix cut to 58 characters, then 5 random ones."""
    return prefix[:58] + "".join(rng.choice(ALPHABET) for _ in range(5))


def name_of(stem: str, length: int) -> str:
    """A workload name of ``length`` characters (a name may not end in a dash)."""
    name = (stem + "-" + WORDS)[:length]
    return name[:-1] + "x" if name.endswith("-") else name


def indexed(job: str, index: int) -> str:
    """The Job controller's prefix for an Indexed Job's Pod: the Job's name is cut, the index kept."""
    tail = f"-{index}-"
    return job[:58 - len(tail)] + tail if len(job + tail) > 58 else job + tail


def pods_of(kind: str, name: str, rng: random.Random) -> list[str]:
    """Pod names as each controller asks for them: the ReplicaSet controller asks ``<rs>-``,
    where the Deployment controller named the ReplicaSet ``<name>-<template hash>``; the Job
    controller ``<job>-`` (``<job>-<index>-`` for an Indexed Job), where the CronJob controller
    named the Job ``<name>-<scheduled minute>``."""
    if kind == "Deployment":
        return [generated(f"{name}-{template_hash}-", rng) for template_hash in ("5d8f9c7b6", "7c4b2", "b")]
    if kind == "DaemonSet":
        return [generated(f"{name}-", rng)]
    if kind == "CronJob":
        job = f"{name}-29420160"
        return [generated(f"{job}-", rng), *(generated(indexed(job, index), rng) for index in (0, 12, 345))]
    return [f"{name}-0", f"{name}-11"]  # a StatefulSet names its Pods itself


# Longest names each kind may have in practice: a StatefulSet's and a CronJob's are held to 52
# (their controllers add labels and suffixes of their own); a Deployment's and a DaemonSet's are
# bounded only by the 253 of an object name.
LONGEST = {"Deployment": 90, "DaemonSet": 90, "CronJob": 52, "StatefulSet": 52}


@pytest.mark.parametrize("kind", sorted(LONGEST))
def test_every_pod_is_found_whatever_the_length_of_its_workloads_name(kind):
    # Before, a name long enough that the API server cut the Pod names' prefix (a Deployment's from
    # 47 characters, a CronJob's from 49) had no Pod found: its usage was never read.
    rng = random.Random(kind)
    stems = {"Deployment": "deploy", "DaemonSet": "ds", "CronJob": "cron", "StatefulSet": "sts"}
    # Each name starts with its own length: two names whose Pods' cut prefixes are the same (``x``,
    # 57 characters, and ``x-blue-...``) give Pods no one can tell apart, whatever reads them.
    workloads = {(kind, NS, name_of(f"{stems[kind]}{length}", length))
                 for length in range(len(stems[kind]) + 2, LONGEST[kind] + 1)}
    index = PodIndex(dict.fromkeys(workloads))
    for key in sorted(workloads):
        for pod in pods_of(kind, key[2], rng):
            assert index.owner(NS, pod) == key, (pod, key)


def test_pods_of_other_workloads_are_not_claimed():
    rng = random.Random(7)
    long_name = name_of("deploy", 60)
    index = PodIndex(dict.fromkeys([("Deployment", NS, long_name), ("DaemonSet", NS, name_of("ds", 55)),
                                    ("CronJob", NS, name_of("cron", 50))]))
    others = [*pods_of("Deployment", name_of("other", 60), rng), *pods_of("DaemonSet", name_of("other", 55), rng),
              *pods_of("Deployment", long_name, rng)]
    assert [index.owner("elsewhere", pod) for pod in others[-3:]] == [None] * 3, "another namespace"
    assert [index.owner(NS, pod) for pod in others[:-3]] == [None] * (len(others) - 3)
    # A cut Deployment prefix is followed by the start of its template hash: anything else is not its Pod.
    assert index.owner(NS, generated(f"{name_of('cron', 50)}-web-", rng)) is None
    # A cut DaemonSet prefix ends at the dash after its name: a Pod named on from there is another's.
    assert index.owner(NS, generated(f"{name_of('ds', 55)}-web-", rng)) is None


def test_a_daemonsets_pods_are_not_a_deployments_whose_name_starts_theirs():
    # Before, `exporter` passed for a template hash: node-exporter's usage counted as the
    # Deployment `node`'s, and lowered its ratio.
    rng = random.Random(11)
    index = PodIndex(dict.fromkeys([("Deployment", NS, "node"), ("Deployment", NS, "web")]))
    assert index.owner(NS, generated("node-exporter-", rng)) is None
    assert index.owner(NS, generated("web-agent-", rng)) is None
    assert index.owner(NS, generated("web-5d8f9c7b6-", rng)) == ("Deployment", NS, "web")
    assert index.owner(NS, generated("node-1234567890-", rng)) == ("Deployment", NS, "node"), "a pre-1.11 hash"


def test_workloads_of_different_kinds_may_share_a_name():
    # Before, the index kept one kind per name: the other workload's Pods were never found.
    rng = random.Random(13)
    index = PodIndex(dict.fromkeys([("Deployment", NS, "redis"), ("StatefulSet", NS, "redis"),
                                    ("DaemonSet", NS, "backup"), ("CronJob", NS, "backup")]))
    for kind, name in (("Deployment", "redis"), ("StatefulSet", "redis"), ("DaemonSet", "backup"),
                       ("CronJob", "backup")):
        for pod in pods_of(kind, name, rng):
            assert index.owner(NS, pod) == (kind, NS, name), pod
