"""A group of Ray actors placed together (one placement-group bundle each), called as one.

The policy ranks, a separate reference group and a separate critic group are each an `ActorGroup`.
Calls go to every member with its own arguments and come back in member order; a member that dies
or raises stops the run with an error naming the group and the member.
"""
from __future__ import annotations

import socket

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class RankFailed(RuntimeError):
    """A policy rank or engine actor died or raised; the message names it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ActorGroup:
    def __init__(self, name: str, actor_cls, size: int, use_gpu: bool, init_args, output_dir: str, nodes: int = 1):
        """Place `size` actors of `actor_cls` on `nodes` nodes (size / nodes on each: one bundle per
        node, no two on one node, when `nodes` > 1; else packed); `init_args(i, master_addr)` gives
        member i's constructor arguments, `master_addr` being where member 0's node is reached."""
        self.name, self.output_dir = name, output_dir
        if size % nodes:
            raise ValueError(f"{name}: {size} members cannot be spread evenly over {nodes} nodes")
        per_node = size // nodes
        if nodes > 1:
            bundles, strategy, member_bundle = ([scaled(bundle_of(use_gpu), per_node)] * nodes, "STRICT_SPREAD",
                                                lambda i: i // per_node)
        else:
            bundles, strategy, member_bundle = [bundle_of(use_gpu)] * size, "PACK", lambda i: i
        self.pg = placement_group(bundles, strategy=strategy)
        try:
            ray.get(self.pg.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.pg)
            raise RankFailed(f"{name}: the Ray cluster could not place {size} member(s) on {nodes} node(s) of "
                             f"{bundles[0]} each within 120 s ({len(ray.nodes())} node(s) known): start more nodes "
                             "or ask for fewer (distributed.*_num_nodes)") from None
        addr = master_address(self.pg)
        self.actors = [actor_cls.options(
            num_cpus=1, num_gpus=1 if use_gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=member_bundle(i)),
        ).remote(*init_args(i, addr)) for i in range(size)]

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, method: str, args: list[tuple]) -> list:
        """Start `method` on every member with its own args; returns the object refs."""
        return [getattr(a, method).remote(*x) for a, x in zip(self.actors, args)]

    def gather(self, refs: list, method: str) -> list:
        """Results of `submit` in member order; a failure names the member."""
        member_of = {ref: i for i, ref in enumerate(refs)}
        results, failed, pending = {}, [], list(refs)
        while pending:
            # Results as they come: a dead member is reported at once, even while its peers are
            # still blocked in a collective that will never complete.
            ready, pending = ray.wait(pending, num_returns=1)
            i = member_of[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                raise RankFailed(f"{self.name} rank {i} died during `{method}` ({type(e).__name__}). The last "
                                 f"checkpoint in {self.output_dir} is intact; resume with resume=auto") from None
            except ray.exceptions.RayTaskError as e:
                failed.append((i, e))
        if failed:
            i, e = min(failed, key=lambda x: x[0])
            raise RankFailed(f"{self.name} rank {i} failed in `{method}`: {e.cause!r}") from e.cause
        return [results[i] for i in range(len(refs))]

    def call(self, method: str, args: list[tuple]) -> list:
        return self.gather(self.submit(method, args), method)

    def call_all(self, method: str, *args) -> list:
        """Every member with the same args."""
        return self.call(method, [args] * len(self.actors))

    def shards(self, n_items: int) -> list[tuple[int, int]]:
        """Contiguous, near-equal [start, end) ranges of `n_items` over the members."""
        base, extra = divmod(n_items, len(self.actors))
        bounds, start = [], 0
        for i in range(len(self.actors)):
            end = start + base + (i < extra)
            bounds.append((start, end))
            start = end
        return bounds

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)
        ray.util.remove_placement_group(self.pg)


def bundle_of(use_gpu: bool) -> dict:
    return {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}


def scaled(bundle: dict, n: int) -> dict:
    return {k: v * n for k, v in bundle.items()}


def master_address(pg) -> str:
    """Where the group's member 0 listens for its process group: its node's IP, or 127.0.0.1 when
    every bundle is on one host (Ray reports a non-loopback node IP; gloo between the processes of
    one machine is kept on loopback)."""
    node_of = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    hosts = {ips.get(node) for node in node_of.values()}
    return "127.0.0.1" if len(hosts) == 1 else ips[node_of[0]]


def check_resources(sizes: dict[str, int], use_gpu: bool) -> None:
    """Fail at once, before any actor starts, when the cluster cannot hold the groups (`sizes`:
    group name -> members), instead of after a placement timeout."""
    free = ray.available_resources()
    total = sum(sizes.values())
    need = {k: v * total for k, v in bundle_of(use_gpu).items()}
    short = {k: v for k, v in need.items() if free.get(k, 0) < v}
    if short:
        groups = ", ".join(f"{name} {n}" for name, n in sizes.items())
        have = {k: free.get(k, 0) for k in short}
        raise RankFailed(f"the actor groups ({groups}) need {short} but the Ray cluster has {have} free; give the "
                         "embedded cluster more CPU slots (distributed.ray_num_cpus=N: slots, the cores are shared), "
                         "use fewer ranks, or colocate the models (distributed.colocate_all=true)")
