"""Dev evaluation while a trainer runs (SFT, DPO/KTO, RL): a policy in memory scored on a manifest."""
from __future__ import annotations

from asr_rl.evaluation.evaluate import evaluate_manifest


def evaluate_during_training(policy, manifest: str, eval_cfg, options=None) -> dict[str, float]:
    """Decode the dev `manifest` with `policy` (its train/eval mode restored after) as `eval_cfg`
    (the `eval` section) says, read with the training set's reading `options` (data.format, columns);
    the `eval/*` metrics a trainer logs and early stopping watches."""
    was_training = policy.training
    m, _ = evaluate_manifest(policy, manifest, batch_size=eval_cfg.eval_batch_size, num_beams=eval_cfg.num_beams,
                             max_new_tokens=eval_cfg.eval_max_new_tokens, max_utterances=eval_cfg.eval_max_samples or None,
                             options=options)
    policy.train(was_training)
    out = {"eval/cer": m.cer}
    if m.wer is not None:
        out["eval/wer"] = m.wer
    if m.keyword_recall is not None:
        out["eval/keyword_recall"] = m.keyword_recall
    if m.language_accuracy is not None:
        out["eval/language_accuracy"] = m.language_accuracy
    return out
