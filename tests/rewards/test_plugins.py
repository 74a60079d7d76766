"""User reward files: both plug-in signatures, the shipped examples, and every fault."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from asr_rl.rewards.base import RewardError, Sample
from asr_rl.rewards.pipeline import load_reward_spec
from asr_rl.rewards.plugins import load_reward_file

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "rewards"
SAMPLES = [Sample("call ana", "call anna", "en", ("anna",), prompt="u1", response="language English<asr_text>call ana"),
           Sample("打开客厅的灯", "打开客厅的灯", "zh", ("客厅",), prompt="u2", response="language Chinese<asr_text>打开客厅的灯",
                  metadata={"speaker": "s1"})]


def _file(tmp_path, body: str) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return path


def test_openrlhf_reward_func_gets_queries_prompts_labels_and_asr_kwargs(tmp_path):
    path = _file(tmp_path, (
        "def reward_func(queries, prompts, labels, hypotheses=None, languages=None, **kw):\n"
        "    assert queries[0].startswith('language English<asr_text>') and prompts == ['u1', 'u2']\n"
        "    return {'rewards': [float(h == l) for h, l in zip(hypotheses, labels)], 'extra_logs': {'n': [1, 3]}}\n"))
    out = load_reward_file(path)(SAMPLES)
    assert out.rewards == [0.0, 1.0] and out.extra_logs == {"n": 2.0}


def test_openrlhf_documented_signature_without_kwargs_and_trl_functions_naming_their_columns(tmp_path):
    # OpenRLHF's docs: `def reward_func(queries, prompts, labels):`, no **kwargs
    path = _file(tmp_path, "def reward_func(queries, prompts, labels):\n"
                           "    return [float(q.endswith(l)) for q, l in zip(queries, labels)]\n")
    assert load_reward_file(path)(SAMPLES).rewards == [0.0, 1.0]
    # a TRL function that names only the columns it reads
    path = _file(tmp_path, "def exact(completions, references):\n"
                           "    return [float(c == r) for c, r in zip(completions, references)]\n")
    assert load_reward_file(path)(SAMPLES).rewards == [0.0, 1.0]
    # one that asks for a column no sample has still fails, naming the reward and the cause
    path = _file(tmp_path, "def needs(completions, solution):\n    return [0.0] * len(completions)\n")
    with pytest.raises(RewardError, match=r"reward 'my_reward.py:needs' raised TypeError.*solution"):
        load_reward_file(path)(SAMPLES)


def test_openrlhf_reward_func_may_return_a_tensor(tmp_path):
    path = _file(tmp_path, "import torch\n\ndef reward_func(queries, prompts, labels, **kw):\n"
                           "    return torch.tensor([0.25, -1.0])\n")
    assert load_reward_file(path)(SAMPLES).rewards == [0.25, -1.0]


def test_shipped_openrlhf_example():
    reward = load_reward_spec(str(RECIPES / "openrlhf_style.py"))
    out = reward(SAMPLES)
    # "call ana" vs "call anna": WER 1/2 -> 0.5; zh hypothesis equals its reference -> 1
    assert out.rewards == [0.5, 1.0] and out.extra_logs == {"exact_match": 0.5}


def test_trl_style_functions_with_weights_and_none(tmp_path):
    reward = load_reward_file(RECIPES / "trl_style.py")
    out = reward(SAMPLES + [Sample("", "hello", "en", ())])
    # keyword_exact: "anna" not in "call ana" -> 0; 客厅 in -> 1; no keywords -> None (skipped)
    # not_empty: 1, 1, -1 (weight 0.5)
    assert out.rewards == [0.5, 1.5, -0.5]
    assert out.terms["keyword_exact"] == [0.0, 1.0, None]


def test_single_completions_function_is_found(tmp_path):
    path = _file(tmp_path, "def length_bonus(completions, text, speaker=None, **kw):\n"
                           "    return [len(c) / len(t) for c, t in zip(completions, text)]\n")
    assert load_reward_file(path)(SAMPLES) == load_reward_file(path)(SAMPLES)
    assert load_reward_file(path)(SAMPLES).rewards == [pytest.approx(8 / 9), 1.0]


def test_builtin_spec():
    out = load_reward_spec("builtin:asr")(SAMPLES)
    assert set(out.terms) == {"cer", "keyword", "language", "fluency"}
    assert load_reward_spec("builtin:cer")(SAMPLES).rewards == [pytest.approx(8 / 9), 1.0]


@pytest.mark.parametrize("body, error, message", [
    (None, FileNotFoundError, "my_reward.py does not exist"),
    ("def reward_func(q, p, l):\n    return [1.0 for _ in q\n", ValueError, "syntax error at line"),
    ("import no_such_module_xyz\n", ValueError, "failed to import: ModuleNotFoundError"),
    ("def helper(x):\n    return x\n", ValueError, "defines no recognised reward.*functions found: helper"),
])
def test_bad_reward_files_fail_at_load(tmp_path, body, error, message):
    path = tmp_path / "my_reward.py" if body is None else _file(tmp_path, body)
    with pytest.raises(error, match=message):
        load_reward_file(path)


@pytest.mark.parametrize("returns, message", [
    ("raise ZeroDivisionError('boom')", r"'my_reward.py:reward_func' raised ZeroDivisionError on samples 0-1: boom"),
    ("return [1.0]", r"returned 1 rewards for 2 samples"),
    ("return [1.0, float('nan')]", r"returned nan for sample 1"),
    ("return 'good'", r"returned str, expected a list of numbers"),
    ("return [1.0, 'x']", r"returned 'x' \(str\) for sample 1"),
    ("return {'scores': [1, 1]}", r"returned a dict without 'rewards'"),
])
def test_faults_at_call_name_the_reward_sample_and_cause(tmp_path, returns, message):
    reward = load_reward_file(_file(tmp_path, f"def reward_func(queries, prompts, labels, **kw):\n    {returns}\n"))
    with pytest.raises(RewardError, match=message):
        reward(SAMPLES)


def test_trl_function_that_applies_to_no_sample_is_an_error(tmp_path):
    reward = load_reward_file(_file(tmp_path, "def never(completions, **kw):\n    return [None] * len(completions)\n"))
    with pytest.raises(RewardError, match="no function applies to sample 0"):
        reward(SAMPLES)


def test_builtin_spec_takes_weights_per_term():
    # weighted sum: sample 1 has CER 1/9 and misses its keyword, sample 2 is exact
    out = load_reward_spec("builtin:cer=2,keyword=0.5")(SAMPLES)
    assert out.rewards == [pytest.approx(2 * 8 / 9), pytest.approx(2.5)]
    with pytest.raises(ValueError, match="weight of term 'keyword' is not a number: 'x'"):
        load_reward_spec("builtin:cer,keyword=x")


def test_a_reward_file_that_blocks_stops_the_step_naming_reward_and_utterances(tmp_path):
    import time

    from asr_rl.rewards.pipeline import make_reward
    from asr_rl.rewards.config import RewardConfig

    path = _file(tmp_path, "import time\ndef reward_func(queries, prompts, labels):\n    time.sleep(60)\n")
    reward = make_reward(RewardConfig(file=str(path), timeout=0.5))
    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"reward 'my_reward.py.*' did not return within reward.timeout=0.5 s "
                                          r"for 2 samples \(utterances u1, u2\)"):
        reward(SAMPLES)
    assert time.perf_counter() - start < 5
    # a reward within its time, and one that raises, behave as without the limit
    fast = make_reward(RewardConfig(file=str(_file(tmp_path, "def reward_func(queries, prompts, labels):\n"
                                                              "    return [1.0] * len(queries)\n")), timeout=5))
    assert fast(SAMPLES).rewards == [1.0, 1.0]
    bad = make_reward(RewardConfig(file=str(_file(tmp_path, "def reward_func(queries, prompts, labels):\n"
                                                             "    raise KeyError('x')\n")), timeout=5))
    with pytest.raises(RewardError, match="KeyError"):
        bad(SAMPLES)


@pytest.mark.parametrize("override, message", [
    (["reward.remote_timeout=5"], "reward.remote_timeout does not apply to a reward given by reward.terms"),
    (["reward.timeout=5", "reward.remote_url=http://127.0.0.1:1"], "reward.timeout does not apply to a reward given by "
                                                            "reward.remote_url (a remote reward's time limit is"),
    (["reward.file=f.py", "reward.terms={wer: 1.0}"], "reward.terms does not apply to a reward given by reward.file"),
    (["reward.terms=null"], "reward.terms is empty"),
])
def test_reward_settings_that_do_not_apply_are_refused(override, message):
    from asr_rl.config import ConfigError, load_config
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
        load_config(RLConfig, None, override)
    # a config file's terms are cleared for a remote reward
    cfg = load_config(RLConfig, None, ["reward.terms={cer: 1.0, keyword: 0.3}", "reward.remote_url=http://127.0.0.1:1",
                                       "reward.terms=null"])
    assert cfg.reward.terms is None


def test_a_trl_function_reads_the_context_column_and_openrlhf_s_reward_func_gets_contexts(tmp_path):
    samples = [Sample("call grace", "call grace", "en", context=("grace", "ben")), Sample("call mom", "call mom", "en")]
    path = _file(tmp_path, "def listed(completions, context):\n"
                           "    return [float(any(w in c for w in ctx)) if ctx else None\n"
                           "            for c, ctx in zip(completions, context)]\n"
                           "def plain(completions):\n    return [0.5] * len(completions)\n"
                           "reward_funcs = [listed, plain]\n")
    assert load_reward_file(path)(samples).rewards == [1.5, 0.5]
    path = _file(tmp_path, "def reward_func(queries, prompts, labels, contexts):\n"
                           "    return [float(len(c)) for c in contexts]\n")
    assert load_reward_file(path)(samples).rewards == [2.0, 0.0]


@pytest.mark.parametrize("source, message", [
    ("def reward_func(queries, prompts, labels:\n    return [0.0]\n", r"has a syntax error at line 1"),
    ("import no_such_module_here\n", r"failed to import: ModuleNotFoundError"),
    ("def reward_func(queries):\n    return [0.0] * len(queries)\n",
     r"reward_func\(queries\) cannot be called as reward_func\(queries, prompts, labels, \*\*kwargs\)"),
    ("def f(completions, *, solution):\n    return [0.0]\nreward_funcs = [f, 3]\n", r"reward_funcs holds 3"),
    ("def helper(x):\n    return x\n", r"defines no recognised reward"),
])
def test_a_broken_reward_file_is_refused_at_config_load_before_any_model(tmp_path, capsys, source, message):
    from asr_rl.cli import main

    path = _file(tmp_path, source)
    out = tmp_path / "run"
    # the model folder does not exist either: the reward file's error must come first, at config load
    assert main(["train", "grpo", f"output_dir={out}", f"pretrain={tmp_path / 'no_model'}",
                 f"reward.file={path}"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and f"reward.file: reward file {path}" in err
    assert "no_model" not in err and "Traceback" not in err and not out.exists()
