"""Fault injection for the resume tests, kept out of the production path: runs the `asr-rl` command
line in this process with a wrapper that SIGKILLs the process (no cleanup runs, like an OOM kill or
a preempted node) at a chosen point.

    python tests/fault.py after-step N   -- train grpo key=value ...   # after step N is logged
    python tests/fault.py mid-save N     -- train sft key=value ...    # step N's weights written, state not
    python tests/fault.py kill-rank R:S  -- train grpo backend=ray ... # Ray trainer rank R exits hard in step S's update
"""
from __future__ import annotations

import os
import signal
import sys


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    mode, step, sep, *cli = argv
    assert sep == "--" and mode in ("after-step", "mid-save", "kill-rank"), __doc__
    if mode == "kill-rank":
        _kill_rank_in_workers(*map(int, step.split(":")))
        from asr_rl.cli import main as cli_main

        return cli_main(cli)
    target = int(step)
    import asr_rl.trainer.run.checkpoint as ckpt
    import asr_rl.trainer.driver.loop as loop
    import asr_rl.trainer.recipes.sft as sft
    from asr_rl.trainer.run.metrics import MetricsLogger

    if mode == "after-step":
        log = MetricsLogger.log

        def log_then_die(self, n, metrics):
            log(self, n, metrics)
            if n == target:
                _die()

        MetricsLogger.log = log_then_die
    else:
        save = ckpt.save_checkpoint

        def save_dying_between_weights_and_state(output_dir, n, save_model, *args, **kwargs):
            def weights_then_die(folder):
                save_model(folder)
                _die()

            return save(output_dir, n, weights_then_die if n == target else save_model, *args, **kwargs)

        for module in (ckpt, loop, sft):
            module.save_checkpoint = save_dying_between_weights_and_state
    from asr_rl.cli import main as cli_main

    return cli_main(cli)


def _kill_rank_in_workers(rank: int, step: int) -> None:
    """Every Ray worker this run starts runs a setup hook (Ray's `worker_process_setup_hook`) that
    makes policy rank `rank` exit hard when its update of step `step` begins, like a node lost
    mid-step."""
    import ray

    def arm() -> None:
        from asr_rl.trainer.update.worker import PolicyWorker

        train = PolicyWorker.train

        def train_or_die(self, exp, n, *args, **kwargs):
            if (self.rank, n) == (rank, step):
                os._exit(1)
            return train(self, exp, n, *args, **kwargs)

        PolicyWorker.train = train_or_die

    init = ray.init

    def init_with_hook(*args, runtime_env=None, **kwargs):
        return init(*args, runtime_env={**(runtime_env or {}), "worker_process_setup_hook": arm}, **kwargs)

    ray.init = init_with_hook


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
