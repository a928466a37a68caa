"""Which Ray nodes are hosts, with how many slots (pure), and what the executor refuses before
it touches a cluster."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("ray", reason="Ray comes with the [ray] extra (.ci/setup installs it)")

from ringmaster.discovery.parse import MAX_SLOTS_PER_HOST, host_name_problem  # noqa: E402
from ringmaster.ray import ElasticRayExecutor  # noqa: E402
from ringmaster.ray.nodes import (  # noqa: E402
    RayNode,
    check_worker_resources,
    host_name,
    hosts_of,
    node_from_record,
    node_slots,
)

NODE_A = "a" * 56
NODE_B = "b" * 56


def _record(node_id: str = NODE_A, alive: object = True, **resources: object) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "127.0.0.1",
            "Resources": {"CPU": 2.0, "memory": 1e9, **resources}}


def test_a_record_becomes_a_node_and_a_bad_one_none() -> None:
    assert node_from_record(_record(GPU=1.0)) == RayNode(NODE_A, True, 2.0, 1.0)
    assert node_from_record(_record(), draining=[NODE_A]).draining
    for bad in (_record("not hex"), _record("ab"), _record(alive="yes"), _record(CPU=-1.0), _record(CPU=math.nan),
                _record(CPU="2"), _record(GPU=math.inf), {"NodeID": NODE_A, "Alive": True}, {}):
        assert node_from_record(bad) is None, bad


def test_hosts_are_alive_undrained_nodes_named_by_node_not_address() -> None:
    nodes = [RayNode(NODE_A, True, 4, 0), RayNode(NODE_B, True, 1, 0), RayNode("c" * 56, False, 8, 0),
             RayNode("d" * 56, True, 8, 0, draining=True), RayNode("e" * 56, True, 0.5, 0)]
    assert hosts_of(nodes, cpus_per_worker=1, gpus_per_worker=0) == {host_name(NODE_A): 4, host_name(NODE_B): 1}
    assert hosts_of(nodes, cpus_per_worker=2, gpus_per_worker=0) == {host_name(NODE_A): 2}
    assert host_name(NODE_A) != host_name(NODE_B)  # two nodes of one address are two hosts
    assert host_name_problem(host_name(NODE_A)) is None


def test_gpus_bound_the_slots_when_workers_need_them() -> None:
    node = RayNode(NODE_A, True, cpus=16, gpus=4)
    assert node_slots(node, 1, 0) == 16
    assert node_slots(node, 1, 1) == 4
    assert node_slots(node, 1, 2) == 2
    assert node_slots(RayNode(NODE_A, True, 16, 0), 1, 1) == 0


@given(cpus=st.floats(0, 5000), gpus=st.floats(0, 64), per_cpu=st.floats(0.01, 64), per_gpu=st.floats(0, 8))
def test_slots_never_ask_for_more_than_the_node_has(cpus, gpus, per_cpu, per_gpu) -> None:
    slots = node_slots(RayNode(NODE_A, True, cpus, gpus), per_cpu, per_gpu)
    assert 0 <= slots <= MAX_SLOTS_PER_HOST
    assert slots * per_cpu <= cpus * (1 + 1e-6) + 1e-6
    if per_gpu > 0:
        assert slots * per_gpu <= gpus * (1 + 1e-6) + 1e-6


def test_worker_resources_are_checked() -> None:
    check_worker_resources(0.5, 0)
    for cpus, gpus, named in ((0, 0, "cpus_per_worker"), (-1, 0, "cpus_per_worker"), (math.nan, 0, "cpus_per_worker"),
                              (True, 0, "cpus_per_worker"), (1, -1, "gpus_per_worker"), (1, "1", "gpus_per_worker")):
        with pytest.raises(ValueError, match=named):
            check_worker_resources(cpus, gpus)  # type: ignore[arg-type]


def test_the_executor_refuses_bad_arguments_naming_them() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        ElasticRayExecutor(min_workers=0)
    with pytest.raises(ValueError, match="max_workers .2. is below min_workers .3."):
        ElasticRayExecutor(min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="cpus_per_worker"):
        ElasticRayExecutor(cpus_per_worker=0)
    with pytest.raises(ValueError, match="bogus"):
        ElasticRayExecutor(bogus=1)
    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        ElasticRayExecutor(heartbeat_interval_s=-1)
    with pytest.raises(ValueError, match="min_workers=3 is not a whole number of replica groups of group_size=2: give "
                                         "2 or 4"):
        ElasticRayExecutor(min_workers=3, max_workers=4, group_size=2)
    with pytest.raises(ValueError, match="max_workers=5 is not a whole number"):
        ElasticRayExecutor(min_workers=2, max_workers=5, group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        ElasticRayExecutor(min_workers=2, group_size=0)
    assert ElasticRayExecutor(min_workers=2, max_workers=6, group_size=2).settings.group_size == 2


def test_a_detached_job_needs_a_good_name_and_only_a_detached_one_is_submitted() -> None:
    with pytest.raises(ValueError, match="give the job a name"):
        ElasticRayExecutor(detached=True)
    for bad in ("", "-lead", "a/b", "x" * 64, "spaced name", 7):
        with pytest.raises(ValueError, match="name="):
            ElasticRayExecutor(detached=True, name=bad)  # type: ignore[arg-type]
    assert ElasticRayExecutor(detached=True, name="resnet-50.v2_b").name == "resnet-50.v2_b"
    with pytest.raises(RuntimeError, match=r"only a detached job"):
        ElasticRayExecutor(min_workers=1).submit(print)
    with pytest.raises(ValueError, match="name="):
        ElasticRayExecutor.attach("../x")
    with pytest.raises(RuntimeError, match=r"ray.init"):
        ElasticRayExecutor.attach("nobody")  # this process is connected to no Ray cluster


def test_the_executor_says_what_to_do_before_a_cluster_is_there() -> None:
    executor = ElasticRayExecutor(min_workers=1)
    with pytest.raises(RuntimeError, match=r"call start\(\) first"):
        executor.run(print)
    with pytest.raises(RuntimeError, match=r"ray.init"):
        executor.start()  # this process is connected to no Ray cluster


def test_importing_it_without_ray_names_the_extra_to_install() -> None:
    # Ray is installed here, so its absence is made by hiding it from the import system: the
    # one fault this module cannot make for real.
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.modules['ray'] = None; import ringmaster.ray"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "pip install 'ringmaster[ray]'" in proc.stderr


def test_a_tiny_share_per_worker_is_capped_not_infinite() -> None:
    assert node_slots(RayNode(NODE_A, True, 4, 2), 1, 5e-324) == 4
    assert node_slots(RayNode(NODE_A, True, 1e300, 0), 1e-300, 0) == MAX_SLOTS_PER_HOST
