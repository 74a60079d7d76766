"""Starting or joining Ray. Without `RAY_ADDRESS` an embedded local cluster is started (dashboard
off, explicit object store, token auth off: it only listens on this machine); with it, the driver
joins that cluster."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("asr_rl.ray")

# The toolkit's own variables that a worker process needs as the driver has them.
FORWARDED_ENV = ("ASR_RL_REWARD_TOKEN", "ASR_RL_CACHE")


def init_ray(num_cpus: int | None = None, object_store_mb: int = 512, address: str | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    # Every Ray worker process gets one torch thread: processes share the cores (1 thread each runs
    # 2-3x faster than 2 when several processes share 2 cores).
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "TOKENIZERS_PARALLELISM": "false"}
    env.update({k: os.environ[k] for k in FORWARDED_ENV if k in os.environ})
    runtime_env = {"env_vars": env}
    if address:
        log.info("joining Ray cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # embedded, loopback-only cluster
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    log.info("starting an embedded Ray cluster (%s CPUs)", num_cpus or "all")
    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
             object_store_memory=object_store_mb * 1024 * 1024, runtime_env=runtime_env,
             log_to_driver=True, configure_logging=False)


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
