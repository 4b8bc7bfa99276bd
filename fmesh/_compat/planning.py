"""Every process group a planned trainer makes, seen and made on the fake world.

``fmesh plan`` runs a trainer's code as one rank of a world on torch's ``fake``
backend. Groups come from more places than fmesh's ``realize``: torch's ``new_group``
(and ``new_subgroups``, which calls it), ``split_group``, a ``DeviceMesh`` built from a
tensor or by a torch ``init_device_mesh`` that fmesh never routed (one held in a dict
since import), each of which makes its groups through the c10d functions wrapped here,
while ``observing`` is active:

* ``_new_process_group_helper``, which every group goes through (fmesh's, torch's,
  the default group): a real backend asked for (``gloo``, ``nccl``,
  ``"cpu:gloo,cuda:nccl"``) and its options are swapped for the fake backend, which
  needs no peers and no device, so the trainer's code runs as it would at launch. A
  group made here by none of the functions below nor by fmesh is reported too.
* ``_new_group_with_tag`` (behind ``new_group``): reported with the ranks, backend
  and options the caller asked for, before the swap.
* ``split_group``: torch 2.11 to 2.14 refuse it where no device is bound to the
  default group (every CPU host, and a GPU host whose default group was started
  without ``device_id``): here it raises as torch would at launch
  (``split_refusal``, ``Observer.bound_device``); else it is reported and this
  rank's part made as a fake group.
* ``DeviceMesh._init_one_process_group``: torch makes one dimension's groups with a
  ``new_group`` call per group, O(world) calls on every rank; they are reported as
  one ``DimCall`` holding them all.

Nothing here decides whether ranks agree: the observer (``fmesh/_plan``) does.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast, final

import attrs

from .c10d import torch_version

__all__ = [
    "DimCall",
    "Observer",
    "TorchGroupCall",
    "observing",
    "on_fake_world",
    "split_refusal",
]

FMESH_PREFIX = "fmesh_"
"""The start of the names fmesh gives its own groups (``_runtime/groups.py``)."""


@final
@attrs.frozen
class TorchGroupCall:
    """One group-creating call of torch's API that fmesh did not make."""

    api: str
    """``new_group``, ``split_group`` or ``_new_process_group_helper``."""
    ranks: tuple[int, ...]
    """The group's global ranks as torch orders them (``split_group``: every split,
    one after the other)."""
    splits: tuple[int, ...]
    """``split_group``: the size of each split; else ``(len(ranks),)``."""
    backend: str | None
    """The backend asked for (``None``: the default group's)."""
    options: object
    """The backend options asked for (``None``: none)."""
    local: bool
    """Only the group's members make the call (``use_local_synchronization``)."""
    held: tuple[int, ...] | None
    """This rank's group (``None``: not a member)."""
    holding: int
    """Groups the process held when the call was made: torch names a local group by
    its ranks and this count, so its members must hold alike to meet."""


@final
@attrs.define
class DimCall:
    """torch's DeviceMesh making one dimension's groups (``_init_one_process_group``)."""

    dim: str
    backend: str | None
    options: object
    calls: list[TorchGroupCall] = attrs.field(factory=list)
    """The ``new_group`` calls it made, in order."""


class Observer(Protocol):
    def torch_call(self, call: TorchGroupCall) -> None:
        """A group-creating call made outside any DeviceMesh dimension."""

    def dim_call(self, call: DimCall) -> None:
        """A DeviceMesh dimension's groups, once all are made (none: not reported)."""

    def bound_device(self) -> bool:
        """Whether the launch's default group has a device bound (``device_id``)."""


_local = threading.local()


def _inside() -> list[str]:
    stack: list[str] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _dim() -> DimCall | None:
    dims: list[DimCall] | None = getattr(_local, "dims", None)
    return dims[-1] if dims else None


