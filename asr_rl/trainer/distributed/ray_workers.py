"""The Ray backend: the loop's workers interface over a group of `TrainerRank` actors.

A single controller (the driver running `RLTrainer`) shards each call across the data-parallel
ranks by whole groups and gathers the results in order: encode and sample (rollout), annotate
(old/reference log-probs, values), train (each rank updates on its shard; DeepSpeed all-reduces),
and weight sync to the rollout engine. A rank that dies stops the run with an error naming it;
the last checkpoint stays intact.
"""
from __future__ import annotations

import logging
import socket

import ray
import torch
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asr_rl.trainer.distributed.ray_actors import TrainerRank
from asr_rl.trainer.distributed.ray_utils import init_ray
from asr_rl.trainer.rollout import Experience

log = logging.getLogger("asr_rl.ray")


class RankFailed(RuntimeError):
    """A trainer rank or engine actor died or raised; the message names it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayWorkers:
    def __init__(self, cfg, ctx, algo: str = "grpo", text: bool = False):
        d = cfg.distributed
        self.cfg, self.text = cfg, text
        self.world_size = d.actor_num_nodes * d.actor_num_gpus_per_node
        init_ray(num_cpus=d.ray_num_cpus)
        use_gpu = torch.cuda.is_available() and ctx.device == "cuda"
        bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * self.world_size, strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        # Ranks of one group share a machine here: 127.0.0.1 (Ray reports a non-loopback node IP).
        addr = "127.0.0.1" if self.world_size <= d.actor_num_gpus_per_node else ray.util.get_node_ip_address()
        port = free_port()
        self.ranks = [TrainerRank.options(
            num_gpus=1 if use_gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
        ).remote(r, self.world_size, addr, port) for r in range(self.world_size)]
        with_critic = cfg.algo.advantage_estimator == "gae"
        info = self._all("setup", [(cfg, ctx.device, with_critic, text)] * self.world_size)
        self.pad_id = info[0]["pad_id"]
        from asr_rl.models.codec import ResponseCodec

        self.codec = ResponseCodec.from_pretrained(cfg.pretrain, cfg.model.force_language)  # tokenizer only
        self.engine = None
        if cfg.rollout.engine == "vllm":
            from asr_rl.trainer.distributed.vllm_actor import VLLMEngineGroup

            self.engine = VLLMEngineGroup(cfg, self.ranks, text)
        log.info("Ray backend: %d trainer ranks (ZeRO-%d)%s", self.world_size, d.zero_stage,
                 f", {d.vllm_num_engines} vLLM engine(s)" if self.engine else "")

    # --- plumbing ------------------------------------------------------------------------
    def _all(self, method: str, args: list[tuple]) -> list:
        """Call `method` on every rank with its own args; a failure names the rank."""
        refs = [getattr(r, method).remote(*a) for r, a in zip(self.ranks, args)]
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results, failed, pending = {}, [], list(refs)
        while pending:
            # Results as they come: a dead rank is reported at once, even while its peers are
            # still blocked in a collective that will never complete.
            ready, pending = ray.wait(pending, num_returns=1)
            rank = rank_of[ready[0]]
            try:
                results[rank] = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                raise RankFailed(f"trainer rank {rank} died during `{method}` ({type(e).__name__}). The last "
                                 f"checkpoint in {self.cfg.output_dir} is intact; resume with resume=auto") from None
            except ray.exceptions.RayTaskError as e:
                failed.append((rank, e))
        if failed:
            rank, e = min(failed, key=lambda x: x[0])
            raise RankFailed(f"trainer rank {rank} failed in `{method}`: {e.cause!r}") from e.cause
        return [results[r] for r in range(len(refs))]

    def _shards(self, n_items: int) -> list[tuple[int, int]]:
        """Contiguous, near-equal [start, end) ranges of `n_items` over the ranks."""
        base, extra = divmod(n_items, self.world_size)
        bounds, start = [], 0
        for r in range(self.world_size):
            end = start + base + (r < extra)
            bounds.append((start, end))
            start = end
        return bounds

    # --- the workers interface (see trainer/workers.py) ----------------------------------
    def evaluate(self, manifest: str, eval_cfg) -> dict[str, float]:
        """Each rank decodes a shard of the eval set; the controller scores the union."""
        from asr_rl.data.manifest import scan_manifest
        from asr_rl.evaluation.metrics import score_set

        utts = scan_manifest(manifest, check_audio=False).utterances[: eval_cfg.eval_max_samples or None]
        parts = self._all("evaluate", [(utts[a:b], eval_cfg) for a, b in self._shards(len(utts))])
        m = score_set([r for part in parts for r in part])
        return {k: v for k, v in {"eval/cer": m.cer, "eval/wer": m.wer, "eval/keyword_recall": m.keyword_recall,
                                  "eval/language_accuracy": m.language_accuracy}.items() if v is not None}

    def encode(self, batch) -> list:
        shards = [(batch.select(range(a, b)),) for a, b in self._shards(len(batch))]
        return [row for part in self._all("encode", shards) for row in part]

    def sample(self, rows: list, n: int, seeds: list[int]) -> list:
        if self.engine is not None:
            return self.engine.generate(self, rows, n, seeds)
        bounds = self._shards(len(rows))
        parts = self._all("sample", [(rows[a:b], n, seeds[a * n:b * n]) for a, b in bounds])
        return [g for part in parts for g in part]

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode_ids(torch.as_tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]

    def parse(self, text: str, language):
        return self.codec.parse(text, language)

    def _split(self, exp: Experience) -> list[Experience]:
        """Shard the experience by whole groups, in order."""
        if len(exp.groups) % self.world_size:
            raise ValueError(f"{len(exp.groups)} groups cannot be split evenly over {self.world_size} ranks; make "
                             "rollout_batch_size a multiple of the number of trainer ranks")
        return [exp.subset_groups(range(a, b)) for a, b in self._shards(len(exp.groups))]

    def annotate(self, exp: Experience, need_old_logp: bool) -> None:
        parts = self._all("annotate", [(s, need_old_logp) for s in self._split(exp)])
        for key in ("old_logp", "ref_logp", "values"):
            if key in parts[0]:
                setattr(exp, key, _cat_padded([p[key] for p in parts]))

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict:
        parts = self._all("train", [(s, step, kl_coef) for s in self._split(exp)])
        return {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}  # mean over ranks

    def sync_weights(self) -> None:
        if self.engine is not None:
            self.engine.sync(self)

    def prompt_embeds(self, rows: list) -> list:
        """Unpadded `(P_i, H)` prompt embeddings, computed by the trainer ranks (shards of rows)."""
        parts = self._all("prompt_embeds", [(rows[a:b],) for a, b in self._shards(len(rows))])
        return [e for part in parts for e in part]

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path) -> None:
        self._all("save_model", [(str(path),)] * self.world_size)

    def save_engine_state(self, folder) -> None:
        self._all("save_engine_state", [(str(folder),)] * self.world_size)

    def state_dict(self) -> dict:
        return {"backend": "ray", "world_size": self.world_size}

    def load_state_dict(self, state: dict, ckpt) -> None:
        if state.get("world_size") != self.world_size:
            raise ValueError(f"checkpoint {ckpt} was written by {state.get('world_size')} ranks, this run has "
                             f"{self.world_size}; resume with the same actor_num_gpus_per_node")
        self._all("load_engine_state", [(str(ckpt / "trainer_state"),)] * self.world_size)
        self.sync_weights()

    def digests(self) -> list[dict]:
        return self._all("state_digest", [()] * self.world_size)

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)
        if self.engine is not None:
            self.engine.shutdown()
        ray.util.remove_placement_group(self.pg)


def _cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate `(n_i, T_i)` tensors along rows, right-padding to the longest T with zeros."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts], dim=0)
