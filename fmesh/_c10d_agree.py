"""Compat names for ``fmesh/_agree.py`` (to be folded into ``fmesh/_c10d.py``).

``torch.distributed.Store`` is public at runtime, but torch re-exports it from the
private ``torch._C._distributed_c10d`` without marking the re-export, so a strict type
checker only sees the private name. The type is the same on torch 2.11 through 2.15;
its stub lacks ``append`` (all versions) and ``clone`` (before 2.15), which
``_agree.py`` types itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store as Store

__all__ = ["Store"]