def on_fake_world() -> bool:
    """The default group exists and runs on torch's ``fake`` backend."""
    import torch.distributed as dist

    return dist.is_initialized() and str(dist.get_backend()) == "fake"


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def _arguments(
    fn: Callable[..., Any],
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """A cheap binder of ``fn``'s arguments by name (positional names read once)."""
    names = list(inspect.signature(fn).parameters)
    defaults = {
        k: p.default
        for k, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**defaults, **dict(zip(names, args)), **kwargs}

    return bind


def _report(observer: Observer, call: TorchGroupCall) -> None:
    dim = _dim()
    if dim is not None:
        dim.calls.append(call)
    else:
        observer.torch_call(call)


def _holding() -> int:
    return len(_c10d()._world.pg_names)


def _member(pg: object) -> bool:
    from torch.distributed import ProcessGroup

    return isinstance(pg, ProcessGroup)


def _wrap_helper(previous: Callable[..., Any], observer: Observer) -> Callable[..., Any]:
    bind = _arguments(previous)
    names = list(inspect.signature(previous).parameters)

    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        if not on_fake_world():
            return previous(*args, **kwargs)
        a = bind(args, kwargs)
        ranks = list(a["global_ranks_in_group"])
        asked, options = a["backend"], a.get("backend_options")
        fake_options = type(options).__qualname__.startswith("FakeProcessGroup")
        if str(asked) != "fake" or (options is not None and not fake_options):
            from torch.distributed import Backend

            # The fake backend stands in for the real one: no peers, no device.
            kwargs = {**dict(zip(names, args)), **kwargs}
            kwargs["backend"] = Backend("fake")
            kwargs["backend_options"] = None
            args = ()
        holding = _holding()
        result = previous(*args, **kwargs)
        name = str(a["group_name"])
        if ranks and not _inside() and not name.startswith(FMESH_PREFIX):
            pg = result[0] if isinstance(result, tuple) else result
            _report(
                observer,
                TorchGroupCall(
                    "_new_process_group_helper",
                    tuple(ranks),
                    (len(ranks),),
                    str(asked),
                    options,
                    False,
                    tuple(ranks) if _member(pg) else None,
                    holding,
                ),
            )
        return result

    return _new_process_group_helper


def _wrap_new_group(previous: Callable[..., Any], observer: Observer) -> Callable[..., Any]:
    bind = _arguments(previous)

    def _new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
        if not on_fake_world() or _inside():
            return previous(*args, **kwargs)
        import torch.distributed as dist

        a = bind(args, kwargs)
        given = a.get("ranks")
        ranks = list(range(dist.get_world_size())) if given is None else list(given)
        if given is not None and a.get("sort_ranks", True):
            ranks.sort()
        holding = _holding()
        _inside().append("new_group")
        try:
            pg = previous(*args, **kwargs)
        finally:
            _inside().pop()
        backend = a.get("backend")
        _report(
            observer,
            TorchGroupCall(
                "new_group",
                tuple(ranks),
                (len(ranks),),
                None if not backend else str(backend),
                a.get("backend_options"),
                bool(a.get("use_local_synchronization", False)),
                tuple(ranks) if _member(pg) else None,
                holding,
            ),
        )
        return pg

    return _new_group_with_tag


def planned_split_group(
    previous: Callable[..., Any], observer: Observer
) -> Callable[..., Any]:
    """``split_group`` for the fake world: refused as torch refuses it at launch
    (``split_refusal``), else reported and this rank's split made as a fake group
    (torch's own refuses the fake world, which has no bound device). Elsewhere it is
    ``previous``."""
    bind = _arguments(previous)

    def split_group(*args: Any, **kwargs: Any) -> Any:
        if not on_fake_world() or _inside():
            return previous(*args, **kwargs)
        import torch.distributed as dist

        a = bind(args, kwargs)
        refused = split_refusal(a.get("split_ranks"), observer.bound_device())
        if refused is not None:
            raise refused
        parent = a.get("parent_pg") or dist.group.WORLD
        to_global = dist.get_process_group_ranks(parent)
        splits = [sorted(to_global[r] for r in s) for s in a.get("split_ranks") or []]
        me = dist.get_rank()
        mine = next((s for s in splits if me in s), None)
        pg: Any = None
        holding = _holding()
        if mine is not None:
            _inside().append("split_group")
            try:
                pg = _c10d()._new_group_with_tag(
                    mine,
                    timeout=a.get("timeout"),
                    backend="fake",
                    use_local_synchronization=True,
                    group_desc=a.get("group_desc"),
                )
            finally:
                _inside().pop()
        backend = a.get("backend")
        _report(
            observer,
            TorchGroupCall(
                "split_group",
                tuple(r for s in splits for r in s),
                tuple(len(s) for s in splits),
                None if not backend else str(backend),
                a.get("pg_options"),
                False,
                None if mine is None else tuple(mine),
                holding,
            ),
        )
        return pg

    return split_group


def split_refusal(
    split_ranks: object, bound: bool, version: tuple[int, int] | None = None
) -> Exception | None:
    """The error torch's ``split_group`` raises before it makes anything, for a launch
    whose default group has a device bound (``bound``) or not, as this torch (or
    ``version``) checks it: no split ranks; then, on torch 2.11 to 2.14, no device
    bound to the default group (every CPU launch: torch binds only accelerators).
    torch 2.15 splits any group whose backend can (gloo and NCCL can). ``None``
    where it goes on.

    >>> split_refusal([[0, 1]], bound=False, version=(2, 13))  # doctest: +ELLIPSIS
    RuntimeError('No device associated with the default pg, not safe to split ...')
    >>> split_refusal([[0, 1]], bound=True, version=(2, 13)) is None
    True
    >>> split_refusal([[0, 1]], bound=False, version=(2, 15)) is None
    True
    """
    if not split_ranks:
        return ValueError("split_ranks cannot be None or empty")
    torchcomms: Callable[[], bool] = getattr(_c10d(), "_use_torchcomms_enabled", lambda: False)
    if (version or torch_version()) < (2, 15) and not bound and not torchcomms():
        return RuntimeError(
            "No device associated with the default pg, not safe to split any process groups"
        )
    return None


def _wrap_dim(previous: Callable[..., Any], observer: Observer) -> Callable[..., Any]:
    bind = _arguments(previous)

    def _init_one_process_group(*args: Any, **kwargs: Any) -> Any:
        if not on_fake_world() or _dim() is not None:
            return previous(*args, **kwargs)
        a = bind(args, kwargs)
        config = a.get("backend_override") or (None, None)
        backend, options = config if isinstance(config, tuple) else (config, None)
        dim = DimCall(str(a.get("dim_name")), None if not backend else str(backend), options)
        dims: list[DimCall] = getattr(_local, "dims", None) or []
        _local.dims = dims
        dims.append(dim)
        try:
            result = previous(*args, **kwargs)
        finally:
            dims.pop()
        if dim.calls:
            observer.dim_call(dim)
        return result

    return _init_one_process_group


@contextlib.contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Inside, every group torch makes on a fake world is reported to ``observer``
    (fmesh's own are not: its realize calls are compared by fmesh's agreement codes),
    and real backends are played by the fake one. ``split_group`` is not swapped here:
    the caller points every module's ``split_group`` at ``planned_split_group``."""
    from torch.distributed.device_mesh import DeviceMesh

    c10d = _c10d()
    cls = cast(Any, DeviceMesh)
    helper, new_group = c10d._new_process_group_helper, c10d._new_group_with_tag
    one = cls.__dict__.get("_init_one_process_group")
    c10d._new_process_group_helper = _wrap_helper(helper, observer)
    c10d._new_group_with_tag = _wrap_new_group(new_group, observer)
    if isinstance(one, staticmethod):
        cls._init_one_process_group = staticmethod(_wrap_dim(one.__func__, observer))
    try:
        yield
    finally:
        c10d._new_process_group_helper = helper
        c10d._new_group_with_tag = new_group
        if isinstance(one, staticmethod):
            cls._init_one_process_group = one
