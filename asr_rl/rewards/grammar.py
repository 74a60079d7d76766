"""`WordGrammar`: how far a transcript is from the nearest sentence a domain's grammar allows, in
words. The building block of a verifier reward (recipes/rewards/voice_commands.py): a reward that
judges a hypothesis without its reference, from what a valid transcript looks like.

A grammar is templates of words and `{slot}`s (`{slot}?` optional); a slot is a list of phrases,
which may hold slots themselves (`phone: ["{first} {digit} {digit} ..."]`). The templates compile
to a word automaton (acyclic: a command grammar has no loops), and `distance` is the edit distance
between the hypothesis' words and the closest sentence the automaton accepts (approximate regular
expression matching, Wagner 1974; Myers & Miller 1989): one dynamic-programming row over the
automaton's states per hypothesis word, O(words x edges). A script written without spaces
(Mandarin) is matched by character: `WordGrammar(..., split=characters)`.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

_SLOT = re.compile(r"^\{(\w+)\}(\??)$")
_CHARACTER = re.compile(r"\{\w+\}\??|\S")


def characters(text: str) -> list[str]:
    """The tokens of a script written without spaces: each character, a `{slot}` / `{slot}?` whole
    ("把{room}的灯" -> 把, {room}, 的, 灯)."""
    return _CHARACTER.findall(text)


class WordGrammar:
    """Args:
        templates: sentences of words and `{slot}` / `{slot}?` tokens, e.g. `"call {name} {tail}?"`.
        slots: slot name -> its phrases (word sequences, which may use other slots).
        split: text -> tokens, for the templates, the phrases and the hypotheses (`str.split`: words;
            `characters`: a script without spaces).
    """

    def __init__(self, templates: Iterable[str], slots: Mapping[str, Iterable[str]],
                 split: Callable[[str], list[str]] = str.split):
        self.split = split
        self.slots = {name: [split(p) for p in phrases] for name, phrases in slots.items()}
        self._edges: dict[tuple[int, int], set[str]] = {}
        self._eps: set[tuple[int, int]] = set()
        self._n = 2  # state 0 starts every sentence, state 1 ends it
        for template in templates:
            self._add(split(template), 0, 1, ())
        self._order = self._topological()
        self._free: dict[int, list[tuple[int, int]]] = {}  # state -> (next, cost) of the moves that read nothing
        for u, v in self._eps:
            self._free.setdefault(u, []).append((v, 0))
        for u, v in self._edges:
            self._free.setdefault(u, []).append((v, 1))

    # -------------------------------------------------------------------- building
    def _new(self) -> int:
        self._n += 1
        return self._n - 1

    def _add(self, tokens: list[str], src: int, dst: int, stack: tuple[str, ...]) -> None:
        """A path src -> dst through `tokens` (a word is an edge; a slot, one path per phrase)."""
        if not tokens:
            self._eps.add((src, dst))
            return
        here = src
        for i, token in enumerate(tokens):
            to = dst if i == len(tokens) - 1 else self._new()
            slot = _SLOT.match(token)
            if slot is None:
                self._edges.setdefault((here, to), set()).add(token)
            else:
                name, optional = slot.groups()
                if name not in self.slots:
                    raise ValueError(f"grammar: template token {token!r} names no slot; slots: {', '.join(self.slots)}")
                if name in stack:
                    raise ValueError(f"grammar: slot {name!r} uses itself ({' -> '.join((*stack, name))})")
                for phrase in self.slots[name]:
                    self._add(phrase, here, to, (*stack, name))
                if optional:
                    self._eps.add((here, to))
            here = to

    def _topological(self) -> list[int]:
        succ: dict[int, set[int]] = {}
        for u, v in (*self._edges, *self._eps):
            succ.setdefault(u, set()).add(v)
        indegree = [0] * self._n
        for vs in succ.values():
            for v in vs:
                indegree[v] += 1
        order, ready = [], [s for s in range(self._n) if indegree[s] == 0]
        while ready:
            u = ready.pop()
            order.append(u)
            for v in succ.get(u, ()):
                indegree[v] -= 1
                if indegree[v] == 0:
                    ready.append(v)
        return order

    # -------------------------------------------------------------------- matching
    def _close(self, cost: list[float]) -> list[float]:
        """Free moves in topological order: an empty path (0) or a grammar word left out (1)."""
        for u in self._order:
            for v, c in self._free.get(u, ()):
                if cost[u] + c < cost[v]:
                    cost[v] = cost[u] + c
        return cost

    def distance(self, words: list[str]) -> int:
        """Word edits (substitutions, insertions, deletions) from `words` to the nearest sentence."""
        inf = float("inf")
        cost = [inf] * self._n
        cost[0] = 0
        cost = self._close(cost)
        for w in words:
            nxt = [c + 1 for c in cost]  # the hypothesis word is extra (an insertion)
            for (u, v), allowed in self._edges.items():
                c = cost[u] + (0 if w in allowed else 1)  # the grammar's word, or one in its place
                if c < nxt[v]:
                    nxt[v] = c
            cost = self._close(nxt)
        return int(cost[1])

    def score(self, text: str) -> float:
        """1 - distance / tokens, floored at 0: 1 for a sentence of the grammar, partial credit for a
        near one, 0 for an empty transcript or one the grammar cannot explain."""
        words = self.split(text)
        return max(0.0, 1.0 - self.distance(words) / len(words)) if words else 0.0
