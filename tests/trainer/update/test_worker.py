"""The backend interface: both backends implement every `Backend` method (all the roles), and the local
backend is one `PolicyWorker` (the code each Ray policy rank runs too)."""
import inspect

from asr_rl.trainer.driver.roles import Backend
from asr_rl.trainer.update.worker import PolicyWorker


def _methods(cls) -> set[str]:
    """Public methods of `cls` and of the protocols it extends (the roles)."""
    return {n for c in cls.__mro__ for n, v in vars(c).items() if inspect.isfunction(v) and not n.startswith("_")}


def test_both_backends_implement_the_whole_interface():
    from asr_rl.trainer.distributed.ray_backend import RayBackend
    from asr_rl.trainer.driver.local import LocalBackend

    wanted = _methods(Backend)
    assert {"encode", "sample", "annotate", "train", "sync_weights", "save_model"} <= wanted
    for backend in (LocalBackend, RayBackend):
        missing = {m for m in wanted if not callable(getattr(backend, m, None))}
        assert not missing, f"{backend.__name__} lacks {sorted(missing)}"


def test_the_local_backend_is_one_policy_worker(tiny_model):
    from asr_rl.models.loading import load_rl_policy
    from asr_rl.trainer.recipes.rl import load_rl_config
    from asr_rl.trainer.driver.local import LocalBackend

    cfg = load_rl_config("grpo", None, [f"pretrain={tiny_model}", "algo.init_kl_coef=0.01"])
    workers = LocalBackend(cfg, load_rl_policy(cfg, cfg.pretrain, "cpu", text=False))
    assert isinstance(workers, Backend)
    assert isinstance(workers.worker, PolicyWorker) and workers.worker.world_size == 1
    assert workers.worker.ref is workers.ref is not None
