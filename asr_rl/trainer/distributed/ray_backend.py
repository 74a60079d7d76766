"""The Ray backend: the roles the loop calls (trainer/driver/roles.py), placed on Ray actor groups.

A single controller (the driver running `RLTrainer`) shards each call across the policy's
data-parallel ranks by whole groups and gathers the results in order: encode and sample (rollout),
annotate (old/reference log-probs, values), train (each rank updates on its shard; DeepSpeed
all-reduces), and weight sync to the rollout engine. The reference model and the critic live in
the policy ranks (colocated, the default) or in groups of their own (`colocate_actor_ref=false`,
`colocate_critic=false`, `colocate_all=false`), which then work on the same shards at the same
time as the policy ranks. A rank that dies stops the run with an error naming it; the last
checkpoint stays intact.
"""
from __future__ import annotations

import logging
import math

import ray
import torch

from asr_rl.trainer.distributed.actor_group import ActorGroup, check_resources, free_port
from asr_rl.trainer.distributed.ray_workers import RayCriticWorker, RayPolicyWorker, RayReferenceWorker
from asr_rl.trainer.distributed.ray_utils import init_ray
from asr_rl.trainer.rollout.engines import samples_in_engine_actors
from asr_rl.trainer.rollout.experience import Experience

log = logging.getLogger("asr_rl.ray")


class RayBackend:
    def __init__(self, cfg, ctx, algo: str = "grpo", text: bool = False):
        self.cfg, self.text = cfg, text
        self.policy = self.ref = self.critic = self.engine = None
        init_ray(num_cpus=cfg.distributed.ray_num_cpus)
        try:
            self._start(cfg, ctx, text)
        except BaseException:
            self.shutdown()  # actors that did start would otherwise hold their CPU/GPU slots
            raise

    def _start(self, cfg, ctx, text: bool) -> None:
        d = cfg.distributed
        use_gpu = torch.cuda.is_available() and ctx.device == "cuda"
        needs_ref, needs_critic = cfg.algo.init_kl_coef > 0, cfg.algo.spec.needs_critic
        sizes = {"trainer": d.actor_num_nodes * d.actor_num_gpus_per_node}
        if needs_ref and d.separate_ref:
            sizes["reference"] = d.ref_num_nodes * d.ref_num_gpus_per_node
        if needs_critic and d.separate_critic:
            sizes["critic"] = d.critic_num_nodes * d.critic_num_gpus_per_node
        check_resources(sizes, use_gpu)
        self.policy = _dp_group("trainer", RayPolicyWorker, d.actor_num_nodes, d.actor_num_gpus_per_node, use_gpu, cfg)
        self.world_size = len(self.policy)
        self.ranks = self.policy.actors
        if "reference" in sizes:
            self.ref = ActorGroup("reference", RayReferenceWorker, sizes["reference"], use_gpu,
                                  lambda i, _: (i, cfg, ctx.device, text), cfg.output_dir, d.ref_num_nodes)
        if "critic" in sizes:
            self.critic = _dp_group("critic", RayCriticWorker, d.critic_num_nodes, d.critic_num_gpus_per_node, use_gpu,
                                    cfg, (cfg, ctx.device, text))
        # kept groups per step must split evenly over every group's ranks
        self.group_multiple = math.lcm(*(len(g) for g in (self.policy, self.ref, self.critic) if g))
        colocated = (needs_ref and self.ref is None, needs_critic and self.critic is None)
        info = self.policy.call_all("setup", cfg, ctx.device, *colocated, text)
        self.nodes = [i["node"] for i in info]
        self.pad_id = info[0]["pad_id"]
        self.eos_id = info[0]["eos_id"]
        from asr_rl.models.codec import ResponseCodec

        self.codec = ResponseCodec.from_pretrained(cfg.pretrain, cfg.model.force_language)  # tokenizer only
        self.engine, self.version = None, 0  # the weights version of trainer-rank sampling
        if samples_in_engine_actors(cfg):
            from asr_rl.trainer.distributed.ray_engines import EngineGroup

            self.engine = EngineGroup(cfg, self.ranks, text)
        if len(set(self.nodes)) > 1:
            log.info("policy ranks on %d Ray nodes", len(set(self.nodes)))
        log.info("Ray backend: %d policy ranks (ZeRO-%d)%s%s%s%s", self.world_size, d.zero_stage,
                 f", {len(self.ref)} reference rank(s)" if self.ref else "",
                 f", {len(self.critic)} critic rank(s)" if self.critic else "",
                 f", {d.vllm_num_engines} {cfg.rollout.engine} engine actor(s)" if self.engine else "",
                 ", asynchronous rollouts" if cfg.rollout.async_enable else "")

    def _all(self, method: str, args: list[tuple]) -> list:
        """Call `method` on every policy rank with its own args (ray_engines.py uses it too)."""
        return self.policy.call(method, args)

    def _shards(self, n_items: int) -> list[tuple[int, int]]:
        return self.policy.shards(n_items)

    # --- the roles (trainer/driver/roles.py) ------------------------------------------------
    def report_memory(self, longest, device: str, cache_bytes: int = 0) -> None:
        """Rank 0 logs its estimate: data-parallel ranks hold the same shares."""
        ray.get(self.ranks[0].report_memory.remote(longest, device, cache_bytes))

    def evaluate(self, manifest: str, eval_cfg, options=None) -> dict[str, float]:
        """Each rank decodes a shard of the eval set; the controller scores the union."""
        from asr_rl.data.manifest import scan_manifest
        from asr_rl.evaluation.metrics import score_set

        utts = scan_manifest(manifest, check_audio=False, options=options).utterances[: eval_cfg.eval_max_samples or None]
        parts = self._all("evaluate", [(utts[a:b], eval_cfg) for a, b in self._shards(len(utts))])
        m = score_set([r for part in parts for r in part])
        return {k: v for k, v in {"eval/cer": m.cer, "eval/wer": m.wer, "eval/keyword_recall": m.keyword_recall,
                                  "eval/language_accuracy": m.language_accuracy}.items() if v is not None}

    def encode(self, batch) -> list:
        shards = [(batch.select(range(a, b)),) for a, b in self._shards(len(batch))]
        return [row for part in self._all("encode", shards) for row in part]

    def submit(self, rows: list, n: int, seeds: list[int]):
        """Engine actors start sampling and this returns at once; policy ranks sample here."""
        if self.engine is not None:
            return self.engine.submit(self, rows, n, seeds)
        bounds = self._shards(len(rows))
        parts = self._all("sample", [(rows[a:b], n, seeds[a * n:b * n]) for a, b in bounds])
        return [g for part in parts for g in part], self.version

    def collect(self, handle) -> tuple[list, int]:
        if self.engine is not None:
            return self.engine.collect(handle), handle.version
        return handle

    def sample(self, rows: list, n: int, seeds: list[int]) -> list:
        return self.collect(self.submit(rows, n, seeds))[0]

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode_ids(torch.as_tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]

    def parse(self, text: str, language):
        return self.codec.parse(text, language)

    def target_ids(self, texts: list[str], languages: list) -> list[list[int]]:
        return self.codec.target_rows(texts, languages)

    def annotate(self, exp: Experience, need_old_logp: bool) -> None:
        """Old log-probs (+ colocated reference/critic) on the policy ranks; a separate reference
        or critic group works on the same experience at the same time."""
        calls = [(self.policy, "annotate", [(s, need_old_logp) for s in _split(exp, self.policy)])]
        calls += [(g, "annotate", [(s,) for s in _split(exp, g)]) for g in (self.ref, self.critic) if g]
        for parts in _run_together(calls):
            for key in ("old_logp", "ref_logp", "values"):
                if key in parts[0]:
                    setattr(exp, key, _cat_padded([p[key] for p in parts]))

    def train(self, exp: Experience, step: int, kl_coef: float) -> dict:
        separate_critic = self.critic is not None
        calls = [(self.policy, "train", [(s, step, kl_coef, separate_critic) for s in _split(exp, self.policy)])]
        if separate_critic:
            calls.append((self.critic, "train", [(s, step) for s in _split(exp, self.critic)]))
        metrics = {}
        for parts in _run_together(calls):
            metrics.update({k: sum(p[k] for p in parts) / len(parts) for k in parts[0]})  # mean over ranks
        return metrics

    def sync_weights(self, version: int) -> None:
        if self.engine is not None:
            self.engine.sync(self, version)
        self.version = version

    def prompt_embeds(self, rows: list) -> list:
        """Unpadded `(P_i, H)` prompt embeddings, computed by the policy ranks (shards of rows)."""
        parts = self._all("prompt_embeds", [(rows[a:b],) for a, b in self._shards(len(rows))])
        return [e for part in parts for e in part]

    # --- checkpoints ---------------------------------------------------------------------
    def save_model(self, path) -> None:
        self._all("save_model", [(str(path),)] * self.world_size)

    def save_engine_state(self, folder) -> None:
        for group in (self.policy, self.critic):
            if group is not None:
                group.call_all("save_engine_state", str(folder))

    def state_dict(self) -> dict:
        return {"backend": "ray", "world_size": self.world_size,
                "critic_world_size": len(self.critic) if self.critic else 0}

    def load_state_dict(self, state: dict, ckpt) -> None:
        mine = self.state_dict()
        for key, knob in (("world_size", "actor_num_gpus_per_node"), ("critic_world_size", "critic_num_gpus_per_node")):
            if state.get(key, 0) != mine[key]:
                raise ValueError(f"checkpoint {ckpt} was written with {key}={state.get(key, 0)}, this run has "
                                 f"{mine[key]}; resume with the same {knob} and colocation settings")
        for group in (self.policy, self.critic):
            if group is not None:
                group.call_all("load_engine_state", str(ckpt / "trainer_state"))

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        for group in (self.policy, self.ref, self.critic):
            if group is not None:
                group.kill()


