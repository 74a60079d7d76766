"""A frozen encoder runs once per utterance and augmentation variant, and its cached states are
exactly what a fresh pass over the same (augmented) audio gives."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from asr_rl.data.batching import BatchLoader
from asr_rl.data.manifest import read_manifest
from asr_rl.models.audio_policy import AudioPolicy
from asr_rl.data.augment import AugmentConfig, VariantAugmenter
from asr_rl.config import ConfigError, load_config
from asr_rl.models.encoder_cache import EncoderCache, row_bytes
from asr_rl.models.policy_base import PromptRow


def count_encoder_rows(policy) -> list[int]:
    """Utterances the audio tower's first convolution sees, per call."""
    seen: list[int] = []
    tower = policy.spec.audio_tower(policy.model)
    first_conv = next(m for m in tower.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)))
    first_conv.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    return seen


def count_mel_convolutions(monkeypatch, mel_bins: int = 80) -> list[int]:
    """Utterances any Conv1d over `mel_bins` channels (Whisper's first layer) sees, per call, in
    every model this process builds from now on."""
    seen: list[int] = []
    forward = torch.nn.Conv1d.forward

    def counting(self, x):
        if self.in_channels == mel_bins:
            seen.append(x.shape[0])
        return forward(self, x)

    monkeypatch.setattr(torch.nn.Conv1d, "forward", counting)
    return seen


@pytest.fixture
def frozen(whisper_model):
    policy = AudioPolicy.from_pretrained(whisper_model)
    policy.freeze()
    return policy


def test_two_epochs_encode_each_utterance_variant_once(frozen, tiny_corpus):
    utts = read_manifest(tiny_corpus / "train.jsonl")
    seen = count_encoder_rows(frozen)
    augment = AugmentConfig(noise_prob=1.0, variants=2)
    loader = BatchLoader(utts, 4, seed=0, augmenter=VariantAugmenter(augment, seed=0))
    keys = set()
    for _ in range(3 * len(utts) // 4):  # three epochs
        batch = loader.next_batch()
        rows = frozen.encode_batch(batch)
        keys |= set(batch.cache_keys)
        assert len(rows) == 4 and all(r.audio.shape[1] == 384 for r in rows)
    assert sum(seen) == len(keys) == len(frozen.encoder_cache)  # one pass per (utterance, variant)
    assert len(keys) > len(utts)  # augmented variants were drawn and cached apart from the clean audio


def test_cached_states_equal_a_fresh_pass_over_the_same_augmented_audio(frozen, tiny_corpus):
    utts = read_manifest(tiny_corpus / "train.jsonl")[:4]
    augmenter = VariantAugmenter(AugmentConfig(noise_prob=1.0, reverb_prob=1.0, variants=3), seed=1)
    loader = BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter)
    batch = loader.next_batch()
    cached = frozen.encode_batch(batch)
    noisy = [i for i, v in enumerate(batch.variants) if v]
    assert noisy, batch.variants
    i = noisy[0]
    from asr_rl.data.audio import load_audio

    wav = augmenter.apply(load_audio(utts[i].audio), utts[i], batch.variants[i], 16000)
    (fresh,) = frozen.encode_prompts([wav], [utts[i].language])
    # equal up to float rounding: the cached pass ran in a batch padded to its longest utterance
    assert torch.allclose(fresh.audio, cached[i].audio, atol=1e-4) and torch.equal(fresh.ids, cached[i].ids)
    (clean,) = frozen.encode_prompts([load_audio(utts[i].audio)], [utts[i].language])
    assert not torch.allclose(clean.audio, cached[i].audio)  # the variant is not the clean audio


def test_an_encoder_that_trains_is_never_cached(whisper_model, tiny_corpus):
    policy = AudioPolicy.from_pretrained(whisper_model)  # nothing frozen
    seen = count_encoder_rows(policy)
    loader = BatchLoader(read_manifest(tiny_corpus / "train.jsonl"), 4, seed=0)
    batch = loader.next_batch()
    policy.encode_batch(batch)
    policy.encode_batch(batch)
    assert seen == [4, 4] and not policy.encoder_cache


