"""What every data schema shares (`DataConfig` and each source's settings): the split roles,
and the value check that names the field."""

from __future__ import annotations

ROLES = ("train", "val", "test")


def positive_int(owner: str, name: str, value: object) -> None:
    """Raise ValueError naming `{owner}.{name}` unless value is an int > 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")
