"""The Ray pool on a cluster whose nodes come and go (Ray's local multi-node cluster, CPU jobs): a
node that joins is used, a node lost mid-job has its job run again on another, and the pool
takes up a node that joins in its place; an actor that died idle is replaced."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support import ray_busy_worker, ray_workers_started
from test_ray_pool import SOLUTION, job  # the same CPU jobs as the one-node tests

pytestmark = pytest.mark.slow  # a local Ray cluster whose nodes come and go

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kernel_env[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from kernel_env.runtime.pool import RayPool  # noqa: E402


@pytest.fixture
def cluster():
    # The head gives no CPU, as docs/scale.md's recipe has it: no evaluation lands there.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_nodes_that_join_are_used_and_a_lost_nodes_job_runs_on_another(cluster, tmp_path):
    pool = RayPool(refresh_s=1.0)
    try:
        assert pool.workers() == [] and pool.slots == 0  # nothing to run on yet: a job would wait
        waiting = pool.submit(job(tmp_path, SOLUTION))
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        started = ray_workers_started(pool, 2)
        assert sorted(w["node"] for w in started) == sorted(node.node_id for node in nodes), started
        assert pool.slots == 4  # each node's CPU runs two jobs at once, as a local pool's does
        assert waiting.result(timeout=300).correct

        # A node lost mid-job: its job runs again on the other node and is answered as if nothing happened.
        running = pool.submit(job(tmp_path, SOLUTION))
        busy = ray_busy_worker(pool)
        [lost] = [node for node in nodes if node.node_id == next(w["node"] for w in pool.workers() if w["pid"] == busy)]
        cluster.remove_node(lost)
        result = running.result(timeout=300)
        assert result.correct and result.fault is None, (result.error, result.violations)
        kept = next(n.node_id for n in nodes if n is not lost)
        deadline = time.monotonic() + 60
        while [w["node"] for w in pool.workers()] != [kept] and time.monotonic() < deadline:
            time.sleep(0.2)  # the pool forgets the lost node's actor at its next look at the cluster
        assert [w["node"] for w in pool.workers()] == [kept], pool.workers()

        # A node joining in its place is taken up.
        joined = cluster.add_node(num_cpus=1)
        started = ray_workers_started(pool, 2)
        assert joined.node_id in {w["node"] for w in started}
        assert all(future.result(timeout=300).correct for future in [pool.submit(job(tmp_path, SOLUTION)) for _ in range(4)])
    finally:
        pool.close()


def test_an_actor_that_died_idle_is_started_again_and_the_job_sent_to_it_answered(cluster, tmp_path):
    node = cluster.add_node(num_cpus=1)
    pool = RayPool(refresh_s=1.0)
    try:
        [worker] = ray_workers_started(pool, 1)
        os.kill(worker["pid"], signal.SIGKILL)
        time.sleep(1.0)
        # Nothing tells the pool of an idle actor's death: its next job finds out, and is run again on
        # the actor started in its place (its CPU is free once the dead one is gone).
        assert pool.submit(job(tmp_path, SOLUTION)).result(timeout=300).correct
        [again] = ray_workers_started(pool, 1)
        assert again["pid"] != worker["pid"] and again["node"] == node.node_id
    finally:
        pool.close()
