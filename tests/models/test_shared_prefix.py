"""One prompt forward per group (`model.shared_prefix`), checked against the repeated-prompt path on
every family's LLM: per-token log-probs, entropies and the gradient of every trainable parameter
(projector included, through the shared prompt), for groups with responses of different lengths,
prompts of different lengths and n = 1, 2, 8, with the responses attending to the U-row prompt cache
in place (`prefix_attention="grouped"`, no per-response copy: checked) and through the gathered copy;
and the rollout, whose samples decode against the prefill cache in place or repeated, and draw the
same tokens."""
from __future__ import annotations

import copy

import pytest
import torch

from asr_rl.data.batching import load_batch
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.policy_base import PromptRow, Responses, group_index
from asr_rl.models.sampling import SeededGumbelSampler
from tests.models.family_checks import FAMILIES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f"{f[0]}-{f[1]}")
def policy_and_rows(request, tiny_corpus, tmp_path_factory):
    from tests.models.family_checks import noisy_family_policy

    arch, size = request.param
    policy = noisy_family_policy(arch, size, tiny_corpus, tmp_path_factory.mktemp(arch), scale=0.2)
    utts = sorted(read_manifest(tiny_corpus / "train.jsonl"), key=lambda u: u.duration or 0)
    rows = policy.encode_batch(load_batch([utts[0], utts[-1], utts[3]]))  # prompts of different lengths
    return policy, rows


def _responses(policy, n_rows: int, n: int, seed: int) -> Responses:
    """Random allowed tokens, each response its own length (1..9), right-padded."""
    g = torch.Generator().manual_seed(seed)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    allowed = torch.as_tensor(sorted(set(range(vocab)) - set(policy.forbidden_ids) - {policy.pad_id}))
    lengths = torch.randint(1, 10, (n_rows * n,), generator=g)
    lengths[0] = 9
    rows = [allowed[torch.randint(len(allowed), (int(k),), generator=g)].tolist() for k in lengths]
    return policy.pad_responses(rows)


