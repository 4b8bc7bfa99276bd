"""Helpers for tables of error cases (test_errors.py, test_elastic_pure.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def bad(value: object) -> Any:
    """Mark an argument of the wrong type on purpose (and let mypy pass it)."""
    return value


def case(call: Callable[[], object], error: type[BaseException], match: str, name: str) -> Any:
    """One error case: ``call()`` raises ``error`` matching ``match``; ``name`` is its id."""
    return pytest.param(call, error, match, id=name)
