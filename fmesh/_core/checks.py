"""Value checks shared by the core's validators."""

from __future__ import annotations

__all__ = ["is_int"]


def is_int(value: object) -> bool:
    """``value`` is a Python int and not a bool.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)
