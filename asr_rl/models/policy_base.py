"""What every policy shares, whatever feeds its prompt: a Hugging Face causal LM (or audio-LLM)
run from prompt embeddings.

The loop sees prompts only as `PromptRow`s and embeddings (`embed_rows`), so the same sampling,
scoring and saving serve the audio policy (prompt = text + projected audio) and the text policy
(prompt = tokens). Sampling and scoring share one distribution: both divide logits by the
sampling temperature and forbid the same tokens (PAD, `<|im_start|>`, audio tokens), because a
sampled audio placeholder breaks the model's placeholder check and a forbidden token's -inf would
poison the ratio.

Shared prompt (`shared_prefix`, on by default): the n responses of a prompt attend to one forward
of that prompt. Scoring runs each prompt once with its key/value cache and runs only the response
tokens against it: where the responses come in whole groups of equal size, they attend to the
cache's U rows in place (models/grouped_attention.py, no per-response copy); otherwise the cache
rows are gathered per response. Either way the prompt's gradient is the sum over its responses.
Sampling prefills each prompt once and repeats its cache for the n samples. Outputs and gradients
equal the repeated-prompt path (PrefixGrouper, arXiv:2506.05433), which `shared_prefix=False`
keeps as the reference.
"""
from __future__ import annotations

import copy
import fnmatch
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from asr_rl.models.codec import ResponseCodec
from asr_rl.models.head import MASKED_LOGIT, head_logprobs



