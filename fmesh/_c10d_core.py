"""Private torch names that ``fmesh plan`` needs (to be folded into ``fmesh/_c10d.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

__all__ = ["fake_store"]


def fake_store() -> Store:
    """A store for torch's ``fake`` backend (one process plays one rank).

    Importing the module also registers the ``fake`` backend, which torch 2.11-2.15
    do not register by default.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()
