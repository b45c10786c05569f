"""The exclusive CPU allocator as pure functions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversale.cpus import (
    FULL_PCPUS,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    SPREAD_BY_PCPUS,
    FreeSummary,
    NoFit,
    Topology,
    format_cpuset,
    parse_cpuset,
    place,
    topology_from_node,
    whole_free_cores,
)


def koordinator(sockets: int = 2, cores_per_socket: int = 4, threads: int = 2) -> Topology:
    """Linux numbering: CPU ids run over cores first, then the hyperthread siblings."""
    detail = []
    total_cores = sockets * cores_per_socket
    for thread in range(threads):
        for socket_id in range(sockets):
            for core in range(cores_per_socket):
                cpu_id = thread * total_cores + socket_id * cores_per_socket + core
                detail.append({"id": cpu_id, "core": core, "socket": socket_id, "node": socket_id})
    return Topology.from_koordinator(json.dumps({"detail": detail}))


def test_cpuset_text_round_trip():
    assert format_cpuset([4, 5, 6, 7]) == "4-7"
    assert format_cpuset([0, 1, 2, 8, 10, 11]) == "0-2,8,10-11"
    assert parse_cpuset("0-2,8,10-11") == [0, 1, 2, 8, 10, 11]
    assert parse_cpuset("5-5") == [5], "a range of one CPU"


@pytest.mark.parametrize("text", ["0-", "1-0", "-1", "x", "0-3x", "0--3", "1.5"])
def test_a_cpuset_the_kernel_would_refuse_is_refused_not_read_as_some_cpus(text):
    """The kernel refuses these; an open range was read as its first CPU and a reversed one as
    none, so a cpuset annotation edited by hand into either counted CPUs the kernel would not give."""
    with pytest.raises(ValueError, match="not a cpuset"):
        parse_cpuset(text)


def test_full_pcpus_takes_whole_cores_in_one_numa_node():
    topology = koordinator()
    placement = place(topology, [], 4, FULL_PCPUS, single_numa=True)
    assert len(placement.numa_nodes) == 1
    cores = {c.core for c in topology.cpus if c.id in placement.cpus}
    assert len(cores) == 2
    assert all(sum(1 for c in topology.cpus if c.core == core and c.id in placement.cpus) == 2 for core in cores)


def test_spread_takes_one_thread_per_core_first():
    topology = koordinator()
    placement = place(topology, [], 4, SPREAD_BY_PCPUS, single_numa=True)
    assert len({c.core for c in topology.cpus if c.id in placement.cpus}) == 4


def test_spread_takes_threads_of_idle_cores_before_the_sibling_of_a_busy_one():
    """A thread beside another Pod's exclusive thread shares that core's throughput: while idle
    cores are left, a SpreadByPCPUs Pod gets its threads from them."""
    topology = koordinator()  # CPU id = thread x 8 + NUMA node x 4 + core
    busy_sibling = [8]  # another Pod holds the second thread of core 0 of NUMA node 0
    assert place(topology, busy_sibling, 1, SPREAD_BY_PCPUS, True).cpus == (1,)
    assert place(topology, busy_sibling, 3, SPREAD_BY_PCPUS, True).cpus == (1, 2, 3)
    # Every idle core gives one, then the busy core's free thread, then the idle cores' siblings.
    assert place(topology, busy_sibling, 4, SPREAD_BY_PCPUS, True).cpus == (0, 1, 2, 3)
    assert place(topology, busy_sibling, 6, SPREAD_BY_PCPUS, True).cpus == (0, 1, 2, 3, 9, 10)


def test_whole_cores_are_taken_lowest_first_on_every_socket():
    """Linux numbers cores per socket, so socket 1 has a core 0 too; its cores are still taken in
    order, as on socket 0."""
    topology = koordinator()  # NUMA node = socket; CPU id = thread x 8 + socket x 4 + core
    socket_1_core_0 = [4, 12]
    assert place(topology, socket_1_core_0, 2, FULL_PCPUS, True).cpus == (5, 13)
    assert place(topology, [0, 8], 2, FULL_PCPUS, True).cpus == (1, 9)


def test_spanning_numa_nodes_fills_the_fullest_first_or_the_emptiest_by_strategy():
    topology = koordinator()
    taken = [0]  # NUMA node 0: 7 free, NUMA node 1: 8
    packed = place(topology, taken, 10, SPREAD_BY_PCPUS, False, MOST_ALLOCATED)
    assert packed.cpus == (1, 2, 3, 4, 5, 6, 8, 9, 10, 11), "all of node 0, then 3 of node 1"
    spread = place(topology, taken, 10, SPREAD_BY_PCPUS, False, LEAST_ALLOCATED)
    assert spread.cpus == (1, 2, 4, 5, 6, 7, 12, 13, 14, 15), "all of node 1, then 2 of node 0"
    assert packed.numa_nodes == spread.numa_nodes == (0, 1)


def test_full_pcpus_refuses_half_cores_and_explains_shortage():
    topology = koordinator()
    with pytest.raises(NoFit, match="multiple of 2"):
        place(topology, [], 3, FULL_PCPUS, single_numa=True)
    with pytest.raises(NoFit, match="no CPUs asked for"):
        place(topology, [], 0, SPREAD_BY_PCPUS, single_numa=False)
    # Take 3 whole cores in node 0 and 2 in node 1: 1 and 2 whole cores left.
    node0 = [c.id for core in whole_free_cores(topology, [], 0)[:3] for c in core]
    node1 = [c.id for core in whole_free_cores(topology, [], 1)[:2] for c in core]
    with pytest.raises(NoFit) as failure:
        place(topology, node0 + node1, 6, FULL_PCPUS, single_numa=True)
    assert str(failure.value) == "needs 3 full cores in one NUMA node; NUMA node 0 has 1 free, NUMA node 1 has 2 free"


def test_most_allocated_packs_and_least_allocated_spreads():
    topology = koordinator()
    taken = [c.id for core in whole_free_cores(topology, [], 1)[:1] for c in core]  # node 1 slightly used
    assert place(topology, taken, 2, FULL_PCPUS, True, MOST_ALLOCATED).numa_nodes == (1,)
    assert place(topology, taken, 2, FULL_PCPUS, True, LEAST_ALLOCATED).numa_nodes == (0,)
    assert FreeSummary.of(topology, taken).score(2, FULL_PCPUS, True, MOST_ALLOCATED) > \
        FreeSummary.of(topology, []).score(2, FULL_PCPUS, True, MOST_ALLOCATED)
    # Across nodes too: packing prefers the used node, spreading the empty one.
    assert FreeSummary.of(topology, []).score(2, FULL_PCPUS, True, LEAST_ALLOCATED) > \
        FreeSummary.of(topology, taken).score(2, FULL_PCPUS, True, LEAST_ALLOCATED)


def test_full_pcpus_asked_for_part_of_a_core_is_refused_with_the_reason():
    """The kubelet's static CPU manager gives FullPCPUs Pods whole cores only (it refuses the Pod
    with SMTAlignmentError otherwise): 3 CPUs on a node of 2 threads per core fit nowhere."""
    with pytest.raises(NoFit) as failure:
        place(koordinator(), [], 3, FULL_PCPUS, single_numa=False)
    assert str(failure.value) == "FullPCPUs needs a multiple of 2 CPUs (threads per core); 3 asked"


def test_of_two_numa_nodes_as_free_the_one_already_used_is_taken_and_the_empty_one_kept():
    """Zone 0 has 8 CPUs, all free; zone 1 has 12, 4 of them taken: 8 free each. The Pod goes
    where it leaves a whole NUMA node empty for a later Pod that asks one."""
    topology = Topology.from_zones({0: 8, 1: 12})
    for strategy in (MOST_ALLOCATED, LEAST_ALLOCATED):
        assert place(topology, range(8, 12), 2, SPREAD_BY_PCPUS, True, strategy).numa_nodes == (1,)


def test_of_two_numa_nodes_as_full_the_one_left_with_more_whole_cores_is_taken():
    """Both NUMA nodes have 5 free CPUs. A 2-CPU spread Pod breaks the only whole core of node 0,
    or 2 of node 1's: it goes to node 0, and 2 whole cores are left for a FullPCPUs Pod, not 1."""
    topology = koordinator()  # CPU id = thread x 8 + NUMA node x 4 + core
    taken = [0, 1, 2, 4, 12, 5]  # node 0: only core 3 whole; node 1: cores 2 and 3 whole
    assert place(topology, taken, 2, SPREAD_BY_PCPUS, True).cpus == (3, 8)


