"""Reward-model training resumes a killed run like every trainer: the same weights and losses as
the uninterrupted run, only the steps after the checkpoint trained again, every step logged once."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr_rl.config import load_config
from asr_rl.trainer.recipes import rm
from asr_rl.trainer.configs.preference import RMConfig
from asr_rl.trainer.recipes.rm import PairOrder, train_rm
from asr_rl.trainer.run.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_pair_order_takes_batches_and_reshuffles_when_the_rest_is_short():
    order = PairOrder(5, 2, seed=0)
    first = [order.next_indices() for _ in range(2)]
    saved = order.state_dict()
    third = order.next_indices()  # 1 left, fewer than a batch: a new permutation
    assert sorted(first[0] + first[1]) == sorted(set(first[0] + first[1])) and len(third) == 2
    again = PairOrder(5, 2, seed=0)
    again.load_state_dict(saved)
    assert [again.next_indices() for _ in range(3)] == [third] + [order.next_indices() for _ in range(2)]


def test_a_killed_rm_run_resumes_bit_for_bit(tiny_text_model, text_data, tmp_path, monkeypatch):
    # 16 pairs, 5 a step: step 4 reshuffles, after the step 2 checkpoint the run resumes from
    common = [f"pretrain={tiny_text_model}", f"prompt_data={text_data['prefs']}", "max_steps=4", "save_steps=2",
              "train_batch_size=5", "optim.learning_rate=0.003", "logging.tensorboard=false",
              "logging.progress_bar=false"]
    whole = train_rm(load_config(RMConfig, None, common + [f"output_dir={tmp_path / 'whole'}"]))
    cut = tmp_path / "cut"
    fault = Path(__file__).resolve().parents[2] / "fault.py"  # SIGKILL after step 3 is logged
    res = subprocess.run([sys.executable, str(fault), "after-step", "3", "--", "train", "rm", *common,
                          f"output_dir={cut}"], capture_output=True, text=True, timeout=600)
    assert res.returncode == -9, res.stderr[-2000:]
    trained = []
    loss = rm.rm_batch_loss
    monkeypatch.setattr(rm, "rm_batch_loss", lambda *a, **k: trained.append(1) or loss(*a, **k))
    resumed = train_rm(load_config(RMConfig, None, common + [f"output_dir={cut}", "resume=auto"]))
    assert len(trained) == 2  # steps 3 and 4, from the step 2 checkpoint
    from safetensors.torch import load_file

    a, b = load_file(Path(whole) / "model.safetensors"), load_file(Path(resumed) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    whole_rows, cut_rows = read_metrics(tmp_path / "whole"), read_metrics(cut)
    assert [r["step"] for r in cut_rows] == [1, 2, 3, 4]
    assert [r["rm/loss"] for r in cut_rows] == [r["rm/loss"] for r in whole_rows]
