"""The Ray actors of a fleet run: started once, shared by every policy, all killed at the end.

The base instances (those a run starts with) load the model once and serve every policy in turn; one that
died under a policy (a fault) is replaced before the next, so every policy starts with the same fleet.
Instances the autoscaler adds are started through :meth:`InstancePool.new_actor` and killed by the run that
added them (or, at the latest, by :meth:`close`).
"""

from __future__ import annotations

from typing import Any

from kvbench.errors import RunFailed
from kvbench.studies.fleet.actor import InstanceServer, InstanceSpec
from kvbench.studies.fleet.ray_runtime import actor_resources, gpus_available


class InstancePool:
    def __init__(self, ray, spec: InstanceSpec, cpus_per_instance: float = 1.0, instances: int = 1) -> None:
        self.ray = ray
        # a GPU per actor only for a CUDA fleet, with a GPU for each of the ``instances`` it starts with
        resources = actor_resources(spec.device, False, gpus_available(ray), instances, cpus_per_instance)
        self.actor_class = ray.remote(**resources)(InstanceServer)
        self.spec = spec
        self.actors: list[Any] = []  # every actor started, to kill at the end
        self._base: list[tuple[Any, float]] = []  # (actor, measured start-up seconds)

    def new_actor(self, epoch: float):
        actor = self.actor_class.remote(self.spec, epoch)
        self.actors.append(actor)
        return actor

    def base(self, count: int) -> list[tuple[Any, float]]:
        """The first ``count`` base instances, started (in parallel) where missing; waits until they are ready."""
        missing = count - len(self._base)
        if missing > 0:
            started = [self.new_actor(0.0) for _ in range(missing)]
            try:
                ready = self.ray.get([actor.ready.remote() for actor in started])
            except Exception as err:
                raise RunFailed(
                    f"an instance failed to start: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                ) from None
            self._base += [(actor, startup) for actor, (startup, _pid) in zip(started, ready, strict=True)]
        return self._base[:count]

    def forget_dead(self, run) -> None:
        """Base instances that died in ``run`` are dropped; the next ``base`` call starts replacements."""
        dead = {slot.index for slot in run.slots if slot.failure is not None and slot.index < len(self._base)}
        self._base = [entry for index, entry in enumerate(self._base) if index not in dead]

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone
                pass
        self.actors.clear()
        self._base.clear()

    def __enter__(self) -> InstancePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
