"""`setting`: a config field's valid range, declared beside its default (asr_rl/config.py checks
values from files and the command line against it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric setting (each element, for a list): bounds, each optional.

    Attributes:
        gt, ge, lt, le: value > gt, >= ge, < lt, <= le.
        note: what the bounds mean, appended to the error (e.g. "0 = off").
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    note: str = ""

    def holds(self, v: float) -> bool:
        return ((self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
                and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le))

    def __str__(self) -> str:
        parts = [f"{op} {b:g}" for op, b in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
                 if b is not None]
        return " and ".join(parts) + (f" ({self.note})" if self.note else "")


def setting(default: Any, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
            le: float | None = None, note: str = "") -> Any:
    """A dataclass field with its valid range beside its default: `temperature: float = setting(1.0,
    gt=0)`. Values from a file or the command line outside the range fail at load, naming the key
    as written, the value and the range."""
    return field(default=default, metadata={"range": Range(gt, ge, lt, le, note)})