def test_a_spread_pod_scores_higher_where_it_takes_the_free_threads_of_broken_cores():
    """SpreadByPCPUs packing (MostAllocated) fills the fullest NUMA node first. Where that node's
    free CPUs are the spare threads of cores already in use, the Pod leaves every whole core for
    a FullPCPUs Pod; where they are whole cores, it breaks them. Equally full, the first node
    scores higher, and the Pod lands on those spare threads."""
    topology = koordinator()  # CPU id = thread x 8 + NUMA node x 4 + core
    spare_threads, whole_cores = [4, 5, 6, 7], [0, 1, 4, 5]  # 4 CPUs taken on each
    takes_spares, breaks_cores = (FreeSummary.of(topology, taken).score(4, SPREAD_BY_PCPUS, False, MOST_ALLOCATED)
                                  for taken in (spare_threads, whole_cores))
    assert takes_spares > breaks_cores
    assert place(topology, spare_threads, 4, SPREAD_BY_PCPUS, False).cpus == (12, 13, 14, 15)
    assert place(topology, [], 12, SPREAD_BY_PCPUS, False).numa_nodes == (0, 1), "more than one NUMA node holds"


def test_a_shortage_is_counted_in_full_cores_only_where_cores_are_known():
    spread_over_threads = koordinator()  # 2 NUMA nodes of 4 cores x 2 threads
    with pytest.raises(NoFit) as failure:
        place(spread_over_threads, [], 10, SPREAD_BY_PCPUS, single_numa=True)
    assert str(failure.value) == "needs 10 CPUs in one NUMA node; NUMA node 0 has 8 free, NUMA node 1 has 8 free"
    zones_only = Topology.from_zones({0: 4, 1: 4})  # NodeResourceTopology: a CPU count per zone
    with pytest.raises(NoFit) as failure:
        place(zones_only, [0], 5, FULL_PCPUS, single_numa=True)
    assert str(failure.value) == "needs 5 CPUs in one NUMA node; NUMA node 0 has 3 free, NUMA node 1 has 4 free"
    assert FreeSummary.of(Topology.flat(0), []).shortage(1, SPREAD_BY_PCPUS, True) == \
        "needs 1 CPUs in one NUMA node; the node has no CPU"


