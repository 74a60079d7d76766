from __future__ import annotations

import json

import pytest
import torch

from asr_rl.data.batching import load_batch
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.lora import add_lora
from asr_rl.models.policy_base import group_index


@pytest.fixture
def policy(tiny_model):
    torch.manual_seed(0)
    return AudioPolicy.from_pretrained(tiny_model)


@pytest.fixture
def batch(tiny_corpus):
    return load_batch(read_manifest(tiny_corpus / "train.jsonl")[:3])


def test_sampling_n_per_utterance_encodes_each_utterance_once(policy, batch):
    encoded = []  # utterances the audio tower saw, per call
    tower = policy.spec.audio_tower(policy.model)
    hook = tower.register_forward_pre_hook(
        lambda mod, args, kwargs: encoded.append(kwargs["input_features"].shape[0]), with_kwargs=True)
    assert not policy.encoder_frozen  # a random encoder trains: generate encodes the prompts it is given
    out = policy.generate(policy.prepare(batch.waveforms, batch.languages), n=4, temperature=1.0, max_new_tokens=6)
    hook.remove()
    assert encoded == [3]  # one call, covering the 3 utterances once
    assert out.ids.shape[0] == 12 and len(out.texts) == 12


def test_logprobs_of_sampled_transcripts_equal_generate_scores(policy, batch):
    prompts = policy.prepare(batch.waveforms, batch.languages)
    embeds = policy.prompt_embeds(prompts, policy.encode_audio(prompts))
    gen = policy.model.generate(inputs_embeds=embeds, attention_mask=prompts.attention_mask, do_sample=True,
                                num_return_sequences=2, max_new_tokens=8, temperature=0.7, top_k=0, top_p=1.0,
                                eos_token_id=policy.eos_id, pad_token_id=policy.pad_id,
                                suppress_tokens=policy.forbidden_ids, output_scores=True,
                                return_dict_in_generate=True)
    resp = policy.responses_from_generated(gen.sequences)
    scores = torch.log_softmax(torch.stack(gen.scores, 1).float(), -1)
    expected = scores.gather(-1, resp.ids.unsqueeze(-1)).squeeze(-1).masked_fill(resp.mask == 0, 0)
    with torch.no_grad():
        ours, entropy = policy.logprobs(embeds, prompts.attention_mask, resp, group_index(len(embeds), 2), temperature=0.7,
                                        with_entropy=True)
    assert torch.allclose(ours, expected, atol=1e-5)
    assert torch.isfinite(entropy).all() and (entropy[resp.mask.bool()] > 0).all()


def test_forbidden_tokens_are_never_sampled_and_eos_ends_the_mask(policy, batch):
    prompts = policy.prepare(batch.waveforms, batch.languages)
    out = policy.generate(prompts, n=8, temperature=2.0, max_new_tokens=10)
    assert not any(t in policy.forbidden_ids for t in out.ids[out.mask.bool()].tolist())
    for row, m in zip(out.ids.tolist(), out.mask.tolist()):
        if policy.eos_id in row:
            end = row.index(policy.eos_id)
            assert m[: end + 1] == [1] * (end + 1) and sum(m) == end + 1


def test_freeze_by_pattern_keeps_encoder_out_of_the_trainable_set(policy):
    frozen = policy.freeze()
    assert frozen and all(n.startswith("model.audio_tower.") for n in frozen)
    trainable = [n for n, _ in policy.trainable_parameters()]
    assert any("multi_modal_projector" in n for n in trainable) and any("language_model" in n for n in trainable)
    assert policy.encoder_frozen


def test_lora_checkpoint_is_a_plain_merged_model(policy, batch, tmp_path):
    policy.freeze()
    assert add_lora(policy, rank=4, alpha=8, target_modules=("q_proj", "v_proj")) == 4
    trainable = [n for n, _ in policy.trainable_parameters()]
    assert all("lora_" in n or "multi_modal_projector" in n for n in trainable)
    for n, p in policy.model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.2)  # make the adapters matter
    prompts = policy.prepare(batch.waveforms, batch.languages)
    resp = policy.target_ids(batch.texts, batch.languages)
    with torch.no_grad():
        before = policy.logprobs(policy.prompt_embeds(prompts, policy.encode_audio(prompts)), prompts.attention_mask, resp)
    from asr_rl.models.lora import merged_copy

    merged = merged_copy(policy.model)  # copies only the base layers it merges into
    shared = {p.data_ptr() for p in policy.model.parameters()}
    copied = [n for n, p in merged.named_parameters() if p.data_ptr() not in shared]
    assert copied and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in copied), copied
    policy.save_pretrained(tmp_path / "merged")
    with torch.no_grad():  # saving left the policy (adapters unmerged) as it was
        assert torch.equal(policy.logprobs(policy.prompt_embeds(prompts, policy.encode_audio(prompts)),
                                           prompts.attention_mask, resp), before)
    weights = json.dumps(sorted((tmp_path / "merged").iterdir()), default=str)
    assert "adapter" not in weights
    again = AudioPolicy.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        after = again.logprobs(again.prompt_embeds(prompts, again.encode_audio(prompts)), prompts.attention_mask, resp)
    assert torch.allclose(before, after, atol=1e-5)