@dataclass
class Responses:
    """Sampled or given transcripts for B * n sequences (row `b * n + j` is sample j of utterance b).

    Attributes:
        ids: `(B*n, T)` response token ids, right-padded with the pad id, EOS included when emitted.
        mask: `(B*n, T)` 1 for real response tokens (EOS included).
        texts: decoded responses (special tokens kept, EOS/pad removed).
        logp: `(B*n, T)` the sampler's log-prob of each token (0 at padding), when it was sampled
            with per-sequence seeds; None otherwise.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    texts: list[str]
    logp: torch.Tensor | None = None


@dataclass
class PromptRow:
    """One prompt, unpadded, ready to be embedded again without re-running the frozen encoder.

    Attributes:
        ids: `(P_i,)` prompt token ids (audio placeholders expanded).
        audio: `(L_i, d_audio)` audio-encoder states for this prompt's placeholders (None for text).
    """

    ids: torch.Tensor
    audio: torch.Tensor | None = None


class CausalPolicy(nn.Module):
    """Subclasses set `model`, `tokenizer`, `codec`, `forbidden_ids` and implement `body`,
    `encode_batch`, `embed_rows`, `default_frozen` and `save_extra`."""

    shared_prefix = True  # see the module docstring; `model.shared_prefix=false` is the reference path
    prefix_attention = "grouped"  # "gather": copy the prompt cache per response (today's path, kept to compare)

    def __init__(self, model: nn.Module, tokenizer, codec: ResponseCodec, forbidden_ids: set[int]):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.codec = codec
        self.eos_id = codec.eos_id
        self.pad_id = codec.pad_id
        self.forbidden_ids = sorted(i for i in forbidden_ids if i is not None and i != self.eos_id)

    def body(self) -> nn.Module:
        """The causal LM without its head, called with `inputs_embeds`."""
        raise NotImplementedError

    def default_frozen(self) -> tuple[str, ...]:
        return ()

    def llm_config(self):
        """The config of the causal LM `body()` + head form on their own (what vLLM serves)."""
        return copy.deepcopy(self.model.config.get_text_config())

    def save_extra(self, path: str | Path) -> None:
        """Save the processor/tokenizer beside the weights."""
        raise NotImplementedError

    def left_pad(self, rows: list[PromptRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded `(B, P)` ids and mask of prompt rows."""
        width = max(len(r.ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            ids[i, width - len(r.ids):] = r.ids
            mask[i, width - len(r.ids):] = 1
        return ids, mask

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ freezing
    def freeze(self, patterns: tuple[str, ...] | None = None) -> list[str]:
        """Freeze parameters whose names match any fnmatch pattern (default: `default_frozen()`).
        Returns the frozen names."""
        patterns = self.default_frozen() if patterns is None else patterns
        frozen = []
        for name, p in self.model.named_parameters():
            if any(fnmatch.fnmatch(name, pat) for pat in patterns):
                p.requires_grad_(False)
                frozen.append(name)
        return frozen

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ the KL reference
    def reference_copy(self, share_frozen: bool = True) -> "CausalPolicy":
        """A frozen copy of this policy as it is now, for the KL reference.

        Only what will train is copied: a frozen parameter never changes, so with `share_frozen`
        the reference holds the very same tensor (under LoRA the reference then owns only the
        adapters and the projector; the LLM's base weights are shared, as OpenRLHF's and TRL's
        LoRA references use the base weights). Modules the reference never runs
        (`_reference_skips`, e.g. a frozen audio tower whose states every row carries) are left
        out. `share_frozen=False` where an engine re-partitions the policy's own tensors (ZeRO-3).
        """
        memo: dict[int, object] = dict(self._reference_skips())
        if share_frozen:
            memo.update({id(p): p for p in self.model.parameters() if not p.requires_grad})
        return copy.deepcopy(self, memo).eval().requires_grad_(False)

    def _reference_skips(self) -> dict[int, object]:
        """`{id(obj): stand-in}`: what the reference copy replaces instead of copying."""
        return {}

    def pad_responses(self, rows: list[list[int]]) -> Responses:
        width = max(1, max(len(r) for r in rows))
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return Responses(ids.to(self.device), mask.to(self.device), self.decode_ids(ids, mask))

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_from_embeds(self, prompt_embeds: torch.Tensor, attention_mask: torch.Tensor, n: int = 1, *,
                             do_sample: bool = True, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                             max_new_tokens: int = 64, num_beams: int = 1, seeds: list[int] | None = None,
                             sampler: type | None = None) -> Responses:
        """`generate` from left-padded prompt embeddings `(B, P, H)`; rows b*n..b*n+n-1 of the result
        are the n samples of prompt b. With `seeds` (one per output row) sampling is
        placement-invariant (models/sampling.py), by `sampler` (default `SeededSampler`; the
        reference `SeededGumbelSampler` draws other tokens from the same distribution)."""
        kwargs = dict(do_sample=do_sample, max_new_tokens=max_new_tokens, num_return_sequences=n,
                      eos_token_id=self.eos_id, pad_token_id=self.pad_id, suppress_tokens=self.forbidden_ids)
        if do_sample and seeds is not None:
            from asr_rl.models.sampling import SeededSampler

            draw = (sampler or SeededSampler)(seeds, temperature=temperature, top_k=top_k, top_p=top_p)
            ids, logp = self._sample_loop(prompt_embeds, attention_mask, draw, max_new_tokens, n)
            out = self.responses_from_generated(ids)
            out.logp = logp.masked_fill(out.mask == 0, 0.0)
            return out
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
        else:
            kwargs.update(num_beams=max(num_beams, n), temperature=None, top_p=None, top_k=None)
        out = self.model.generate(inputs_embeds=prompt_embeds, attention_mask=attention_mask, **kwargs)
        return self.responses_from_generated(out)

    @torch.inference_mode()
    def _sample_loop(self, embeds: torch.Tensor, mask: torch.Tensor, sampler, max_new_tokens: int,
                     n: int = 1, compact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-by-token sampling with the KV cache, `(B, P, H)` prompts -> `(B*n, T)` new ids and
        their `(B*n, T)` sampling log-probs (rows b*n..b*n+n-1: prompt b).

        A plain loop over the model's forward: for RL rollouts it is ~20% faster than
        `generate` on CPU (no per-step processor/stopping-criteria machinery) and it is what the
        seeded sampler needs. Positions follow `generate`'s convention (arange over the padded
        prompt), so scoring with `logprobs` sees the same distribution. With `shared_prefix` each
        prompt is prefilled once; its n samples attend to its cache in place (`prefix_attention=
        "grouped"`) or to it repeated n times (`"gather"`).

        Finished sequences leave the batch: a row (a whole group with the grouped prompt, whose
        layout is per group) whose samples all ended is dropped from the cache, so one long
        response no longer keeps every finished one decoding padding to its end. Each row's draws
        depend only on its seed, the step and its own logits: the tokens are those of the full batch
        (`compact=False`, the reference, keeps every row to the end).
        """
        cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        forbidden = torch.as_tensor(self.forbidden_ids, dtype=torch.long, device=embeds.device)
        logits, cache, grouped, mask, positions = self._prefill(embeds, mask, n, cache_kw)
        N, unit = logits.shape[0], n if grouped is not None else 1  # rows leave the batch `unit` at a time
        tokens = torch.full((N, max_new_tokens), self.pad_id, dtype=torch.long, device=embeds.device)
        logps = torch.zeros(N, max_new_tokens, device=embeds.device)
        live = torch.arange(N, device=embeds.device)  # the rows still in the batch
        done = torch.zeros(N, dtype=torch.bool, device=embeds.device)
        for t in range(max_new_tokens):
            nxt, logp = sampler.draw(logits.float().index_fill(-1, forbidden, float("-inf")))
            nxt = nxt.masked_fill(done, self.pad_id)
            tokens[live, t], logps[live, t] = nxt, logp.masked_fill(done, 0.0)
            done |= nxt == self.eos_id
            if bool(done.all()):
                break
            finished = done.view(-1, unit).all(dim=1)
            if compact and bool(finished.any()):  # compact: keep the units with a sample still going
                units = (~finished).nonzero().squeeze(1)
                rows = (units[:, None] * unit + torch.arange(unit, device=units.device)).reshape(-1)
                live, done, nxt, mask, positions = live[rows], done[rows], nxt[rows], mask[rows], positions[rows]
                sampler.select(rows)
                if grouped is not None:
                    grouped.select(units)
                else:
                    cache.batch_select_indices(rows)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            if grouped is not None:
                logits = grouped(nxt, positions)
                continue
            out = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=1, **{cache_kw: cache})
            logits, cache = out.logits[:, -1], _cache_of(out)
        return tokens[:, :t + 1], logps[:, :t + 1]

    def _prefill(self, embeds: torch.Tensor, mask: torch.Tensor, n: int, cache_kw: str):
        """The prompts' forward: first logits `(B*n, V)`, the cache, the grouped decoder (or None),
        and the mask and positions per sample row."""
        if not self.shared_prefix:
            embeds, mask = embeds.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        # explicit positions: a model that derives them itself from ids it is not given (the
        # Qwen2.5-Omni thinker's 3-D rotary index) gets them wrong once decoding passes ids
        positions = torch.arange(embeds.shape[1], device=embeds.device).expand(embeds.shape[0], -1)
        out = self.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        logits, cache = out.logits[:, -1], _cache_of(out)
        grouped = self._grouped_decoder(cache, mask, n, cache_kw) if self.shared_prefix and n > 1 else None
        if self.shared_prefix and n > 1:
            if grouped is None:
                cache.batch_repeat_interleave(n)
            logits, mask = logits.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        return logits, cache, grouped, mask, positions

    def _grouped_decoder(self, prompt_cache, prompt_mask: torch.Tensor, n: int, cache_kw: str):
        """With `prefix_attention="grouped"`: a `GroupedDecoding` whose n samples of a prompt attend
        to its U-row prefill cache in place and to a cache of their own tokens only
        (models/grouped_attention.py), instead of the prefill cache repeated n times. None otherwise."""
        if self.prefix_attention != "grouped":
            return None
        from asr_rl.models.grouped_attention import GroupedDecoding

        return GroupedDecoding(self, prompt_cache, prompt_mask, n, cache_kw)

    def responses_from_generated(self, out: torch.Tensor) -> Responses:
        """Generated ids (new tokens only) -> Responses, masking everything after the first EOS."""
        is_eos = out == self.eos_id
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        mask = (~after_eos).long()
        ids = out.masked_fill(after_eos, self.pad_id)
        return Responses(ids, mask, self.decode_ids(ids, mask))

    def decode_ids(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return self.codec.decode_ids(ids, mask)

    def parse(self, text: str, language: str | None) -> tuple[str | None, str, bool]:
        """Response text -> (language name or None, transcript, well_formed)."""
        return self.codec.parse(text, language)

    # ------------------------------------------------------------------ scoring
    def response_hidden(self, prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor, responses: Responses,
                        prompt_index: torch.Tensor | None = None) -> torch.Tensor:
        """LLM hidden states `(N, T, H)` at the positions that predict each response token
        (teacher-forced).

        Args:
            prompt_embeds: `(U, P, H)` left-padded prompts.
            prompt_mask: `(U, P)`.
            responses: N responses, `ids`/`mask` `(N, T)`.
            prompt_index: `(N,)` the prompt row of each response; None: response i has prompt i.
        """
        N = responses.ids.shape[0]
        if prompt_index is None:
            prompt_index = torch.arange(N, device=prompt_embeds.device)
        prompt_index = prompt_index.to(prompt_embeds.device)
        if self.shared_prefix and prompt_embeds.shape[0] < N:
            return self._shared_prefix_hidden(prompt_embeds, prompt_mask, responses, prompt_index)
        prompt_embeds, prompt_mask = prompt_embeds[prompt_index], prompt_mask[prompt_index]
        resp_embeds = self.model.get_input_embeddings()(responses.ids)
        embeds = torch.cat([prompt_embeds, resp_embeds.to(prompt_embeds.dtype)], dim=1)
        mask = torch.cat([prompt_mask, responses.mask.to(prompt_mask.dtype)], dim=1)
        positions = torch.arange(embeds.shape[1], device=embeds.device).expand(N, -1)
        hidden = self.body()(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
        P, T = prompt_embeds.shape[1], responses.ids.shape[1]
        return hidden[:, P - 1: P - 1 + T]  # position P-1+t predicts response token t

    def _shared_prefix_hidden(self, prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor, responses: Responses,
                              prompt_index: torch.Tensor) -> torch.Tensor:
        """`response_hidden` with each of the U prompts forwarded once, then the responses' tokens
        but the last (position P-1+t predicts token t, and the prompt's last position predicts
        token 0) against its keys/values. Contiguous equal groups (`group_index`) attend to the
        U-row prompt cache in place (models/grouped_attention.py); otherwise, or with
        `prefix_attention="gather"`, the cache rows are gathered per response. Either way autograd
        sums the prompt's gradient over its responses."""
        from asr_rl.models import grouped_attention as ga

        (U, P, _), (N, T) = prompt_embeds.shape, responses.ids.shape
        body = self.body()
        positions = torch.arange(P + T, device=prompt_embeds.device)
        out = body(inputs_embeds=prompt_embeds, attention_mask=prompt_mask, position_ids=positions[:P].expand(U, -1),
                   use_cache=True)
        first = out.last_hidden_state[prompt_index, -1:]  # (N, 1, H): predicts response token 0
        if T == 1:
            return first
        cache = _cache_of(out)
        resp_embeds = self.model.get_input_embeddings()(responses.ids[:, :-1]).to(prompt_embeds.dtype)
        resp_positions = positions[P:P + T - 1].expand(N, -1)
        if self.prefix_attention == "grouped" and ga.can_group(prompt_index, U):
            state = ga.GroupedPrefix([layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                                     prompt_mask.bool(), responses.mask[:, :-1].bool())
            with ga.grouped_prefix(body, state):
                rest = body(inputs_embeds=resp_embeds, position_ids=resp_positions, use_cache=False).last_hidden_state
            return torch.cat([first, rest], dim=1)
        cache.batch_select_indices(prompt_index)
        mask = torch.cat([prompt_mask[prompt_index], responses.mask[:, :-1].to(prompt_mask.dtype)], dim=1)
        rest = body(inputs_embeds=resp_embeds, attention_mask=mask, position_ids=resp_positions,
                    past_key_values=cache, use_cache=True).last_hidden_state
        return torch.cat([first, rest], dim=1)

    def response_logits(self, prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor, responses: Responses,
                        prompt_index: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `(N, T, V)` that predict each response token, forbidden tokens masked; arguments
        as `response_hidden`. Only the response positions go through the LM head."""
        logits = self.model.lm_head(self.response_hidden(prompt_embeds, prompt_mask, responses, prompt_index)).float()
        return logits.index_fill(-1, torch.as_tensor(self.forbidden_ids, device=logits.device), MASKED_LOGIT)

    def logprobs(self, prompt_embeds: torch.Tensor, prompt_mask: torch.Tensor, responses: Responses,
                 prompt_index: torch.Tensor | None = None, temperature: float = 1.0, with_entropy: bool = False):
        """Per-token log-probabilities `(N, T)` of the responses (0 at padding), and optionally the
        per-token entropy `(N, T)` of the same (temperature-scaled) distribution; arguments as
        `response_hidden`."""
        hidden = self.response_hidden(prompt_embeds, prompt_mask, responses, prompt_index)
        forbidden = torch.as_tensor(self.forbidden_ids, dtype=torch.long, device=hidden.device)
        return head_logprobs(hidden, self.model.lm_head, responses.ids, responses.mask, forbidden, temperature,
                             with_entropy)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, path: str | Path) -> None:
        """A plain Hugging Face folder that transformers loads with no asr-rl code (LoRA merged)."""
        from asr_rl.models.lora import has_lora, merged_copy

        model = merged_copy(self.model) if has_lora(self.model) else self.model
        model.save_pretrained(path)
        self.save_extra(path)


def group_index(n_prompts: int, n: int, device=None) -> torch.Tensor:
    """`(n_prompts * n,)` the prompt row of each response when every prompt has n in a row."""
    return torch.arange(n_prompts, device=device).repeat_interleave(n)


def _cache_of(out):
    """The key/value cache a forward returned (`cache` in some audio-LLMs, else `past_key_values`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