def test_topology_sources_in_order():
    node = {"metadata": {"annotations": {"node.koordinator.sh/cpu-topology": json.dumps(
        {"detail": [{"id": i, "core": i % 2, "socket": 0, "node": 0} for i in range(4)]})}}}
    keys = ("stke.platform/cpu-topology", "node.koordinator.sh/cpu-topology")
    assert topology_from_node(node, keys, 4)[0].threads_per_core() == 2
    assert topology_from_node(node, keys, 4, nrt_zones={0: 2, 1: 2})[0].zones() == [0, 1]
    flat, problems = topology_from_node({"metadata": {}}, keys, 8)
    assert flat.zones() == [0] and len(flat.cpus) == 8 and not flat.detailed and problems == []
    # A topology that lists no CPU, or one CPU twice, describes no machine: the next source
    # counts, and the one ignored is said.
    twice = [{"id": 0, "core": 0, "socket": 0, "node": 0}, {"id": 0, "core": 1, "socket": 0, "node": 1}]
    for detail in ([], twice):
        unusable = {"metadata": {"annotations": {**node["metadata"]["annotations"],
                                                 keys[0]: json.dumps({"detail": detail})}}}
        topology, problems = topology_from_node(unusable, keys, 4)
        assert topology.threads_per_core() == 2, "Koordinator's, after ours"
        assert [(p.key, p.reason) for p in problems] == [(keys[0], "not a CPU topology (cpu topology lists no CPUs "
                                                          "or the same CPU twice); the next source of the topology "
                                                          "counts")]
        with pytest.raises(ValueError, match="no CPUs or the same CPU twice"):
            Topology.from_koordinator(json.dumps({"detail": detail}))
    # Neither readable: the node's real CPUs, one NUMA node; both said, a long value shortened.
    long = json.dumps({"cpus": list(range(40))})
    both = {"metadata": {"annotations": {keys[0]: "0-3", keys[1]: long}}}
    topology, problems = topology_from_node(both, keys, 4)
    assert len(topology.cpus) == 4 and not topology.detailed
    assert [str(p) for p in problems] == [
        f"annotation {keys[0]}='0-3' ignored: not a CPU topology (Extra data: line 1 column 2 (char 1)); the next "
        "source of the topology counts",
        f"annotation {keys[1]}={long[:57] + '...'!r} ignored: not a CPU topology (no 'detail'); the next source of "
        "the topology counts"]