def test_a_cache_folder_serves_the_next_run_and_another_encoder_keeps_it(frozen, whisper_model, tiny_corpus,
                                                                        tmp_path, caplog):
    utts = read_manifest(tiny_corpus / "train.jsonl")[:4]
    augmenter = VariantAugmenter(AugmentConfig(noise_prob=1.0, variants=1), seed=0)
    batch = BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter).next_batch()
    frozen.use_encoder_cache(tmp_path / "cache")  # rows are written to the folder as they are encoded
    first = frozen.encode_batch(batch)
    frozen.save_encoder_cache()

    again = AudioPolicy.from_pretrained(whisper_model)
    again.freeze()
    again.use_encoder_cache(tmp_path / "cache")
    seen = count_encoder_rows(again)
    rows = again.encode_batch(BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter).next_batch())
    assert seen == [] and all(torch.equal(a.audio, b.audio) and torch.equal(a.ids, b.ids) for a, b in zip(first, rows))

    other = AudioPolicy.from_pretrained(whisper_model)
    with torch.no_grad():
        other.spec.audio_tower(other.model).layer_norm.bias.add_(0.1)  # another encoder
    other.freeze()
    other.use_encoder_cache(tmp_path / "cache")  # an acoustic scorer's encoder, given the policy's folder
    assert len(other.encoder_cache) == 0 and "holds another encoder's" in caplog.text
    other.encode_batch(batch)
    other.save_encoder_cache()
    # ... beside the first one's rows, which the next run of the first encoder still reads, encoding nothing
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    assert sorted(meta["fingerprints"]) == sorted([frozen.encoder_cache.fingerprint, other.encoder_cache.fingerprint])
    third = AudioPolicy.from_pretrained(whisper_model)
    third.freeze()
    third.use_encoder_cache(tmp_path / "cache")
    seen = count_encoder_rows(third)
    rows = third.encode_batch(BatchLoader(utts, 4, seed=0, shuffle=False, augmenter=augmenter).next_batch())
    assert seen == [] and all(torch.equal(a.audio, b.audio) for a, b in zip(first, rows))
    # another augmenter's variants are other keys; the clean audio is shared
    tags = {k[1] for k in BatchLoader(utts, 4, seed=0, shuffle=False,
                                      augmenter=VariantAugmenter(AugmentConfig(noise_prob=0.5, variants=1),
                                                                 seed=0)).next_batch().cache_keys}
    assert tags - {"clean"} and not (tags - {"clean"}) & {k[1] for k in frozen.encoder_cache}


def load_sft_config(path, overrides):
    from asr_rl.trainer.configs.rl import SFTConfig

    return load_config(SFTConfig, path, overrides)


# --- the folder of shards -------------------------------------------------------------------------
def _rows(n: int, dtype=torch.float32, width: int = 8, seed: int = 0) -> dict[tuple, PromptRow]:
    g = torch.Generator().manual_seed(seed)
    return {(f"/a/{seed}_{i}.wav", "clean", False): PromptRow(torch.randint(0, 50_000, (5 + i,), generator=g),
                                                        torch.randn(3 + i, width, generator=g).to(dtype))
            for i in range(n)}


def _same(a: PromptRow, b: PromptRow) -> bool:
    return (a.ids.dtype == b.ids.dtype and a.audio.dtype == b.audio.dtype and torch.equal(a.ids, b.ids)
            and torch.equal(a.audio.view(torch.uint8), b.audio.view(torch.uint8)))  # bit-exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_round_trip_through_the_folder_bit_exactly(tmp_path, dtype):
    rows = _rows(6, dtype)
    cache = EncoderCache("fp", folder=tmp_path / "c")
    cache.update(rows)
    cache.close()
    again = EncoderCache("fp", folder=tmp_path / "c")
    assert len(again) == 6 and set(again) == set(rows) and again.ram_bytes == 0  # nothing decoded yet
    assert all(_same(again[k], row) for k, row in rows.items()) and again.disk_reads == 6