def _score(policy, rows, responses, index, shared: bool, positions: list | None = None, attention: str = "grouped"):
    """(log-probs, entropies, gradients); `positions` collects the positions each LLM forward ran."""
    policy.shared_prefix, policy.prefix_attention = shared, attention
    policy.zero_grad(set_to_none=True)
    embeds, mask = policy.embed_rows(rows)
    hook = policy.body().register_forward_hook(
        lambda m, args, kwargs, out: positions.append(kwargs["inputs_embeds"].shape[:2].numel()), with_kwargs=True
    ) if positions is not None else None
    logp, entropy = policy.logprobs(embeds, mask, responses, index, temperature=0.9, with_entropy=True)
    if hook is not None:
        hook.remove()
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)  # a loss that weighs every token differently
    ((logp * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.trainable_parameters()}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("attention", ["grouped", "gather"])
@pytest.mark.parametrize("n", [1, 2, 8])
def test_log_probs_and_gradients_equal_the_repeated_prompt_path(policy_and_rows, n, attention):
    policy, rows = policy_and_rows
    responses = _responses(policy, len(rows), n, seed=n)
    index = group_index(len(rows), n)
    policy.train()
    try:
        work = {False: [], True: []}
        ref_logp, ref_ent, ref_grads = _score(policy, rows, responses, index, False, work[False])
        logp, ent, grads = _score(policy, rows, responses, index, True, work[True], attention)
    finally:
        policy.shared_prefix, policy.prefix_attention = True, "grouped"
    if n > 1:  # each prompt ran once: the LLM saw fewer positions than with the prompt repeated
        P, T = policy.embed_rows(rows)[0].shape[1], responses.ids.shape[1]
        assert work == {False: [n * len(rows) * (P + T)], True: [len(rows) * P, n * len(rows) * (T - 1)]}
    assert (logp - ref_logp).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    assert any(g.abs().sum() > 0 for g in ref_grads.values())
    assert any("projector" in k or "multi_modal" in k or "audio" in k or "proj" in k for k in ref_grads)
    rel = {k: float((grads[k] - g).norm() / (g.norm() + 1e-12)) for k, g in ref_grads.items() if g.norm() > 0}
    bad = {k: v for k, v in rel.items() if v > 1e-5}
    assert not bad, bad


def test_groups_need_not_be_contiguous_nor_equal(policy_and_rows):
    """A micro-batch holds parts of groups: prompt rows used 3, 1 and 2 times, interleaved."""
    policy, rows = policy_and_rows
    index = torch.tensor([2, 0, 2, 1, 0, 2])
    responses = _responses(policy, 1, len(index), seed=7)
    policy.train()
    try:
        ref = _score(policy, rows, responses, index, shared=False)
        out = _score(policy, rows, responses, index, shared=True)
    finally:
        policy.shared_prefix = True
    assert (out[0] - ref[0]).abs().max() <= 1e-5
    assert all(float((out[2][k] - g).norm() / (g.norm() + 1e-12)) <= 1e-5 for k, g in ref[2].items())


@pytest.mark.parametrize("attention", ["grouped", "gather"])
def test_the_shared_prefill_draws_the_same_tokens(policy_and_rows, attention):
    policy, rows = policy_and_rows
    policy.eval()
    embeds, mask = policy.embed_rows(rows)
    n = 4
    seeds = list(range(100, 100 + len(rows) * n))
    outs = []
    for shared in (False, True):
        policy.shared_prefix, policy.prefix_attention = shared, attention
        sampler = SeededGumbelSampler(seeds, temperature=1.0, top_k=0, top_p=1.0)
        outs.append(policy._sample_loop(embeds, mask, sampler, 12, n))
    policy.shared_prefix, policy.prefix_attention = True, "grouped"
    assert torch.equal(outs[0][0], outs[1][0])
    assert (outs[0][1] - outs[1][1]).abs().max() <= 1e-5
    assert len({tuple(r.tolist()) for r in outs[1][0]}) > 1  # the draws differ between samples


def test_bf16_and_lora_stay_close_to_the_reference(policy_and_rows):
    """bf16: log-probs within 0.05 nats of the repeated-prompt path with the gathered prompt copy
    (bf16 keeps ~3 significant digits, and the two paths sum attention in a different order), and
    within twice the reference's own bf16 error with the grouped attention; LoRA: exact as in fp32."""
    from asr_rl.models.lora import add_lora

    policy, rows = policy_and_rows
    n = 4
    responses = _responses(policy, len(rows), n, seed=3)
    index = group_index(len(rows), n)
    half = copy.deepcopy(policy).to(torch.bfloat16)
    half_rows = [PromptRow(r.ids, None if r.audio is None else r.audio.to(torch.bfloat16)) for r in rows]
    out = [_score(half, half_rows, responses, index, shared, attention=a)[0]
           for shared, a in ((False, "grouped"), (True, "gather"), (True, "grouped"))]
    assert (out[0] - out[1]).abs().max() <= 0.05
    # the grouped attention sums in another order again (its scores in float32): its bf16 log-probs
    # are as far from the fp32 ones as the reference's bf16 ones are (measured 0.06-0.17 nats for
    # both; 0.05 apart from each other is within one bf16 step of logits of size 8-16)
    exact = _score(policy, rows, responses, index, False)[0]
    err = [float((o - exact).abs().max()) for o in out]
    assert err[2] <= 2 * err[0], err
    lora = copy.deepcopy(policy)
    add_lora(lora, 4, 8, ("q_proj", "v_proj"))
    lora.train()
    ref, got = (_score(lora, rows, responses, index, shared) for shared in (False, True))
    assert (got[0] - ref[0]).abs().max() <= 1e-5
    assert any("lora" in k for k in ref[2])
    assert all(float((got[2][k] - g).norm() / (g.norm() + 1e-12)) <= 1e-5 for k, g in ref[2].items())


def test_grouped_attention_makes_no_per_response_copy_of_the_prompt(policy_and_rows, monkeypatch):
    """Scoring and decoding: every layer's attention sees the prompt keys/values with U rows (one
    per group), never N, and the cache is never gathered nor repeated per response."""
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache

    from asr_rl.models import grouped_attention as ga

    policy, rows = policy_and_rows
    n = 4
    responses = _responses(policy, len(rows), n, seed=5)
    seen = []
    ga.register()
    inner = AttentionInterface._global_mapping[ga.NAME]

    def spy(module, query, key, value, *args, **kwargs):
        state = ga._ACTIVE.get()
        seen.append((module.layer_idx, state.keys[module.layer_idx].shape[0], state.values[module.layer_idx].shape[0],
                     query.shape[0], key.shape[2]))
        return inner(module, query, key, value, *args, **kwargs)

    def no_gather(*args, **kwargs):
        raise AssertionError("the prompt cache was gathered per response")

    monkeypatch.setitem(AttentionInterface._global_mapping, ga.NAME, spy)
    monkeypatch.setattr(Cache, "batch_select_indices", no_gather)
    monkeypatch.setattr(Cache, "batch_repeat_interleave", no_gather)
    policy.train()
    _score(policy, rows, responses, group_index(len(rows), n), shared=True)
    layers = policy.model.config.get_text_config().num_hidden_layers
    T = responses.ids.shape[1] - 1
    assert sorted(s[0] for s in seen) == list(range(layers))
    assert {s[1:] for s in seen} == {(len(rows), len(rows), len(rows) * n, T)}  # prompt: U rows; keys: own T
    seen.clear()  # decoding: each step's keys are the samples' own tokens so far, the prompt stays U rows
    policy.eval()
    sampler = SeededGumbelSampler(list(range(len(rows) * n)), temperature=1.0, top_k=0, top_p=1.0)
    ids, _ = policy._sample_loop(*policy.embed_rows(rows), sampler, 5, n)
    steps = len(seen) // layers  # a forward after each drawn token but a last one that ends all rows
    assert len(seen) == layers * steps and steps in (ids.shape[1] - 1, ids.shape[1]) and steps > 1
    assert {s[1:4] for s in seen} == {(len(rows), len(rows), len(rows) * n)}
    assert sorted({s[4] for s in seen}) == list(range(1, steps + 1))


@pytest.mark.parametrize("shared,attention", [(True, "grouped"), (True, "gather"), (False, "grouped")])
def test_finished_rows_leave_the_batch_and_the_draws_stay_the_same(policy_and_rows, shared, attention):
    """With only EOS and a few other tokens allowed, samples end at different steps: the compacting
    loop (finished rows, or whole groups with the grouped prompt, dropped from the cache) draws the
    same tokens with the same log-probs as the loop that keeps every row to the end."""
    policy, rows = policy_and_rows
    policy.eval()
    embeds, mask = policy.embed_rows(rows)
    n, vocab = 4, policy.model.get_output_embeddings().weight.shape[0]
    allowed = sorted(set(range(vocab)) - set(policy.forbidden_ids) - {policy.pad_id, policy.eos_id})[:6]
    forbidden = policy.forbidden_ids
    policy.forbidden_ids = sorted(set(range(vocab)) - set(allowed) - {policy.eos_id})
    policy.shared_prefix, policy.prefix_attention = shared, attention
    try:
        outs = [policy._sample_loop(embeds, mask, SeededGumbelSampler(list(range(7, 7 + len(rows) * n))), 30, n,
                                    compact=compact) for compact in (False, True)]
    finally:
        policy.forbidden_ids, policy.shared_prefix, policy.prefix_attention = forbidden, True, "grouped"
    (ids_full, logp_full), (ids, logp) = outs
    assert torch.equal(ids, ids_full)
    assert (logp - logp_full).abs().max() <= 1e-5
    ended = [int((r == policy.eos_id).nonzero()[0]) if (r == policy.eos_id).any() else None for r in ids]
    groups = [ended[g * n:(g + 1) * n] for g in range(len(rows))]
    early = [max(g) for g in groups if None not in g and max(g) < ids.shape[1] - 1]
    assert len(set(ended)) > 2 and early  # samples ended at different steps, a whole group before the last one
