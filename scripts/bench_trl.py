"""Benchmark: TRL's GRPOTrainer and asr-rl's GRPO side by side, one run, same everything.

    python scripts/bench_trl.py --steps 12

Same tiny Qwen2 (random init, char tokenizer; `--size`), same prompts (chat format), same reward
function (one TRL-style function, loaded by asr-rl as a reward file), same batch shape (8 prompts x
4 generations x 16 new tokens), KL beta 0.04, temperature 1.0, one optimizer step per generation
batch, 1 torch thread. Prints the median step time of each (first 2 steps excluded as warm-up) and
the ratio. Target (issue 7): asr-rl / TRL <= 0.5. TRL is a bench-only dependency (`pip install
asr-rl[bench]`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

REWARD_FILE = '''
def reward_len(completions, **kwargs):
    """Prefer 8-character answers (TRL's length-reward example)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [-abs(len(t) - 8) / 8 for t in texts]
'''
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


def make_data(root: Path) -> tuple[Path, Path, Path]:
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"spell {a} {b}"}) + "\n" for a in WORDS for b in WORDS[:6]))
    reward = root / "reward_len.py"
    reward.write_text(REWARD_FILE)
    from asr_rl.models.builders import init_model

    model = init_model("qwen2", ARGS.size, [prompts], root / "model", seed=0)
    return prompts, reward, model


def bench_trl(model: Path, prompts: Path, reward: Path, steps: int) -> list[float]:
    import importlib.util

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = importlib.util.spec_from_file_location("reward_len", reward)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [json.loads(x) for x in prompts.read_text().splitlines()]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows])
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    cfg = GRPOConfig(output_dir=str(model.parent / "trl_out"), per_device_train_batch_size=32, num_generations=4,
                     generation_batch_size=32, max_completion_length=16, beta=0.04, temperature=1.0,
                     learning_rate=1e-5, max_steps=steps, use_cpu=True, logging_steps=1, report_to="none",
                     save_strategy="no", seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=mod.reward_len, args=cfg,
                          train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model),
                          callbacks=[Timer()])
    trainer.train()
    return times


def bench_asr_rl(model: Path, prompts: Path, reward: Path, steps: int, out: Path) -> list[float]:
    from asr_rl.trainer.run.metrics import read_metrics
    from asr_rl.trainer.recipes.rl import train_rl

    train_rl("grpo", None, [f"pretrain={model}", f"prompt_data={prompts}", f"output_dir={out}",
                            "rollout_batch_size=8", "n_samples_per_prompt=4", "max_new_tokens=16",
                            "micro_train_batch_size=32", "init_kl_coef=0.04", "use_kl_loss=true",
                            "temperature=1.0", "actor_learning_rate=1e-5", f"max_steps={steps}", "save_steps=0",
                            f"reward.file={reward}", "rollout.dynamic_filtering=false", "num_threads=1",
                            "logging.tensorboard=false", "logging.progress_bar=false"])
    return [r["time/step"] for r in read_metrics(out)]


def main() -> None:
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prompts, reward, model = make_data(root)
        ours = bench_asr_rl(model, prompts, reward, ARGS.steps, root / "asr_rl_out")
        theirs = bench_trl(model, prompts, reward, ARGS.steps)
    a, t = statistics.median(ours[2:]), statistics.median(theirs[2:])
    n_params = ARGS.size
    print(f"\nGRPO step, tiny Qwen2 ({n_params}), 8 prompts x 4 generations x 16 tokens, beta 0.04, 1 thread")
    print(f"{'trainer':<12} {'median s/step':>14} {'steps timed':>12}")
    print(f"{'asr-rl':<12} {a:>14.3f} {len(ours) - 2:>12}")
    print(f"{'TRL 1.16':<12} {t:>14.3f} {len(theirs) - 2:>12}")
    print(f"ratio asr-rl / TRL = {a / t:.2f}  (target <= 0.5)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ARGS = p.parse_args()
    main()