def test_shards_have_a_fixed_size_and_rows_past_one_shard_read_back(tmp_path):
    from asr_rl.models.cache_shards import ShardStore

    rows = _rows(10, width=64)
    store = ShardStore(tmp_path / "c", "fp", shard_bytes=4096)
    for k, row in rows.items():
        store.append(k, row)
    store.close()
    sizes = [p.stat().st_size for p in (tmp_path / "c").glob("*.bin")]
    assert len(sizes) > 2 and max(sizes) <= 4096
    reopened = ShardStore(tmp_path / "c", "fp")
    assert all(_same(reopened.read(k), row) for k, row in rows.items())


def test_a_torn_write_keeps_every_complete_row_and_is_cut_off(tmp_path, caplog):
    rows = _rows(4)
    cache = EncoderCache("fp", folder=tmp_path / "c")
    cache.update(rows)
    cache.close()
    (data,) = (tmp_path / "c").glob("*.bin")
    idx = data.with_suffix(".idx")
    complete = data.stat().st_size, idx.stat().st_size
    with open(data, "ab") as f:  # a killed writer: a row's data with no index line, then half a line
        f.write(b"\0" * 100)
    with open(idx, "ab") as f:
        f.write(b'{"key": ["/a/x.wav", "clean", false], "offset": ')
    again = EncoderCache("fp", folder=tmp_path / "c")
    assert set(again) == set(rows) and all(_same(again[k], r) for k, r in rows.items())
    assert (data.stat().st_size, idx.stat().st_size) == complete and "torn tail" in caplog.text
    # a line whose data was cut short (the data file truncated) is dropped with all after it
    with open(data, "r+b") as f:
        f.truncate(complete[0] - 10)
    again.close()
    third = EncoderCache("fp", folder=tmp_path / "c")
    assert len(third) == 3 and all(_same(third[k], rows[k]) for k in third)
    third[("/a/new.wav", "clean", False)] = next(iter(_rows(1, seed=9).values()))  # writes go on


def test_two_writers_on_one_folder_both_land_and_a_third_reader_sees_all(tmp_path):
    a, b = _rows(3, seed=1), _rows(3, seed=2)
    rank0, rank1 = EncoderCache("fp", folder=tmp_path / "c"), EncoderCache("fp", folder=tmp_path / "c")
    for (ka, ra), (kb, rb) in zip(a.items(), b.items()):  # interleaved, as two ranks write
        rank0[ka] = ra
        rank1[kb] = rb
    reader = EncoderCache("fp", folder=tmp_path / "c")  # while both are still open
    assert set(reader) == set(a) | set(b) and all(_same(reader[k], r) for k, r in {**a, **b}.items())
    assert len({p.name for p in (tmp_path / "c").glob("*.bin")}) == 2  # one file each


def test_ram_stays_under_its_bound_and_evicted_rows_come_back_from_disk(tmp_path):
    rows = _rows(40, width=32)
    bound = 3 * max(row_bytes(r) for r in rows.values())
    cache = EncoderCache("fp", max_bytes=bound, folder=tmp_path / "c")
    peak = 0
    for k, row in rows.items():
        cache[k] = row
        _ = cache[next(iter(rows))]  # keep touching the first row: LRU, not FIFO
        peak = max(peak, cache.ram_bytes)
    assert peak <= bound and cache.evictions > 30 and len(cache) == 40
    assert next(iter(rows)) in cache._ram  # the row used every time stayed
    reads = cache.disk_reads
    assert all(_same(cache[k], row) for k, row in rows.items()) and cache.disk_reads > reads
    assert cache.ram_bytes <= bound


def test_memory_only_with_a_tiny_bound_encodes_a_dropped_row_again_with_the_same_result(frozen, tiny_corpus):
    utts = read_manifest(tiny_corpus / "train.jsonl")[:4]
    frozen.use_encoder_cache(None, max_gib=1.5 * 384 * 4 * 60 / 2**30)  # about one utterance's states
    seen = count_encoder_rows(frozen)
    loader = BatchLoader(utts, 2, seed=0, shuffle=False)
    first = [frozen.encode_batch(loader.next_batch()) for _ in range(2)]
    second = [frozen.encode_batch(loader.next_batch()) for _ in range(2)]
    cache = frozen.encoder_cache
    assert cache.ram_bytes <= cache.max_bytes and cache.evictions > 0 and cache.store is None
    assert sum(seen) > 4  # evicted rows were encoded again
    for a, b in zip(sum(first, []), sum(second, [])):
        assert torch.equal(a.ids, b.ids) and torch.allclose(a.audio, b.audio, atol=1e-5)


