"""`distributed.*`: the settings of the Ray + DeepSpeed backend (a plain config; it imports none of
ray, deepspeed or vllm, so that every RL config loads without them)."""
from __future__ import annotations

from dataclasses import dataclass

from asr_rl.settings import setting


@dataclass(frozen=True)
class DistributedConfig:
    """The Ray + DeepSpeed backend (`backend=ray`); OpenRLHF names.

    Attributes:
        actor_num_nodes: nodes for the policy ranks.
        actor_num_gpus_per_node: policy (DeepSpeed data-parallel) ranks per node; on a CPU machine
            each rank is a CPU process.
        zero_stage: DeepSpeed ZeRO stage 0-3.
        bf16: bf16 weights/compute in DeepSpeed.
        adam_offload: offload optimizer states to CPU (ZeRO >= 1).
        colocate_actor_ref: the reference model lives in the policy ranks; false: a group of its own
            (`ref_num_nodes` x `ref_num_gpus_per_node` inference ranks).
        colocate_critic: the critic (PPO with gae) lives in the policy ranks; false: a DeepSpeed
            data-parallel group of its own (`critic_num_nodes` x `critic_num_gpus_per_node`).
        colocate_all: policy, reference and critic share the policy ranks' processes; false gives the
            reference and the critic each a group of its own (as both flags above set to false).
        ref_num_nodes, ref_num_gpus_per_node: the separate reference group's size.
        critic_num_nodes, critic_num_gpus_per_node: the separate critic group's size.
        vllm_num_engines: vLLM rollout engines (rollout.engine=vllm).
        vllm_tensor_parallel_size: GPUs per vLLM engine.
        vllm_gpu_memory_utilization: share of GPU memory a vLLM engine may take.
        ray_num_cpus: CPUs of the embedded Ray cluster (null: all).
    """

    actor_num_nodes: int = setting(1, ge=1)
    actor_num_gpus_per_node: int = setting(2, ge=1)
    zero_stage: int = setting(2, ge=0, le=3)
    bf16: bool = False
    adam_offload: bool = False
    colocate_actor_ref: bool = True
    colocate_critic: bool = True
    colocate_all: bool = True
    ref_num_nodes: int = setting(1, ge=1)
    ref_num_gpus_per_node: int = setting(1, ge=1)
    critic_num_nodes: int = setting(1, ge=1)
    critic_num_gpus_per_node: int = setting(1, ge=1)
    vllm_num_engines: int = setting(1, ge=1)
    vllm_tensor_parallel_size: int = setting(1, ge=1)
    vllm_gpu_memory_utilization: float = setting(0.5, gt=0, le=1)
    ray_num_cpus: int | None = setting(None, ge=1)

    @property
    def separate_ref(self) -> bool:
        return not (self.colocate_all and self.colocate_actor_ref)

    @property
    def separate_critic(self) -> bool:
        return not (self.colocate_all and self.colocate_critic)


__all__ = ["DistributedConfig"]
