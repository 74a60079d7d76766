"""Context lists for the synthetic corpus (contextual biasing): what a voice assistant would know.

A line's list holds its own entity keywords (the contact, room or device it names; numbers and
times are not entities a user lists) and distractors of the same category, shuffled, at a given
size. The distractors come from the grammar's own entities and from larger pools of names, rooms
and devices no sentence speaks, so a list of 100 is as long as a real contact book. With
probability `OMIT_PROB` the line's own entities are left out (the list is all distractors): a model
must not force a listed word on audio that does not hold it. Everything is drawn from a stream of
its own per (seed, split, line), so the lists are deterministic and independent of the audio's.
"""
from __future__ import annotations

import numpy as np

from asr_rl.data.synth import grammar_en, grammar_zh
from asr_rl.data.synth.sentence import utterance_rng

OMIT_PROB = 0.2
_EN_MORE_NAMES = (
    "aaron adam alan albert alice amber amy andrew angela arthur beth brian bruce carl carol chloe chris claire "
    "colin daniel diana dylan edward elena eric ethan fiona frank gavin george hugo ian irene isaac ivan jacob "
    "jason jenny joel julia karen kate leo liam linda logan lydia marcus martin megan nathan neil noah nora oscar "
    "paul pamela quinn rachel ralph rebecca robert rose ruby ryan sam sean simon stella steven susan theo tina "
    "victor violet walter wendy xavier yvonne zack").split()
_EN_MORE_ROOMS = ("attic", "laundry room", "study", "nursery", "porch", "pantry", "cellar", "den", "loft", "patio",
                  "sunroom", "workshop", "playroom", "gym", "library")
_EN_MORE_DEVICES = ("kettle", "toaster", "oven", "microwave", "fridge", "freezer", "vacuum", "printer", "router",
                    "projector", "doorbell", "sprinkler", "dryer", "purifier", "blender")
_ZH_SURNAMES, _ZH_GIVEN = "张王李刘陈杨赵黄周吴孙林徐高马朱胡郭何罗", "伟芳娜洋静明磊丽杰敏强晓军平刚勇艳霞秀英"
_ZH_MORE_ROOMS = ("主卧", "次卧", "客房", "衣帽间", "地下室", "洗衣房", "玄关", "走廊", "花园")
_ZH_MORE_DEVICES = ("冰箱", "微波炉", "烤箱", "电饭煲", "扫地机", "净化器", "投影仪", "门铃", "热水壶", "吹风机")


def categories(language: str) -> dict[str, tuple[str, ...]]:
    """Category -> every entity of that category: the spoken ones first, then the unspoken."""
    if language == "zh":
        names = tuple(dict.fromkeys((*grammar_zh.NAMES, *(s + g for s in _ZH_SURNAMES for g in _ZH_GIVEN))))
        return {"name": names, "room": (*grammar_zh.ROOMS, *_ZH_MORE_ROOMS),
                "device": (*grammar_zh.DEVICES, *_ZH_MORE_DEVICES)}
    return {"name": (*grammar_en.NAMES, *_EN_MORE_NAMES), "room": (*grammar_en.ROOMS, *_EN_MORE_ROOMS),
            "device": (*grammar_en.DEVICES, *_EN_MORE_DEVICES)}


def entities(keywords: list[str], language: str) -> list[tuple[str, str]]:
    """(category, word) of each keyword that is a listed entity, in order, without repeats."""
    cats = categories(language)
    found = [(cat, k) for k in keywords for cat, words in cats.items() if k in words]
    return list(dict.fromkeys(found))


def context_list(keywords: list[str], language: str, size: int, rng: np.random.Generator,
                 omit_prob: float = OMIT_PROB) -> list[str]:
    """A shuffled list of `size` items (fewer only if the pools run out): the line's entities (unless
    left out, with probability `omit_prob`) and distractors, first of the entities' categories."""
    if size <= 0:
        return []
    own = entities(keywords, language)
    keep = [w for _, w in own] if rng.random() >= omit_prob else []
    said = {w for _, w in own}
    cats = categories(language)
    first = [c for c in dict.fromkeys(c for c, _ in own)] or list(cats)
    order = first + [c for c in cats if c not in first]
    pool = [w for c in order for w in rng.permutation(np.array(cats[c], dtype=object)).tolist() if w not in said]
    items = keep + pool[:max(0, size - len(keep))]
    return [items[i] for i in rng.permutation(len(items))]



def add_contexts(rows: dict[str, list[dict]], sizes: list[int], seed: int) -> dict[str, list[dict]]:
    """The corpus's manifests with context lists: each training line gets a list of a size drawn
    from `sizes` (size 0: no `context` field, today's line); every other split stays as it is (size
    0) and gets a copy per size n > 0, `<split>_ctx<n>`, the same audio with lists of n items."""
    def with_list(row: dict, r: np.random.Generator, n: int) -> dict:
        items = context_list(row["keywords"], row["language"], n, r)
        return dict(row, context=items) if items else row

    out: dict[str, list[dict]] = {}
    for split, split_rows in rows.items():
        if split == "train":
            out[split] = [with_list(row, g, sizes[int(g.integers(len(sizes)))])
                          for i, row in enumerate(split_rows) for g in [utterance_rng(seed, f"{split}/context", i)]]
            continue
        out[split] = split_rows
        for n in sizes:
            if n > 0:
                name = f"{split}_ctx{n}"
                out[name] = [with_list(row, utterance_rng(seed, f"{name}/context", i), n)
                             for i, row in enumerate(split_rows)]
    return out


__all__ = ["OMIT_PROB", "add_contexts", "categories", "context_list", "entities"]
