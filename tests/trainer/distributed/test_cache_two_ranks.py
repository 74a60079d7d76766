"""Two Ray ranks writing one encoder-cache folder (issue 47), end to end: each rank writes its own
shards, every row reads back whole (its checksum holds) and as a fresh encode, and the next run on
that folder encodes nothing."""
from __future__ import annotations

import json

import pytest
import torch

from asr_rl.data.audio import load_audio
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.models.cache_shards import ShardStore
from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
from asr_rl.trainer.run.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]




def test_two_ranks_fill_one_folder_that_the_next_run_reads_whole(local_ray, whisper_model, tiny_corpus, tmp_path):
    cache = tmp_path / "cache"
    common = [f"pretrain={whisper_model}", f"train_manifest={tiny_corpus / 'train.jsonl'}", f"model.encoder_cache={cache}",
              "backend=ray", "distributed.actor_num_gpus_per_node=2", "distributed.zero_stage=2", "save_steps=0",
              "eval_steps=0", "augment.noise_prob=0", "rollout_batch_size=4", "n_samples_per_prompt=2",
              "max_new_tokens=4", "micro_train_batch_size=4", "rollout.dynamic_filtering=false", "max_steps=2",
              "logging.progress_bar=false", "logging.tensorboard=false", "num_threads=1"]
    run_audio_rl(load_rl_config("grpo", None, [*common, f"output_dir={tmp_path / 'a'}"]))
    writers = {p.name.split("-")[2] for p in cache.glob("*.idx") if p.stat().st_size}  # the writer's pid
    assert len(writers) == 2  # both ranks wrote, each to its own shard
    (fingerprint,) = json.loads((cache / "meta.json").read_text())["fingerprints"]
    store = ShardStore(cache, fingerprint)
    policy = AudioPolicy.from_pretrained(whisper_model)
    policy.freeze()
    utts = {u.audio: u for u in read_manifest(tiny_corpus / "train.jsonl")}
    assert len(store.index) == len(utts)  # 2 steps x 4 utterances: each of the 8 once, none twice
    for key in list(store.index):
        row = store.read(key)  # raises (and drops the row) if its checksum fails
        u = utts[key[0]]
        (fresh,) = policy.encode_prompts([load_audio(u.audio, policy.sample_rate)], [u.language])
        assert torch.equal(row.ids, fresh.ids) and torch.allclose(row.audio, fresh.audio, atol=1e-4)
    store.close()
    run_audio_rl(load_rl_config("grpo", None, [*common, f"output_dir={tmp_path / 'b'}", "seed=7"]))
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [1, 2]
    # a row missing from the folder would have been encoded and appended: the folder holds the same 8
    assert sum(len(p.read_text().splitlines()) for p in cache.glob("*.idx")) == len(utts)
