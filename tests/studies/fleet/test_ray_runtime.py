"""What a Ray worker reserves: a GPU only for a CUDA run, never for a CPU run or a simulation (tested without
a GPU or Ray: the decision is a function of the device and the cluster's GPU count)."""

from __future__ import annotations

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.errors import KvbenchError
from kvbench.studies.fleet.actor import InstanceSpec
from kvbench.studies.fleet.pool import InstancePool
from kvbench.studies.fleet.ray_runtime import actor_resources, uses_gpu


@pytest.mark.parametrize(("device", "simulate", "gpus", "expected"), [
    ("cpu", False, 8, False),  # the fleet's default on a GPU cluster: CPU actors
    ("cuda", True, 8, False),  # simulated: no tensors
    ("auto", True, 8, False),
    ("cuda", False, 8, True),
    ("cuda:1", False, 8, True),
    ("auto", False, 8, True),  # auto becomes CUDA on a worker that holds a GPU
    ("auto", False, 0, False),
])
def test_a_gpu_is_reserved_only_for_cuda_runs(device, simulate, gpus, expected):
    assert uses_gpu(device, simulate, gpus) is expected


def test_more_cpu_workers_than_gpus_reserve_cpus():
    assert actor_resources("cpu", False, gpus=1, workers=4, cpus=0.5) == {"num_cpus": 0.5}
    assert actor_resources("cuda", True, gpus=1, workers=4) == {"num_cpus": 1.0}
    assert actor_resources("cuda", False, gpus=4, workers=4) == {"num_gpus": 1}


@pytest.mark.parametrize("gpus", [0, 2])
def test_cuda_workers_beyond_the_clusters_gpus_are_refused_not_left_waiting(gpus):
    with pytest.raises(KvbenchError, match=f"3 CUDA workers need a GPU each, and the Ray cluster has {gpus}"):
        actor_resources("cuda", False, gpus=gpus, workers=3)


class _FakeRay:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.asked: dict = {}

    def cluster_resources(self) -> dict:
        return {"CPU": 16.0, "GPU": float(self.gpus)}

    def remote(self, **resources):
        self.asked = resources
        return lambda cls: cls


@pytest.mark.parametrize(("device", "asked"), [("cpu", {"num_cpus": 1.0}), ("cuda", {"num_gpus": 1})])
def test_the_instance_pool_asks_for_a_gpu_only_on_cuda(device, asked):
    ray = _FakeRay(gpus=2)
    InstancePool(ray, InstanceSpec("tiny", device, None, 0, EngineConfig()), instances=2)
    assert ray.asked == asked
