"""bf16 end to end on the tiny Qwen3-ASR: SFT (the encoder trains, with CTC), GRPO, save, reload and
eval, all in bfloat16 weights; checkpoints stay bf16 on disk."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from asr_rl.config import load_config
from asr_rl.evaluation.evaluate import resolve_dtype, run_eval
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.trainer.configs.rl import SFTConfig
from asr_rl.trainer.run.metrics import read_metrics
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.recipes.sft import train_sft

pytestmark = pytest.mark.slow

COMMON = ["max_steps=2", "save_steps=1", "eval_steps=0", "logging.tensorboard=false", "logging.progress_bar=false",
          "model.dtype=bfloat16"]


def _dtypes(folder) -> set:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


def test_sft_grpo_eval_and_reload_in_bf16(tiny_model, tiny_corpus, tmp_path):
    sft = train_sft(load_config(SFTConfig, None, [
        f"pretrain={tiny_model}", f"train_manifest={tiny_corpus / 'train.jsonl'}", f"output_dir={tmp_path / 'sft'}",
        "train_batch_size=4", "micro_train_batch_size=4", *COMMON]))
    assert _dtypes(sft) == {torch.bfloat16}  # saved in the training dtype, not upcast to fp32
    assert all(r["loss/ctc"] > 0 and r["loss/ce"] > 0 for r in read_metrics(tmp_path / "sft"))
    grpo = run_audio_rl(load_rl_config("grpo", None, [
        f"pretrain={sft}", f"train_manifest={tiny_corpus / 'train.jsonl'}", f"output_dir={tmp_path / 'grpo'}",
        "rollout_batch_size=2", "n_samples_per_prompt=4", "micro_train_batch_size=4", "max_new_tokens=8",
        "temperature=1.5", "actor_learning_rate=0.01", *COMMON]))
    assert _dtypes(grpo) == {torch.bfloat16}
    rows = read_metrics(tmp_path / "grpo")
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)
    before, after = AudioPolicy.from_pretrained(sft, dtype=torch.bfloat16), AudioPolicy.from_pretrained(grpo, dtype=torch.bfloat16)
    assert after.model.dtype == torch.bfloat16
    changed = [n for (n, a), (_, b) in zip(before.model.named_parameters(), after.model.named_parameters())
               if not torch.equal(a, b)]
    assert any("language_model" in n for n in changed) and not any("audio_tower" in n for n in changed)
    assert resolve_dtype(grpo, "auto") == torch.bfloat16 and resolve_dtype(tiny_model, "auto") == torch.float32
    report = run_eval(grpo, {"clean": str(tiny_corpus / "test_clean.jsonl")}, batch_size=2, max_new_tokens=8,
                      progress=False)  # dtype auto: bf16, as saved
    assert report["clean"].utterances == 2 and report["clean"].cer is not None


@pytest.fixture(scope="module")
def real_ids_model(tiny_corpus, tmp_path_factory):
    """Tiny dimensions with the released Qwen3-ASR vocabulary size (151,936) and special-token ids."""
    from asr_rl.models.builders import init_model

    return init_model("qwen3_asr", "tiny-real", [tiny_corpus / "train.jsonl"], tmp_path_factory.mktemp("r") / "real")


def test_the_released_token_ids_and_prompt_format_of_tiny_real(real_ids_model):
    """What the released Qwen3-ASR checkpoints hold: vocabulary size, special-token ids and prompt
    format (its SFT, GRPO local and on Ray, and eval in bf16 run on the released BPE in
    tests/models/test_released_bpe.py)."""
    import numpy as np

    from asr_rl.models.families.qwen3_asr import RELEASED_IDS

    policy = AudioPolicy.from_pretrained(real_ids_model)
    assert policy.model.config.text_config.vocab_size == 151936
    assert {t: policy.tokenizer.convert_tokens_to_ids(t) for t in RELEASED_IDS} == RELEASED_IDS
    ids = policy.prepare([np.zeros(16000, dtype=np.float32)], ["en"]).input_ids[0].tolist()
    # <|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|><|audio_pad|>xN<|audio_end|><|im_end|>\n
    # <|im_start|>assistant\n (Qwen's BPE: tiny-real's default)
    n = ids.count(151676)
    assert n > 0 and ids[0] == 151644 and ids[ids.index(151669):ids.index(151670) + 2] == [151669, *[151676] * n,
                                                                                           151670, 151645]
    text = policy.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>")
    assert text.endswith("<|audio_end|><|im_end|>\n<|im_start|>assistant\n")
    target = policy.target_ids(["call anna"], ["en"]).ids[0].tolist()
    assert target[-1] == 151645 and policy.eos_id == 151645 and policy.pad_id == 151643
    assert policy.parse(policy.tokenizer.decode(target[:-1]), "en") == ("English", "call anna", True)
