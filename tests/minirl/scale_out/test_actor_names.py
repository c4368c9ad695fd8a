"""Actor method names survive nnsight: importing it mounts ``.save`` onto every Python object,
which would shadow an actor handle's method of that name (a Ray run after an nnsight capture
in the same process failed with "'function' object has no attribute 'remote'")."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("ray")


def test_no_actor_method_is_shadowed_by_nnsight():
    nnsight = pytest.importorskip("nnsight")
    from minirl.scale_out import ray_actors, ray_queue

    assert nnsight is not None and hasattr(object(), "save")  # the mount is active in this process
    actors = [ray_actors.RolloutActor, ray_actors.RewardActor, ray_actors.TrainerActor, ray_queue.ControllerActor,
              ray_queue.StorageUnit]
    for actor in actors:
        cls = actor.__ray_metadata__.modified_class.__mro__[1]  # the class as written (Ray subclasses it)
        methods = {n for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")}
        assert methods and not {n for n in methods if hasattr(object(), n)}, f"{cls.__name__}: {methods}"
