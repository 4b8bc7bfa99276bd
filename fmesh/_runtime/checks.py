"""Checks of the torch settings users pass: backends, device types, timeouts."""

from __future__ import annotations

import datetime

from .._core.errors import MeshError

__all__ = ["check_backend", "check_device_type", "check_timeout"]


def check_timeout(timeout: object, fn: str) -> datetime.timedelta | None:
    """``timeout`` as a positive timedelta or ``None``; clear errors otherwise."""
    if timeout is None:
        return None
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(
            f"{fn}() timeout must be a datetime.timedelta, got {timeout!r}; "
            "e.g. timeout=datetime.timedelta(seconds=60)"
        )
    if timeout.total_seconds() <= 0:
        raise MeshError(
            f"{fn}() timeout must be positive, got {timeout!r}; pass e.g. "
            "datetime.timedelta(seconds=60), or None for the default"
        )
    return timeout


def check_backend(backend: object, where: str) -> str:
    """A backend string torch knows: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``."""
    from torch.distributed import Backend

    if not isinstance(backend, str):
        raise TypeError(f"{where}: a backend must be a str, got {backend!r}")
    known = [b for b in Backend.backend_list if b != Backend.UNDEFINED]
    parts = [p.strip() for p in backend.lower().split(",")]
    for part in parts:
        device, sep, name = part.rpartition(":")
        if (sep and not device) or name not in known:
            raise MeshError(
                f"{where}: unknown backend {backend!r}; expected one of {known}, or "
                "device:backend pairs such as 'cpu:gloo,cuda:nccl' (register a custom "
                "backend with torch.distributed.Backend.register_backend first)"
            )
    return backend


def check_device_type(device_type: object, where: str) -> str:
    """A device type torch can use on this machine (``"cpu"``, ``"cuda"``, ...).

    On a ``fake`` world (a dry run) any device type torch knows is accepted, as torch's
    DeviceMesh accepts it there: nothing runs on the device.
    """
    import torch
    import torch.distributed as dist

    if device_type == "cpu":  # the common case, kept cheap (init_device_mesh's memo hit)
        return device_type
    if not isinstance(device_type, str):
        raise TypeError(f"{where}: device_type must be a str, got {device_type!r}")
    try:
        device = torch.device(device_type)
    except RuntimeError:
        raise MeshError(
            f"{where}: {device_type!r} is not a torch device type; expected e.g. "
            "'cpu' or 'cuda'"
        ) from None
    if device.index is not None:
        raise MeshError(
            f"{where}: pass a device type without an index, e.g. 'cuda' rather than "
            f"{device_type!r}; each rank uses its current device"
        )
    if device.type == "cpu":
        return device.type
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake":
        return device.type
    module = getattr(torch, device.type, None)
    available = getattr(module, "is_available", None)
    if available is None or not available():
        raise MeshError(
            f"{where}: device type {device_type!r} is not available in this process "
            f"(torch {torch.__version__}); use 'cpu', or run on a machine with that "
            "device"
        )
    return device.type
