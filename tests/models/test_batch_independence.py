"""An utterance's encoding and transcript do not depend on what it is batched with (issue 47): on
every family, each utterance encoded alone and beside longer ones has the same number of audio
frames and the same states (fp32 noise), and `asr-rl eval` decodes the same at batch sizes 1 and 8."""
from __future__ import annotations

import pytest
import torch

from asr_rl.data.audio import load_audio
from asr_rl.data.manifest import read_manifest
from tests.models.family_checks import FAMILIES, noisy_family_policy

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f"{f[0]}-{f[1]}")
def policy(request, tiny_corpus, tmp_path_factory):
    arch, size = request.param
    return noisy_family_policy(arch, size, tiny_corpus, tmp_path_factory.mktemp(arch), scale=0.3).eval()


def test_alone_and_beside_longer_clips_an_utterance_gets_the_same_frames_and_states(policy, tiny_corpus):
    utts = sorted(read_manifest(tiny_corpus / "train.jsonl"), key=lambda u: u.duration or 0)
    waves = [load_audio(u.audio, policy.sample_rate) for u in utts]
    together = policy.encode_prompts(waves, [u.language for u in utts])
    for i, (u, w) in enumerate(zip(utts, waves)):
        (alone,) = policy.encode_prompts([w], [u.language])
        assert alone.audio.shape == together[i].audio.shape, (u.id, alone.audio.shape, together[i].audio.shape)
        assert torch.equal(alone.ids, together[i].ids)
        assert torch.allclose(alone.audio, together[i].audio, atol=1e-4), (u.id, (alone.audio - together[i].audio).abs().max())


def test_eval_decodes_the_same_at_batch_sizes_1_and_8(policy, tiny_corpus):
    from asr_rl.evaluation.evaluate import transcribe

    utts = list(read_manifest(tiny_corpus / "train.jsonl"))
    one = [r.hypothesis for r in transcribe(policy, utts, batch_size=1, max_new_tokens=12)]
    eight = [r.hypothesis for r in transcribe(policy, utts, batch_size=8, max_new_tokens=12)]
    assert one == eight