def test_an_unreadable_topology_is_quoted_whole_up_to_60_characters():
    key = "stke.platform/cpu-topology"
    for text, quoted in (("x" * 60, "x" * 60), ("x" * 61, "x" * 57 + "...")):
        _, [problem] = topology_from_node({"metadata": {"annotations": {key: text}}}, [key], 4)
        assert problem.value == quoted


requests = st.lists(st.tuples(st.sampled_from([1, 2, 4, 6]), st.sampled_from([FULL_PCPUS, SPREAD_BY_PCPUS]),
                              st.booleans(), st.sampled_from([MOST_ALLOCATED, LEAST_ALLOCATED])),
                    min_size=1, max_size=20)


def room_for(topology: Topology, taken: set[int], count: int, policy: str, single_numa: bool) -> bool:
    """Whether the free CPUs can give ``count`` under ``policy``, counted from the topology alone:
    whole free cores (FullPCPUs, in multiples of the threads per core) or free CPUs, in one NUMA
    node or across them."""
    threads = topology.threads_per_core()
    if policy == FULL_PCPUS and count % threads:
        return False
    zones = sorted({c.node for c in topology.cpus})
    rooms = [len(whole_free_cores(topology, taken, zone)) * threads if policy == FULL_PCPUS else
             sum(1 for c in topology.cpus if c.node == zone and c.id not in taken) for zone in zones]
    return (max(rooms) if single_numa else sum(rooms)) >= count


@settings(max_examples=200)
@given(st.integers(1, 2), st.integers(2, 6), st.integers(1, 2), requests)
def test_no_cpu_is_handed_out_twice_and_policies_hold(sockets, cores, threads, sequence):
    """Every placement obeys its policy, and a refusal comes only where the free CPUs cannot
    give what is asked (a Pod refused CPUs its node has would wait for nothing)."""
    topology = koordinator(sockets, cores, threads)
    taken: set[int] = set()
    for count, policy, single_numa, strategy in sequence:
        room = room_for(topology, taken, count, policy, single_numa)
        try:
            placement = place(topology, taken, count, policy, single_numa, strategy)
        except NoFit as refusal:
            assert not room, f"{count} {policy} CPUs refused ({refusal}) with room for them"
            continue
        assert room
        chosen = set(placement.cpus)
        assert len(chosen) == count
        assert not chosen & taken, "a CPU handed out twice"
        assert chosen <= {c.id for c in topology.cpus}
        zones = {c.node for c in topology.cpus if c.id in chosen}
        if single_numa:
            assert len(zones) == 1
        if policy == FULL_PCPUS:
            for core in {c.core for c in topology.cpus if c.id in chosen}:
                assert all(c.id in chosen for c in topology.cpus if c.core == core), "a half core"
        taken |= chosen


def test_a_deleted_pod_releases_its_pending_reservation():
    from oversale.annotations import AnnotationKeys
    from oversale.placement import PodDemand
    from scheduler.state import ClusterState, PodRecord

    state = ClusterState(AnnotationKeys())
    state.reserve(PodRecord("uid-1", "node-0", PodDemand("uid-1", {"cpu": 4000, "memory": 0}, "FullPCPUs", True, 4),
                            (0, 1, 2, 3)))
    assert state.usage("node-0").bound_cpus == {0, 1, 2, 3}
    state.set_pod("uid-1", None)
    assert state.usage("node-0").bound_cpus == set()