def test_a_single_file_cache_of_earlier_versions_is_refused_naming_the_setting(tmp_path):
    (tmp_path / "encoder_cache.pt").write_bytes(b"old")
    with pytest.raises(ConfigError, match=r"model.encoder_cache=null"):
        EncoderCache("fp", folder=tmp_path / "encoder_cache.pt")


def test_the_disk_check_names_the_size_and_the_setting_that_turns_it_off(whisper_model, tiny_corpus, tmp_path,
                                                                         monkeypatch, caplog):
    import logging

    from asr_rl.models import cache_plan

    utts = read_manifest(tiny_corpus / "train.jsonl")
    cfg = load_sft_config(None, [f"model.encoder_cache={tmp_path / 'c'}", "augment.variants=2", "augment.noise_prob=1"])
    plan = cache_plan.plan_encoder_cache(whisper_model, cfg.model, utts, cfg.augment, 16000)
    # Whisper: 25 states a second of 384 floats, plus the text ids; 3 rows per utterance
    seconds = sum(u.duration for u in utts)
    assert plan.variants == 3 and 0.9 < plan.disk_bytes / (3 * seconds * 25 * (384 * 4 + 4)) < 1.3
    assert plan.ram_bytes == plan.disk_bytes  # far under the 4 GiB bound
    with caplog.at_level(logging.INFO, "asr_rl.train"):
        cache_plan.check_encoder_cache(plan)  # a real disk has the room
    assert f"encoder cache {tmp_path / 'c'}: about" in caplog.text
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(ConfigError) as err:
        cache_plan.check_encoder_cache(plan)
    msg = str(err.value)
    assert f"needs about {cache_plan.size(plan.disk_bytes)} more disk in {tmp_path / 'c'}" in msg
    assert "0.0 MiB free" in msg and "model.encoder_cache=null" in msg


def test_a_run_that_draws_fewer_rows_than_the_corpus_holds_plans_only_those(whisper_model, tiny_corpus, tmp_path):
    from asr_rl.models import cache_plan

    utts = read_manifest(tiny_corpus / "train.jsonl")  # 8 utterances x 3 rows
    cfg = load_sft_config(None, [f"model.encoder_cache={tmp_path / 'c'}", "augment.variants=2", "augment.noise_prob=1"])
    whole = cache_plan.plan_encoder_cache(whisper_model, cfg.model, utts, cfg.augment, 16000)
    short = cache_plan.plan_encoder_cache(whisper_model, cfg.model, utts, cfg.augment, 16000, draws=6)
    assert whole.rows == 24 and short.rows == 6 and short.disk_bytes == pytest.approx(whole.disk_bytes / 4, abs=1)
    assert "of which the run draws at most 6" in short.describe()
    assert cache_plan.plan_encoder_cache(whisper_model, cfg.model, utts, cfg.augment, 16000, draws=100).rows == 24
    # the dev rows evaluation writes are in the plan: one clean row each, as a pass over the same lines costs
    dev = read_manifest(tiny_corpus / "dev.jsonl")
    with_dev = cache_plan.prepare_encoder_cache(whisper_model, cfg.model, utts, cfg.augment, 16000,
                                                eval_manifest=str(tiny_corpus / "dev.jsonl"))
    clean = load_sft_config(None, [f"model.encoder_cache={tmp_path / 'c'}", "augment.noise_prob=0"])
    dev_alone = cache_plan.plan_encoder_cache(whisper_model, clean.model, dev, clean.augment, 16000)
    assert with_dev.disk_bytes == pytest.approx(whole.disk_bytes + dev_alone.disk_bytes, abs=16)  # int() of each
    assert f"and {len(dev)} evaluated" in with_dev.describe()


