from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from asr_rl.config import ConfigError, RunConfig, config_to_dict, load_config, parse_override, replace, save_config


@dataclass(frozen=True)
class _Rollout:
    n_samples_per_prompt: int = 4
    temperature: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Cfg(RunConfig):
    rollout: _Rollout = field(default_factory=_Rollout)
    terms: dict[str, float] = field(default_factory=lambda: {"cer": 1.0})


def test_defaults_come_from_the_dataclass():
    cfg = load_config(RunConfig)
    assert cfg.backend == "local" and cfg.seed == 42 and cfg.data.sample_rate == 16000


def test_yaml_then_overrides_later_wins(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 7\nrollout:\n  temperature: 0.5\n  n_samples_per_prompt: 8\nterms: {cer: 1.0, keyword: 0.3}\n")
    cfg = load_config(_Cfg, path, ["rollout.temperature=0.7", "max_steps=3", "stop=[a,b]"])
    assert cfg.seed == 7
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.n_samples_per_prompt == 8
    assert cfg.max_steps == 3
    assert cfg.rollout.stop == ("a", "b")
    assert cfg.terms == {"cer": 1.0, "keyword": 0.3}


def test_bare_leaf_name_resolves_to_its_unique_section():
    cfg = load_config(_Cfg, None, ["n_samples_per_prompt=16", "sample_rate=8000"])
    assert cfg.rollout.n_samples_per_prompt == 16
    assert cfg.data.sample_rate == 8000


def test_top_level_keys_of_the_design_always_work():
    over = ["pretrain=/m", "train_manifest=/t.jsonl", "prompt_data=/p.jsonl", "eval_manifest=/e.jsonl",
            "output_dir=/o", "max_steps=5", "save_steps=2", "seed=3", "backend=ray"]
    cfg = load_config(RunConfig, None, over)
    assert (cfg.pretrain, cfg.train_manifest, cfg.prompt_data, cfg.eval_manifest) == ("/m", "/t.jsonl", "/p.jsonl", "/e.jsonl")
    assert (cfg.output_dir, cfg.max_steps, cfg.save_steps, cfg.seed, cfg.backend) == ("/o", 5, 2, 3, "ray")


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key `n_sample_per_prompt`.*`n_samples_per_prompt`"):
        load_config(_Cfg, None, ["n_sample_per_prompt=4"])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*rollout.temprature.*rollout.temperature"):
        load_config(_Cfg, path)


@pytest.mark.parametrize("item, pattern", [
    ("max_steps=abc", r"`max_steps` expects an integer, got 'abc'"),
    ("max_steps=1.5", r"`max_steps` expects an integer"),
    ("backend=slurm", r"`backend` expects one of 'local', 'ray'"),
    ("rollout.temperature=hot", r"`rollout.temperature` expects a number"),
    ("data.shuffle=maybe", r"`data.shuffle` expects true/false"),
    ("rollout=3", r"`rollout` is a section"),
])
def test_wrong_type_is_an_error_naming_key_and_expected_type(item, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(_Cfg, None, [item])


def test_int_is_accepted_for_float_and_null_for_optional():
    cfg = load_config(_Cfg, None, ["rollout.temperature=1", "pretrain=null"])
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)
    # YAML 1.1 reads 1e-5 (no dot) as a string; a float field still takes it
    assert load_config(_Cfg, None, ["rollout.temperature=1e-5"]).rollout.temperature == 1e-5
    assert cfg.pretrain is None


def test_parse_override_forms():
    assert parse_override("a.b=1") == ("a.b", 1)
    assert parse_override("--max-steps=2") == ("max_steps", 2)
    assert parse_override("x=[1, 2]") == ("x", [1, 2])
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("novalue")


def test_config_is_frozen_and_replace_takes_dotted_keys():
    cfg = load_config(_Cfg)
    with pytest.raises(FrozenInstanceError):
        cfg.seed = 1
    new = replace(cfg, **{"rollout.temperature": 0.3, "seed": 9})
    assert new.rollout.temperature == 0.3 and new.seed == 9 and cfg.rollout.temperature == 1.0


def test_saved_config_loads_back_identically(tmp_path):
    cfg = load_config(_Cfg, None, ["rollout.stop=[x]", "terms={cer: 0.5}"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(_Cfg, tmp_path / "config.yaml")
    assert again == cfg
    assert config_to_dict(again)["rollout"]["stop"] == ["x"]


def test_missing_or_non_mapping_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RunConfig, tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(RunConfig, tmp_path / "list.yaml")


def test_colocation_flags_decide_which_models_get_their_own_group():
    from asr_rl.trainer.configs.rl import DistributedConfig, RLConfig

    assert not DistributedConfig().separate_ref and not DistributedConfig().separate_critic
    ref_only = DistributedConfig(colocate_actor_ref=False)
    assert ref_only.separate_ref and not ref_only.separate_critic
    critic_only = DistributedConfig(colocate_critic=False)
    assert critic_only.separate_critic and not critic_only.separate_ref
    both = DistributedConfig(colocate_all=False)
    assert both.separate_ref and both.separate_critic
    with pytest.raises(ValueError, match="`distributed.critic_num_gpus_per_node` must be >= 1, got 0"):
        load_config(RLConfig, None, ["distributed.critic_num_gpus_per_node=0"])


@pytest.mark.parametrize("override, message", [
    ("temperature=-1", "`temperature` (rollout.temperature) must be > 0 (sampling; greedy decoding is asr-rl eval), got -1"),
    ("rollout.top_p=1.5", "`rollout.top_p` must be > 0 and <= 1, got 1.5"),
    ("max_new_tokens=0", "`max_new_tokens` (rollout.max_new_tokens) must be >= 1, got 0"),
    ("actor_learning_rate=-1e-4", "`actor_learning_rate` (optim.actor_learning_rate) must be > 0, got -0.0001"),
    ("adam_betas=[0.9,1.2]", "must be >= 0 and < 1, got (0.9, 1.2)"),
    ("model.dtype=float16", "`model.dtype` expects one of 'float32', 'bfloat16', got 'float16'"),
])
def test_out_of_range_settings_fail_at_load_naming_key_value_and_range(override, message):
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, None, [override])
    assert str(e.value).startswith(f"command-line override '{override}': ") and message in str(e.value)


def test_a_bad_value_in_a_file_names_the_file(tmp_path):
    from asr_rl.trainer.configs.rl import SFTConfig

    (tmp_path / "c.yaml").write_text("optim:\n  learning_rate: 0\naugment:\n  noise_prob: 2\n")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'c.yaml'}: `optim.learning_rate` must be > 0, got 0"):
        load_config(SFTConfig, tmp_path / "c.yaml")


def test_every_ranged_setting_refuses_a_value_outside_its_range_and_takes_its_default():
    # the checks come from the fields' own declarations: every ranged leaf of every config is covered
    from asr_rl.config import _leaf_fields
    from asr_rl.trainer.configs.rl import RLConfig, SFTConfig
    from asr_rl.trainer.configs.preference import RMConfig

    checked = 0
    for cls in (RLConfig, SFTConfig, RMConfig):
        for path, (tp, valid) in _leaf_fields(cls).items():
            if valid is None:
                continue
            bad = (valid.gt if valid.gt is not None else valid.ge - 1) if (valid.gt, valid.ge) != (None, None) \
                else valid.lt + 1 if valid.lt is not None else valid.le + 1
            bad = [bad, bad] if "tuple" in str(tp) else int(bad) if "int" in str(tp) and "float" not in str(tp) else bad
            with pytest.raises(ConfigError, match=f"`{path}` must be"):
                load_config(cls, None, [f"{path}={bad}"])
            checked += 1
        load_config(cls)  # the defaults are all in range
    assert checked > 90


@dataclass(frozen=True)
class _Owner(RunConfig):
    rollout: _Rollout = field(default_factory=lambda: _Rollout(n_samples_per_prompt=8, temperature=0.7))


def test_a_section_set_in_part_keeps_the_defaults_its_owner_declares():
    assert load_config(_Owner, None, ["rollout.temperature=0.5"]).rollout == _Rollout(8, 0.5)
    assert load_config(_Owner).rollout == _Rollout(8, 0.7)


def test_every_trainer_reads_one_optim_section_with_its_own_defaults():
    from asr_rl.trainer.configs.rl import RLConfig, SFTConfig
    from asr_rl.trainer.configs.preference import DPOConfig
    from asr_rl.trainer.configs.preference import RMConfig

    def shared(o):
        return o.weight_decay, o.adam_betas, o.adam_eps, o.lr_warmup_ratio, o.lr_scheduler, o.min_lr_ratio, o.max_norm

    sft, dpo, rm, rl = (load_config(cls).optim for cls in (SFTConfig, DPOConfig, RMConfig, RLConfig))
    assert (sft.learning_rate, *shared(sft)) == (2e-3, 0.01, (0.9, 0.98), 1e-8, 0.05, "cosine_with_min_lr", 0.05, 1.0)
    assert (dpo.learning_rate, *shared(dpo)) == (5e-7, 0.0, (0.9, 0.95), 1e-8, 0.03, "cosine_with_min_lr", 0.1, 1.0)
    assert (rm.learning_rate, *shared(rm)) == (1e-3, 0.0, (0.9, 0.95), 1e-8, 0.05, "cosine_with_min_lr", 0.1, 1.0)
    assert (rl.actor_learning_rate, rl.critic_learning_rate, *shared(rl)) == (
        2e-4, 1e-3, 0.0, (0.9, 0.95), 1e-8, 0.05, "cosine_with_min_lr", 0.1, 1.0)
    # one key set keeps the trainer's other defaults; the flat OpenRLHF name still resolves
    sft = load_config(SFTConfig, None, ["learning_rate=1e-4"]).optim
    assert (sft.learning_rate, sft.weight_decay, sft.adam_betas, sft.min_lr_ratio) == (1e-4, 0.01, (0.9, 0.98), 0.05)
    with pytest.raises(ConfigError, match="did you mean `.*learning_rate`"):
        load_config(RLConfig, None, ["optim.learning_rat=1e-4"])


def test_cross_setting_errors_name_the_settings_the_user_set():
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises(ConfigError, match=r"rollout_batch_size x n_samples_per_prompt = 3 x 2 = 6 samples \(one "
                                          r"optimiser step per rollout: train_batch_size=0\) is not a multiple of "
                                          r"micro_train_batch_size 4"):
        load_config(RLConfig, None, ["rollout_batch_size=3", "n_samples_per_prompt=2", "micro_train_batch_size=4"])
    with pytest.raises(ConfigError, match="rollout_batch_size 3 is not a multiple of the 2 policy ranks"):
        load_config(RLConfig, None, ["backend=ray", "rollout_batch_size=3", "n_samples_per_prompt=2",
                                     "micro_train_batch_size=2"])


@pytest.mark.parametrize("overrides, message", [
    (["rollout.async_queue_size=1000"], r"`rollout.async_queue_size` must be >= 0 and <= 8 .*got 1000"),
    (["rollout.async_queue_size=4", "max_steps=2"],
     r"rollout.async_queue_size=4 would generate batches that max_steps=2 never trains on; use at most 1"),
])
def test_an_async_queue_longer_than_the_run_is_refused_at_load(overrides, message):
    from asr_rl.trainer.configs.rl import RLConfig

    base = ["backend=ray", "rollout.async_enable=true", "algo.rollout_correction=tis"]
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(RLConfig, None, base + overrides)
    assert load_config(RLConfig, None, base + ["rollout.async_queue_size=1", "max_steps=2"]).rollout.async_queue_size == 1


@pytest.mark.parametrize("overrides, message", [
    (["rollout.max_new_tokens=16", "algo.overlong_buffer_len=20"],
     r"algo.overlong_buffer_len=20 must be at most rollout.max_new_tokens=16"),
    (["rollout.dynamic_filtering=false", "rollout.dynamic_filtering_range=[0.1,0.9]"],
     r"rollout.dynamic_filtering_range=\[0.1, 0.9\] filters groups, and dynamic filtering is off"),
    (["advantage_estimator=reinforce", "rollout.dynamic_filtering_range=[0.1,0.9]"],
     r"dynamic filtering is off \(rollout.dynamic_filtering=false, or an estimator without groups\)"),
])
def test_settings_that_need_another_are_refused_at_load_not_ignored_or_found_after_loading(overrides, message):
    from asr_rl.trainer.configs.rl import RLConfig

    with pytest.raises(ConfigError, match=message):
        load_config(RLConfig, None, overrides)
    ok = load_config(RLConfig, None, ["rollout.max_new_tokens=16", "algo.overlong_buffer_len=16",
                                      "rollout.dynamic_filtering_range=[0.1,0.9]"])
    assert ok.algo.overlong_buffer_len == 16 and ok.dynamic_filtering
