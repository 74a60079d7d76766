"""TRL-style reward functions: `reward.file=recipes/rewards/trl_style.py`.

Each function takes the transcripts (`completions`) and the manifest's columns as keyword lists
(`text` = references, `language`, `keywords`, `duration`, ...). Returning None for a sample means
"does not apply": the sample's reward is the weighted sum of the functions that apply to it.
"""


def keyword_exact(completions, keywords, **kwargs):
    """1 when every keyword appears, else 0; None when the utterance has no keywords."""
    return [None if not kws else float(all(k in c for k in kws)) for c, kws in zip(completions, keywords)]


def not_empty(completions, **kwargs):
    return [1.0 if c.strip() else -1.0 for c in completions]


reward_funcs = [keyword_exact, not_empty]
reward_weights = [1.0, 0.5]
