"""`Registry`: the one place an extension is named. Advantage estimators, policy losses and reward
terms are each a `Registry`; adding one is a decorated function (verl's `@register_adv_est`,
`@register_policy_loss`), and an entry may declare what it needs (`spec`), so that a config is
checked against the registry when it is loaded, before any model loads."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Entry(Generic[F]):
    fn: F
    spec: Any


class Registry(Generic[F]):
    """Named functions of one kind, each with an optional spec (a frozen dataclass of `spec_type`).

    Iterating yields the names in registration order; `name in registry` tests membership.
    """

    def __init__(self, kind: str, spec_type: type | None = None):
        self.kind, self.spec_type = kind, spec_type
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, **spec) -> Callable[[F], F]:
        """Decorator registering `fn` as `name`; `spec` are the `spec_type` fields (checked here)."""
        if spec and self.spec_type is None:
            raise TypeError(f"{self.kind} entries take no spec, got {sorted(spec)}")
        value = self.spec_type(**spec) if self.spec_type is not None else None

        def deco(fn: F) -> F:
            old = self._entries.get(name)
            if old is not None and old.fn is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(fn, value)
            return fn

        return deco

    def get(self, name: str) -> F:
        """The function registered as `name`; ValueError listing the valid names otherwise."""
        return self._entry(name).fn

    def spec(self, name: str):
        return self._entry(name).spec

    def check(self, name: str) -> None:
        """ValueError naming the valid entries when `name` is not one (config validation)."""
        self._entry(name)

    def where(self, **conditions) -> tuple[str, ...]:
        """Names whose spec has every given field value, e.g. `where(grouped=True)`."""
        return tuple(n for n, e in self._entries.items()
                     if all(getattr(e.spec, k) == v for k, v in conditions.items()))

    def _entry(self, name: str) -> Entry[F]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
