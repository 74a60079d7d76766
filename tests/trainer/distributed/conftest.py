"""Shared fixtures of the Ray tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A real embedded local Ray (2 CPU slots) for one module, shut down after it, so that the next
    module starts its own with the slots it needs."""
    from asr_rl.trainer.distributed.ray_utils import init_ray, shutdown_ray

    init_ray(num_cpus=2, object_store_mb=256)
    yield
    shutdown_ray()
