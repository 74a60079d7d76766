"""The backend interface: both backends implement every `Workers` method, and the local backend
is one `PolicyRank` (the code each Ray trainer rank runs too)."""
import inspect

from asr_rl.trainer.rl.interfaces import Workers
from asr_rl.trainer.rl.rank import PolicyRank


def _methods(cls) -> set[str]:
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}


def test_both_backends_implement_the_whole_interface():
    from asr_rl.trainer.distributed.ray_workers import RayWorkers
    from asr_rl.trainer.rl.workers import LocalWorkers

    wanted = _methods(Workers)
    assert {"encode", "sample", "annotate", "train", "sync_weights", "save_model"} <= wanted
    for backend in (LocalWorkers, RayWorkers):
        missing = {m for m in wanted if not callable(getattr(backend, m, None))}
        assert not missing, f"{backend.__name__} lacks {sorted(missing)}"


def test_the_local_backend_is_one_policy_rank(tiny_model):
    from asr_rl.models.loading import load_rl_policy
    from asr_rl.trainer.recipes.rl import load_rl_config
    from asr_rl.trainer.rl.workers import LocalWorkers

    cfg = load_rl_config("grpo", None, [f"pretrain={tiny_model}", "algo.init_kl_coef=0.01"])
    workers = LocalWorkers(cfg, load_rl_policy(cfg, cfg.pretrain, "cpu", text=False))
    assert isinstance(workers, Workers)
    assert isinstance(workers.rank, PolicyRank) and workers.rank.world_size == 1
    assert workers.rank.ref is workers.ref is not None
