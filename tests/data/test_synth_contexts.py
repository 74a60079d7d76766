"""Context lists in the synthetic corpus: own entities plus same-category distractors, some lines
without their own words, deterministic, and copies of each test set per list size."""
from __future__ import annotations

import json

import numpy as np

from asr_rl.data.manifest import read_manifest
from asr_rl.data.synth.contexts import categories, context_list, entities


def test_a_list_holds_the_line_s_entities_and_distractors_of_their_category():
    keywords = ["grace", "five five one two", "kitchen"]
    assert entities(keywords, "en") == [("name", "grace"), ("room", "kitchen")]  # numbers are not listed
    kept = omitted = 0
    for i in range(200):
        items = context_list(keywords, "en", 10, np.random.default_rng(i))
        assert len(items) == len(set(items)) == 10
        has = {"grace", "kitchen"} <= set(items)
        kept, omitted = kept + has, omitted + (not ({"grace", "kitchen"} & set(items)))
        others = [w for w in items if w not in ("grace", "kitchen")]
        # the distractors come from the entities' categories (names and rooms) before any other
        assert all(w in categories("en")["name"] + categories("en")["room"] for w in others)
    assert kept + omitted == 200 and 20 <= omitted <= 60  # OMIT_PROB = 0.2 of the lines leave them out
    big = context_list(["张伟"], "zh", 100, np.random.default_rng(0))
    assert len(big) == 100 and all(w in sum(categories("zh").values(), ()) for w in big)
    assert context_list(keywords, "en", 0, np.random.default_rng(0)) == []
    assert context_list(keywords, "en", 10, np.random.default_rng(3)) == context_list(keywords, "en", 10,
                                                                                    np.random.default_rng(3))


def test_synth_writes_lists_on_training_lines_and_a_test_set_copy_per_size(tmp_path):
    from asr_rl.data.synth import synthesize_corpus

    summary = synthesize_corpus(tmp_path / "c", langs=("en", "zh"), n_train=12, n_test=2, seed=3, workers=1,
                                progress=False, context_sizes=(0, 10, 100))
    assert {"test_clean", "test_clean_ctx10", "test_clean_ctx100", "dev_ctx100"} <= set(summary)
    train = read_manifest(summary["train"]["manifest"])
    assert {len(u.context) for u in train} <= {0, 10, 100} and any(u.context for u in train)
    plain = read_manifest(summary["test_clean"]["manifest"])
    for n in (10, 100):
        copy = read_manifest(summary[f"test_clean_ctx{n}"]["manifest"])
        assert [(u.audio, u.text) for u in copy] == [(u.audio, u.text) for u in plain]
        assert all(len(u.context) == n for u in copy)
    assert all(not u.context for u in plain)
    meta = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert meta["params"]["context_sizes"] == [0, 10, 100]
