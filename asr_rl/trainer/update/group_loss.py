"""The update's order of sequences for a grouped policy loss (`PolicyLossSpec.grouped`, e.g. `mwer`):
minibatches and micro-batches hold whole groups (the settings it needs are checked at load by
trainer/configs/group_loss.py)."""
from __future__ import annotations

import numpy as np


def epoch_order(n_rows: int, group_size: int, seed: int, epoch: int, shuffle: bool, whole_groups: bool) -> np.ndarray:
    """The order of the `n_rows` sequences in one epoch (rows b*g .. b*g+g-1 are group b): shuffled
    when `shuffle`; with `whole_groups` the groups are shuffled and each keeps its rows together, so
    that slices of a multiple of `group_size` rows hold whole groups."""
    rng = np.random.default_rng([seed, epoch])
    if not whole_groups:
        return rng.permutation(n_rows) if shuffle else np.arange(n_rows)
    if n_rows % group_size:
        raise ValueError(f"{n_rows} rows are not whole groups of {group_size}")
    groups = rng.permutation(n_rows // group_size) if shuffle else np.arange(n_rows // group_size)
    return (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)


__all__ = ["epoch_order"]
