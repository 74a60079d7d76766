"""The samples of one utterance, together: a reward term that reads a sample's group (`TermSpec.
needs_group`, e.g. `consensus`) is only right when it is handed whole groups. Every path that cuts a
batch (the Ray reward pool, the remote client) cuts it with `group_chunks`, between groups, never
inside one; for a term that scores each sample alone the cut changes nothing."""
from __future__ import annotations

import math
from collections import Counter

from asr_rl.data.languages import language_code
from asr_rl.rewards.base import Sample


def group_indices(samples: list[Sample]) -> dict[int, list[int]]:
    """group_id -> the indices of its samples, in order (groups need not be contiguous here)."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        out.setdefault(s.group_id, []).append(i)
    return out


def cut_points(group_ids: list[int]) -> list[int]:
    """The indices b (0 < b < n) where `group_ids[:b]` and `group_ids[b:]` share no group: the places a
    batch may be cut. [0, 0, 1, 1, 0] has none (group 0 comes back); [0, 0, 1, 2] has 2 and 3.

    >>> cut_points([0, 0, 1, 1, 2]), cut_points([0, 0, 1, 1, 0])
    ([2, 4], [])
    """
    last = {g: i for i, g in enumerate(group_ids)}
    points, reach = [], -1
    for b, g in enumerate(group_ids[:-1], start=1):
        reach = max(reach, last[g])
        if reach < b:
            points.append(b)
    return points


def group_chunks(group_ids: list[int], parts: int | None = None, size: int | None = None) -> list[tuple[int, int]]:
    """`(start, end)` slices covering the batch, each of whole groups: about `size` samples each
    (`parts`: about n / parts), each cut at the first cut point at or past the target, so a chunk
    may hold more (never a part of a group).

    >>> group_chunks([0, 0, 1, 1, 2, 2], parts=2), group_chunks([0, 0, 0, 1, 1, 1], size=2)
    ([(0, 4), (4, 6)], [(0, 3), (3, 6)])
    """
    n = len(group_ids)
    if n == 0:
        return []
    size = size or math.ceil(n / max(parts or 1, 1))
    out, start = [], 0
    for b in cut_points(group_ids):
        if b - start >= size:
            out.append((start, b))
            start = b
    out.append((start, n))
    return out


def group_languages(samples: list[Sample]) -> list[str | None]:
    """Each sample's language: its line's `language` where the manifest (or the deployment's log) gives
    one, else the majority of its group's predicted language tags (ties: the tag seen first), else None.

    >>> s = [Sample("a", None, predicted_language="Chinese"), Sample("b", None, predicted_language="English"),
    ...      Sample("c", None, predicted_language="Chinese"), Sample("d", None, "en", group_id=1)]
    >>> group_languages(s)
    ['zh', 'zh', 'zh', 'en']
    """
    votes: dict[int, str | None] = {}
    for gid, rows in group_indices(samples).items():
        tags = [language_code(samples[i].predicted_language) for i in rows if samples[i].predicted_language]
        votes[gid] = Counter(tags).most_common(1)[0][0] if tags else None
    return [s.language or votes[s.group_id] for s in samples]


__all__ = ["cut_points", "group_chunks", "group_indices", "group_languages"]
