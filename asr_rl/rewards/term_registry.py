"""The reward-term registry: each term is a function from a batch of `Sample`s to one score per
sample, registered by name with a `TermSpec` saying what it reads (the reference, the audio, the
other samples of its group), so that every path that calls terms can check it is given that before
a model loads (rewards/terms.py holds the built-in terms; rewards/group_terms.py those that read a
whole group)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from asr_rl.registry import Registry

TermFn = Callable[..., list[float]]


@dataclass(frozen=True)
class TermSpec:
    needs_reference: bool = True  # False: scores a hypothesis from the audio's facts alone
    needs_audio: bool = False  # True: listens to the sample's audio (`Sample.audio`), e.g. `acoustic`
    # True: a sample's score reads the other samples of its group (`Sample.group_id`), e.g.
    # `consensus`; every caller then hands it whole groups (rewards/groups.py: `group_chunks`)
    needs_group: bool = False
    min_group_size: int = 1  # the fewest samples an utterance it can score (consensus: 2)
    # the bounds of its options (rewards/term_options.py), checked at config load: ValueError if out
    check_options: Callable[[dict], None] | None = None


TERMS: Registry[TermFn] = Registry("reward term", TermSpec)


def register_term(name: str, needs_reference: bool = True, needs_audio: bool = False, needs_group: bool = False,
                  min_group_size: int = 1, check_options: Callable[[dict], None] | None = None
                  ) -> Callable[[TermFn], TermFn]:
    return TERMS.register(name, needs_reference=needs_reference, needs_audio=needs_audio, needs_group=needs_group,
                          min_group_size=min_group_size, check_options=check_options)


def get_term(name: str) -> TermFn:
    return TERMS.get(name)


def check_group_size(terms: Iterable[str], n: int, setting: str) -> None:
    """ValueError when a term in `terms` needs more samples an utterance than the `n` that `setting`
    (e.g. `rollout.n_samples_per_prompt`) gives it."""
    for name in terms:
        need = TERMS.spec(name).min_group_size
        if n < need:
            raise ValueError(f"reward term {name!r} scores each sample against the other samples of its utterance "
                             f"and needs at least {need} of them: {setting} is {n}; set it to {need} or more")


__all__ = ["TERMS", "TermFn", "TermSpec", "check_group_size", "get_term", "register_term"]
