"""Reading the Ray trainer ranks' state from the tests, through Ray's own `__ray_call__` (a function
run on the actor instance), so the product carries no test-only methods."""
from __future__ import annotations


def _gathered_trainable(rank) -> dict:
    """On a `RayPolicyWorker`: its full trainable parameters (ZeRO-3 gathered; every rank enters)."""
    params = [(n, p) for n, p in rank.policy.model.named_parameters() if p.requires_grad]
    with rank.policy_strategy.gathered([p for _, p in params]):
        return {n: p.detach().cpu().clone() for n, p in params}


def rank_weights(workers) -> list[dict]:
    """Every policy rank's trainable parameters, gathered on all ranks at once."""
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import tests/
    return ray.get([a.__ray_call__.remote(_gathered_trainable) for a in workers.ranks])
