"""An OpenRLHF-style reward file: `reward.file=recipes/rewards/openrlhf_style.py`.

asr-rl calls `reward_func(queries, prompts, labels, **kwargs)` with, for ASR:
  queries    the raw responses ("language English<asr_text>call anna")
  prompts    the utterance ids
  labels     the reference transcripts
  kwargs     hypotheses (transcripts), languages, keywords, durations, group_ids
Return a list/tensor of rewards, or {"rewards": ..., "scores": ..., "extra_logs": {...}}.
"""
import jiwer


def reward_func(queries, prompts, labels, hypotheses=None, **kwargs):
    hyps = hypotheses if hypotheses is not None else [q.split("<asr_text>")[-1] for q in queries]
    rewards, exact = [], []
    for hyp, ref in zip(hyps, labels):
        wer = jiwer.wer(ref, hyp) if hyp.strip() else 1.0
        rewards.append(max(-1.0, 1.0 - wer))
        exact.append(float(hyp.strip() == ref.strip()))
    return {"rewards": rewards, "scores": [max(0.0, r) for r in rewards], "extra_logs": {"exact_match": exact}}
