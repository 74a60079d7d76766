"""The audio policy: a Hugging Face audio-LLM plus its processor, as RL needs it.

Encode each utterance once (audio encoder + projector), splice the audio embeddings into the prompt
embeddings, then reuse those prompt embeddings for every one of the group's `n` samples and for the
log-probabilities of any given transcripts. The encoder runs without grad when it is frozen, so an
RL step pays for it once per utterance, not once per sample (a calibration run measured that
recomputing the shared audio prefix dominated a naive GRPO step).

Sampling and scoring share one distribution: both divide logits by the sampling temperature and
forbid the same tokens (PAD, `<|im_start|>`, audio tokens), because a sampled audio placeholder
breaks the model's placeholder check and a forbidden token's -inf would poison the ratio.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from asr_rl.models.codec import ResponseCodec
from asr_rl.models.encoder_cache import EncoderCache, encoder_fingerprint
from asr_rl.models.families import AudioLLMSpec, AudioPrompts, AudioTooLong, spec_for
from asr_rl.models.policy_base import CausalPolicy, PromptRow, Responses
from asr_rl.models.weights import read_model_config


class AudioPolicy(CausalPolicy):
    """Attributes:
        encoder_cache: prompt rows (ids + frozen-encoder states) by `(audio path, augmentation
            variant, forced language)`, filled by `encode_batch` while the encoder is frozen, so a
            frozen encoder runs once per utterance and variant for the whole run (SFT epochs, RL
            samples, log-prob passes and dev evaluations alike); RAM-bounded, optionally backed by
            a folder of shards (models/encoder_cache.py).
    """

    def __init__(self, model: nn.Module, processor, force_language: bool = False, sample_rate: int = 16000):
        spec = spec_for(model.config.model_type)
        tokenizer = processor.tokenizer
        super().__init__(model, tokenizer, ResponseCodec(tokenizer, spec, force_language),
                         _forbidden_token_ids(tokenizer, spec))
        self.processor = processor
        self.spec: AudioLLMSpec = spec
        self.sample_rate = sample_rate
        self.encoder_cache = EncoderCache()
        self.encoder_seconds = 0.0  # spent filling the cache (audio loading and augmentation included)
        self.info: dict = {}  # asr_rl.json of the folder it came from (models/builders.py)
        self._prompt_growth: tuple[int, float] | None = None  # (positions at 0 s, positions a second)

    @property
    def force_language(self) -> bool:
        return self.codec.force_language

    @force_language.setter
    def force_language(self, value: bool) -> None:
        self.codec.force_language = value

    def body(self) -> nn.Module:
        return self.spec.language_model(self.model)

    def default_frozen(self) -> tuple[str, ...]:
        return self.spec.frozen_by_default()

    def llm_config(self):
        return self.spec.llm_config(self.model.config)

    def save_extra(self, path: str | Path) -> None:
        import json

        from asr_rl.models.builders import INFO_FILE

        self.processor.save_pretrained(path)
        if self.info:  # how the starting folder was built travels with every checkpoint
            (Path(path) / INFO_FILE).write_text(json.dumps(self.info, indent=1) + "\n")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        **kwargs) -> "AudioPolicy":
        config = read_model_config(path)
        spec = spec_for(config.model_type)  # clear error for a folder that is not an audio-LLM
        spec.check_folder(path, json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))
        model = spec.load_model(path, dtype).to(device)
        from asr_rl.models.builders import read_info

        policy = cls(model, spec.load_processor(path), **kwargs)
        policy.info = read_info(path)
        return policy

    def use_encoder_cache(self, folder: str | Path | None, max_gib: float | None = None) -> None:
        """Cache this frozen encoder's states in RAM up to `max_gib` (None: no bound), and in `folder`
        when given (rows another run with this same encoder and prompt format wrote there are read back)."""
        fingerprint = encoder_fingerprint(self.spec.audio_tower(self.model), self.processor) if folder else ""
        self.encoder_cache.close()
        self.encoder_cache = EncoderCache(fingerprint, None if max_gib is None else int(max_gib * 2**30), folder)

    def save_encoder_cache(self) -> None:
        """Every row is written to the folder as it is encoded: release the files (SFT's end)."""
        self.encoder_cache.close()

    def _reference_skips(self) -> dict[int, object]:
        # the reference scores prompt rows that carry the audio states already: no tower; the
        # encoder cache and the processor are shared, not copied
        skips = {id(self.encoder_cache): self.encoder_cache, id(self.processor): self.processor}
        if self.encoder_frozen:
            skips[id(self.spec.audio_tower(self.model))] = nn.Identity()
        return skips

    @property
    def encoder_frozen(self) -> bool:
        return not any(p.requires_grad for p in self.spec.audio_tower(self.model).parameters())

    # ------------------------------------------------------------------ inputs
    def prepare(self, waveforms: list[np.ndarray], languages: list[str | None],
                ids: list[str] | None = None, contexts: list[tuple[str, ...]] | None = None) -> AudioPrompts:
        """Processor features and prompt ids for B waveforms (float32 mono at `sample_rate`), each
        with its context list (`contexts`, default none); audio longer than the family's encoder
        window is refused (`AudioTooLong`), naming the utterance by its id in `ids` (else its index)."""
        self.check_durations(waveforms, ids or [str(i) for i in range(len(waveforms))])
        prompts = self.spec.prepare(self.processor, waveforms, languages, self.force_language, self.sample_rate,
                                    contexts or [()] * len(waveforms))
        return prompts.to(self.device, self.model.dtype)

    def check_durations(self, waveforms: list[np.ndarray], ids: list[str]) -> None:
        """`AudioTooLong` naming the first utterance longer than the family's encoder window, or whose
        prompt alone would take every position the LLM has (`max_position_embeddings`): past them
        the model decodes garbage, typically a loop, and says nothing."""
        self.spec.check_durations(self.processor, waveforms, ids, self.sample_rate)
        limit = getattr(self.llm_config(), "max_position_embeddings", None)
        for name, w in zip(ids, waveforms):
            seconds = len(w) / self.sample_rate
            if limit and self.prompt_positions(seconds) >= limit:
                raise AudioTooLong(f"utterance {name} lasts {seconds:.1f} s: its prompt would take about "
                                   f"{self.prompt_positions(seconds)} positions, and the LLM has {limit} "
                                   "(max_position_embeddings), none left for its transcript; split it or leave it out")

    def prompt_positions(self, seconds: float) -> int:
        """About how many LLM positions the prompt of a `seconds`-long utterance takes: measured once,
        on silent clips of 1 and 2 s (the prompt's text, and the audio's positions a second)."""
        if self._prompt_growth is None:
            one, two = (int(self.spec.prepare(self.processor, [np.zeros(int(s * self.sample_rate), np.float32)],
                                              [None], self.force_language, self.sample_rate, [()])
                            .attention_mask.sum()) for s in (1.0, 2.0))
            self._prompt_growth = (2 * one - two, float(two - one))
        base, per_second = self._prompt_growth
        return base + int(np.ceil(per_second * seconds))

    def encode_audio(self, prompts: AudioPrompts) -> torch.Tensor:
        """Packed audio-encoder states `(sum_i L_i, d_audio)`. A frozen encoder runs without grad
        and in eval mode (no dropout), so its states are a pure function of the audio."""
        if not self.encoder_frozen:
            return self.spec.encode_audio(self.model, prompts)
        tower = self.spec.audio_tower(self.model)
        was_training = tower.training
        tower.eval()
        try:
            with torch.no_grad():
                return self.spec.encode_audio(self.model, prompts)
        finally:
            tower.train(was_training)

    def prompt_embeds(self, prompts: AudioPrompts, audio_states: torch.Tensor) -> torch.Tensor:
        """`(B, P, H)` prompt embeddings with the projected audio at the placeholder positions.
        The projector runs here (with grad when trainable)."""
        return self._splice(prompts.input_ids, audio_states)

    def audio_positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`(B, P)` bool: where the projected audio goes in these prompts (the family's placeholder)."""
        return self.spec.audio_positions(self.model.config, input_ids)

    def _splice(self, input_ids: torch.Tensor, audio_states: torch.Tensor) -> torch.Tensor:
        embeds = self.model.get_input_embeddings()(input_ids)
        audio = self.spec.projector(self.model)(audio_states).to(embeds.dtype)
        placeholder = self.audio_positions(input_ids).unsqueeze(-1)
        if int(placeholder.sum()) != audio.shape[0]:
            raise ValueError(f"prompt has {int(placeholder.sum())} audio placeholders but the encoder "
                             f"produced {audio.shape[0]} frames")
        return embeds.masked_scatter(placeholder.expand_as(embeds), audio)

    @torch.no_grad()
    def encode_prompts(self, waveforms: list[np.ndarray], languages: list[str | None],
                       ids: list[str] | None = None, contexts: list[tuple[str, ...]] | None = None) -> list[PromptRow]:
        """Run processor and (frozen) encoder once; keep each prompt's ids and audio states. A family
        whose features are padded to the batch's longest clip encodes each clip on its own, so that a
        clip's states (and its transcript, and the cache's row) never depend on its batch-mates."""
        if len(waveforms) > 1 and not self.spec.batch_invariant_audio:
            ids, contexts = ids or [str(i) for i in range(len(waveforms))], contexts or [()] * len(waveforms)
            return [row for i in range(len(waveforms))
                    for row in self.encode_prompts([waveforms[i]], [languages[i]], [ids[i]], [contexts[i]])]
        prompts = self.prepare(waveforms, languages, ids, contexts)
        states = self.encode_audio(prompts)
        counts = self.audio_positions(prompts.input_ids).sum(-1).tolist()
        per_row = torch.split(states, counts, dim=0)
        return [PromptRow(ids[m.bool()], a) for ids, m, a in zip(prompts.input_ids, prompts.attention_mask, per_row)]

    def encode_batch(self, batch) -> list[PromptRow]:
        """Prompt rows for an `AudioBatch` (the loop's backend-independent entry point). While the
        encoder is frozen, rows come from `encoder_cache` and only missing ones are encoded (their
        waveforms are loaded and augmented only then)."""
        ids, contexts = [u.id for u in batch.utterances], batch.contexts
        if not self.encoder_frozen:
            return self.encode_prompts(batch.load(range(len(batch))), batch.languages, ids, contexts)
        keys = [(*k, self.force_language) for k in batch.cache_keys]
        rows = {k: self.encoder_cache.get(k) for k in dict.fromkeys(keys)}
        missing = {k: keys.index(k) for k, row in rows.items() if row is None}  # once per distinct key
        if missing:
            start = time.perf_counter()
            fresh = self.encode_prompts(batch.load(list(missing.values())),
                                        [batch.languages[i] for i in missing.values()],
                                        [ids[i] for i in missing.values()], [contexts[i] for i in missing.values()])
            for k, row in zip(missing, fresh):
                self.encoder_cache[k] = row
                rows[k] = self.encoder_cache.get(k, row)  # the kept copy; the fresh row past a tiny RAM bound
            self.encoder_seconds += time.perf_counter() - start
        return [_on(rows[k], self.device) for k in keys]

    def embed_rows(self, rows: list[PromptRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded `(B, P, H)` prompt embeddings and `(B, P)` mask for prompt rows; the projector
        runs here, with grad when trainable."""
        ids, mask = self.left_pad(rows)
        states = torch.cat([r.audio for r in rows], dim=0)
        return self._splice(ids, states), mask

    def target_ids(self, texts: list[str], languages: list[str | None]) -> Responses:
        """Reference transcripts as responses (the assistant turn + EOS), right-padded."""
        return self.pad_responses(self.codec.target_rows(texts, languages))

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: AudioPrompts, n: int = 1, **kwargs) -> Responses:
        """Sample `n` responses per utterance (or decode greedily / by beam search when `do_sample`
        is False). The audio is encoded once; the n copies share its prompt embeddings."""
        embeds = self.prompt_embeds(prompts, self.encode_audio(prompts))
        return self.generate_from_embeds(embeds, prompts.attention_mask, n, **kwargs)


def _on(row: PromptRow, device: torch.device) -> PromptRow:
    """`row` on `device` (the cache keeps rows in RAM; the same object when already there)."""
    if row.ids.device == device:
        return row
    return PromptRow(row.ids.to(device), None if row.audio is None else row.audio.to(device))


def _forbidden_token_ids(tokenizer, spec: AudioLLMSpec) -> set[int]:
    """PAD, `<|im_start|>`, `<|endoftext|>` and the family's audio tokens: never sampled, never scored."""
    vocab = tokenizer.get_vocab()  # looked up, not converted: an unknown name would map to <unk>
    names = ("<|im_start|>", "<|endoftext|>", *spec.tokenizer_spec().extra_special.values())
    return {tokenizer.pad_token_id} | {vocab[name] for name in names if name in vocab}