def test_sft_then_grpo_on_one_folder_runs_no_encoder_pass_for_what_sft_cached(whisper_model, tiny_corpus, tmp_path,
                                                                           monkeypatch):
    from asr_rl.trainer.recipes.rl import load_rl_config, run_audio_rl
    from asr_rl.trainer.recipes.sft import train_sft

    seen = count_mel_convolutions(monkeypatch)
    common = [f"pretrain={whisper_model}", f"train_manifest={tiny_corpus / 'train.jsonl'}", "save_steps=0",
              f"model.encoder_cache={tmp_path / 'cache'}", "augment.noise_prob=0", "eval_steps=0",
              "logging.progress_bar=false", "logging.tensorboard=false"]
    sft = train_sft(load_sft_config(None, [*common, f"output_dir={tmp_path / 'sft'}", "max_steps=2",
                                           "train_batch_size=8", "micro_train_batch_size=8"]))
    assert sum(seen) == 8 and len(list((tmp_path / "cache").glob("*.idx"))) == 1
    seen.clear()
    run_audio_rl(load_rl_config("grpo", None, [*common, f"pretrain={sft}", f"output_dir={tmp_path / 'rl'}",
                                               "max_steps=1", "rollout_batch_size=2", "n_samples_per_prompt=2",
                                               "max_new_tokens=4", "micro_train_batch_size=4",
                                               "rollout.dynamic_filtering=false"]))
    assert seen == []  # every utterance came from SFT's shards


def test_altered_states_or_a_garbage_offset_are_dropped_by_name_and_encoded_again(frozen, tiny_corpus, tmp_path,
                                                                                  caplog):
    """A cache folder whose rows were altered on disk: each damaged row is named (its shard), dropped
    and encoded again; the states the policy gets are a fresh pass's."""
    import numpy as np

    from asr_rl.data.batching import load_batch

    batch = load_batch(read_manifest(tiny_corpus / "train.jsonl")[:4])
    frozen.encoder_cache = EncoderCache("fp", folder=tmp_path / "c")
    fresh = frozen.encode_batch(batch)
    frozen.encoder_cache.close()
    (data,) = (tmp_path / "c").glob("*.bin")
    idx = data.with_suffix(".idx")
    lines = [json.loads(x) for x in idx.read_text().splitlines()]
    raw = bytearray(data.read_bytes())  # row 0: its states replaced by finite random numbers
    start = lines[0]["offset"] + 4 * lines[0]["ids"]
    end = lines[1]["offset"]
    raw[start:end] = np.random.default_rng(0).standard_normal((end - start) // 4).astype(np.float32).tobytes()
    data.write_bytes(bytes(raw))
    lines[2]["offset"] = 10 ** 9  # row 2: an edited offset, past the shard's end
    idx.write_text("".join(json.dumps(x) + "\n" for x in lines))
    frozen.encoder_cache = EncoderCache("fp", folder=tmp_path / "c")
    again = frozen.encode_batch(batch)
    # fresh states again (the re-encoded rows in a smaller batch: fp32 noise), never the altered ones
    assert all(torch.equal(a.ids, b.ids) and torch.allclose(a.audio, b.audio, atol=1e-4) for a, b in zip(again, fresh))
    damaged = [r.message for r in caplog.records if "is damaged" in r.message]
    assert len(damaged) == 1 and data.name in damaged[0] and "fail their checksum" in damaged[0]
    assert f"{idx.name} line(s) 3 point where no row is: skipped" in caplog.text
    assert "torn tail" not in caplog.text  # row 4, after the bad line, is kept: nothing is cut off
    frozen.encoder_cache.close()  # the two rows encoded again went to a shard of this process
    assert sum(len(p.read_text().splitlines()) for p in (tmp_path / "c").glob("*.idx")) == 4 + 2


def test_a_full_disk_names_the_cache_folder_and_the_setting(tmp_path, monkeypatch):
    import errno

    from asr_rl.models import cache_shards

    cache = EncoderCache("fp", folder=tmp_path / "c")

    def full(self, payload, line):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_shards._Writer, "write", full)  # the fault, injected from outside
    with pytest.raises(OSError, match=rf"encoder cache {tmp_path / 'c'}: no space left .*model.encoder_cache=null"):
        cache.update(_rows(1))
