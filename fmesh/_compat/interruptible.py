"""A store whose waits another thread can cut short, for group creation under a watch.

torch's store waits (and the gloo and NCCL rendezvous, which wait in the store) block in
C++ until the key appears or the timeout passes; nothing in torch's API cancels them.
``InterruptibleStore`` forwards every operation to a connection the caller already
holds, and splits each wait into slices of ``slice_s`` seconds: between two slices it
asks ``cancelled()``, and raises ``DistNetworkError`` once that says yes. So a watch
(``_runtime/liveness.py``) wakes a rank blocked in a rendezvous without a connection of its
own; the slices cost one request each, only while a wait lasts.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, cast

from torch._C._distributed_c10d import Store

__all__ = ["InterruptibleStore"]


class InterruptibleStore(Store):
    """Forwards to ``inner``; waits are cut into slices and end once ``cancelled()``."""

    def __init__(
        self, inner: Store, cancelled: Callable[[], bool], slice_s: float, why: str
    ) -> None:
        super().__init__()
        self.inner: Any = inner
        self._cancelled = cancelled
        self._slice = datetime.timedelta(seconds=slice_s)
        self._why = why
        self.set_timeout(cast(Any, inner).timeout)

    def _raise_if_cancelled(self) -> None:
        import torch.distributed as dist

        if self._cancelled():
            raise dist.DistNetworkError(self._why)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        import torch.distributed as dist

        limit: datetime.timedelta = self.inner.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit.total_seconds()
        while True:
            self._raise_if_cancelled()
            left = deadline - time.monotonic()
            step = min(self._slice, datetime.timedelta(seconds=max(left, 0.001)))
            try:
                self.inner.wait(keys, step)
                return
            except dist.DistStoreError:
                if left <= step.total_seconds():
                    raise

    def get(self, key: str) -> bytes:
        self.wait([key])
        return bytes(self.inner.get(key))

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def add(self, key: str, value: int) -> int:
        return int(self.inner.add(key, value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return bytes(self.inner.compare_set(key, expected, desired))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check(keys))

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(key))

    def deleteKey(self, key: str) -> bool:  # the C++ side's name
        return self.delete_key(key)

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        return [bytes(v) for v in self.inner.multi_get(keys)]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self.inner.multi_set(keys, values)

    def append(self, key: str, value: Any) -> None:
        self.inner.append(key, value)

    def has_extended_api(self) -> bool:
        return bool(self.inner.has_extended_api())