def test_folder_that_is_missing_or_not_an_audio_llm(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with pytest.raises(FileNotFoundError, match="does not exist or has no config.json"):
        AudioPolicy.from_pretrained(tmp_path / "nothing")
    Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "text")
    from asr_rl.models.families import SPECS

    assert {"glmasr", "qwen2_audio", "qwen3_asr", "qwen2_5_omni_thinker"} <= set(SPECS)
    with pytest.raises(ValueError, match=f"'qwen2' is not a supported audio-LLM; supported: {', '.join(sorted(SPECS))}$"):
        AudioPolicy.from_pretrained(tmp_path / "text")


def test_parse_output_reads_language_tag_and_flags_malformed(policy):
    assert policy.parse("language English<asr_text>call anna", "en") == ("English", "call anna", True)
    assert policy.parse("call anna", "en") == (None, "call anna", False)
    policy.force_language = True
    assert policy.parse(" call anna ", "zh") == ("Chinese", "call anna", True)


def _owned_bytes(ref, policy) -> int:
    shared = {p.data_ptr() for p in policy.model.parameters()}
    return sum(p.numel() * p.element_size() for p in ref.model.parameters() if p.data_ptr() not in shared)


def test_the_kl_reference_copies_only_what_trains_and_leaves_the_tower_out(policy, batch):
    policy.freeze()  # the tower frozen, as in RL
    rows = policy.encode_batch(batch)
    resp = policy.target_ids(batch.texts, batch.languages)
    ref = policy.reference_copy()
    tower = policy.spec.audio_tower(ref.model)
    assert isinstance(tower, torch.nn.Identity) and ref.encoder_cache is policy.encoder_cache
    trainable = sum(p.numel() * p.element_size() for _, p in policy.trainable_parameters())
    assert _owned_bytes(ref, policy) == trainable  # frozen weights are shared, not copied
    embeds, mask = policy.embed_rows(rows)
    with torch.no_grad():
        start = policy.logprobs(embeds, mask, resp)
        assert torch.equal(ref.logprobs(*ref.embed_rows(rows), resp), start)
        for _, p in policy.trainable_parameters():  # the policy moves on; the reference does not
            p.add_(0.1)
        assert not torch.equal(policy.logprobs(*policy.embed_rows(rows), resp), start)
        assert torch.equal(ref.logprobs(*ref.embed_rows(rows), resp), start)
    # under LoRA the reference owns only the adapters and the projector: the LLM's base is shared
    add_lora(policy, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    lora_ref = policy.reference_copy()
    lora_trainable = sum(p.numel() * p.element_size() for _, p in policy.trainable_parameters())
    assert _owned_bytes(lora_ref, policy) == lora_trainable < trainable / 2
    # ZeRO-3 re-partitions the policy's tensors: nothing may be shared then
    assert _owned_bytes(policy.reference_copy(share_frozen=False), policy) > trainable


def test_the_original_qwen3_asr_release_format_is_refused_with_the_conversion_named(tiny_model, tmp_path):
    import shutil

    folder = tmp_path / "Qwen3-ASR-0.6B"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["thinker_config"] = {"audio_config": {}, "text_config": {}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"original Qwen3-ASR release format .*Qwen/Qwen3-ASR-0\.6B-hf.*"
                                         r"convert_qwen3_asr_to_hf.py"):
        AudioPolicy.from_pretrained(folder)


def test_audio_whose_prompt_would_fill_the_llm_s_positions_is_refused_naming_it(tiny_model):
    """The tiny Qwen3-ASR chunks long audio (no encoder window), and its LLM has 4,096 positions: a
    10-minute clip's prompt alone would take them all, and decoding past them loops, saying nothing."""
    import numpy as np

    from asr_rl.models.families import AudioTooLong

    policy = AudioPolicy.from_pretrained(tiny_model)
    limit = policy.llm_config().max_position_embeddings
    ten_minutes = np.zeros(600 * 16000, dtype=np.float32)
    assert policy.prompt_positions(600.0) >= limit > policy.prompt_positions(20.0)
    with pytest.raises(AudioTooLong, match=rf"utterance long_call lasts 600\.0 s: its prompt would take about \d+ "
                                           rf"positions, and the LLM has {limit} \(max_position_embeddings\)"):
        policy.check_durations([ten_minutes], ["long_call"])
    policy.check_durations([ten_minutes[: 20 * 16000]], ["short"])  # 20 s fits
    two = policy.prepare([np.zeros(32000, np.float32)], [None])
    assert int(two.attention_mask.sum()) == policy.prompt_positions(2.0)  # the estimate is the prompt's length