def _dp_group(name: str, actor_cls, nodes: int, per_node: int, use_gpu: bool, cfg, extra: tuple = ()) -> ActorGroup:
    """A DeepSpeed data-parallel group: its members share one process group of their own."""
    size = nodes * per_node
    port = free_port()  # on the driver's host: where member 0 runs too unless the cluster spans hosts
    return ActorGroup(name, actor_cls, size, use_gpu, lambda i, addr: (i, size, addr, port, *extra), cfg.output_dir,
                      nodes)


def _split(exp: Experience, group: ActorGroup) -> list[Experience]:
    """Shard the experience by whole groups, in order, equally over `group`'s members."""
    if len(exp.groups) % len(group):
        raise ValueError(f"{len(exp.groups)} groups cannot be split evenly over the {len(group)} {group.name} ranks; "
                         "make rollout_batch_size a multiple of the number of ranks of every group")
    return [exp.subset_groups(range(a, b)) for a, b in group.shards(len(exp.groups))]


def _run_together(calls: list[tuple]) -> list[list]:
    """Start `(group, method, args)` calls on all their groups at once, then gather each."""
    refs = [(g, m, g.submit(m, a)) for g, m, a in calls]
    return [g.gather(r, m) for g, m, r in refs]


def _cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate `(n_i, T_i)` tensors along rows, right-padding to the longest T with zeros."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts], dim=0)
