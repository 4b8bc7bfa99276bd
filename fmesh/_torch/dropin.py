"""torch's ``init_device_mesh`` built on fmesh (public as ``fmesh.device_mesh``).

``make_mesh`` -> ``realize`` -> ``to_device_mesh``, with torch's arguments and a
DeviceMesh that behaves as torch's: ``docs/design/device-mesh-internals.md``.
"""

from __future__ import annotations

import datetime
import functools
import math
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .._core.errors import DeviceMeshError, DeviceMeshTypeError, MeshError
from .._core.mesh import make_mesh
from .._runtime.checks import check_backend, check_device_type, check_timeout
from .._runtime.groups import describing_groups
from .._runtime.launch import ensure_default_group
from .._runtime.realize import realize_for_torch
from .interop import Root, adopt_root, build_root
from .routing import axis_names, group_descs, realizing_torch_roots

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .._compat import BackendOptions
    from .._runtime.realized_mesh import RealizedMesh

__all__ = ["init_device_mesh"]

BackendConfig = tuple["str | None", "BackendOptions | None"]


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    *,
    mesh_dim_names: Sequence[str] | None = None,
    backend_override: Mapping[int | str, str | BackendOptions | tuple[str, BackendOptions]]
    | None = None,
    timeout: datetime.timedelta | None = None,
) -> DeviceMesh:
    """A torch ``DeviceMesh`` of ``mesh_shape`` over ranks ``0..prod(mesh_shape)-1``,
    as ``torch.distributed.device_mesh.init_device_mesh`` makes it, with fmesh's groups.

    Every rank calls it with the same arguments (SPMD). Without ``mesh_dim_names`` the
    DeviceMesh has no dim names, as torch's. A dim spanning the whole world in rank
    order uses the default group. On a ``fake`` world (a dry run, see
    [`fmesh.init_fake_world`][fmesh.init_fake_world]) any device type torch knows is
    accepted, ``"cuda"`` without GPUs included. Ranks beyond the mesh get torch's
    non-participating mesh.
    On a ``threaded`` world (all ranks as threads of one process) it hands the call to
    torch's own ``init_device_mesh``: fmesh's memo is per process, one rank each.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ... without an index.
        mesh_shape: the size of each dim.
        mesh_dim_names: one unique name per dim, or ``None`` for an unnamed mesh.
        backend_override: per dim (by index, or by name when named): a backend name,
            backend options, or both as ``(backend, options)`` (either ``None``);
            other dims use the default group's backend.
        timeout: fmesh's keyword (torch has none): the timeout of every group of this
            mesh and of the meshes torch's methods derive from it (``_flatten``,
            ``_unflatten``, slicing, FSDP2's post-forward mesh), and of fmesh's
            agreement before creating them. ``None``: torch's defaults, for both:
            a late rank is waited for as long as torch would (30 minutes on gloo,
            10 on NCCL), with a warning on the ``fmesh`` logger each minute. With a
            timeout, a dim spanning the whole world gets a group of its own instead
            of the default group; not supported on a ``threaded`` world.

    Returns:
        A new root ``DeviceMesh`` per call, as torch's. Roots over the same ranks share
        fmesh's groups and one rank map; torch's own methods on them and on every mesh
        derived from them (``__getitem__``, ``_flatten``, ``_unflatten``,
        ``_concatenate``) create groups through [`fmesh.realize`][fmesh.realize].

    Raises:
        DeviceMeshError: where torch raises ``RuntimeError``: repeated names, a names /
            shape length mismatch, a device type with an index, an unknown or
            repeated ``backend_override`` key, a mesh larger than the world; also a
            device type not usable in this process (torch sets no device up for it
            and fails later; any device type on a fake world is accepted, as torch
            does). Also a ``RuntimeError``.
        DeviceMeshTypeError: a ``backend_override`` value that is no backend,
            options or pair of them (torch's ``ValueError`` or ``TypeError``: it is
            both).
        MeshMismatchError: the ranks called it with different arguments.
        LaunchError: no process group and no torchrun environment to start one.

    Example, one rank of a dry run on the fake backend:

    >>> import torch.distributed as dist
    >>> import fmesh
    >>> from fmesh.device_mesh import init_device_mesh
    >>> fmesh.init_fake_world(8, 5)
    >>> dm = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    >>> dm["tp"].mesh.tolist(), dm.get_coordinate()
    ([4, 5, 6, 7], (1, 1))
    >>> init_device_mesh("cuda", (8,)).mesh_dim_names is None
    True
    >>> fmesh.destroy(); dist.destroy_process_group()
    """
    shape = _check_shape(mesh_shape)
    torch_names = _check_names(shape, mesh_dim_names)
    timeout = check_timeout(timeout, "init_device_mesh")
    overrides = (
        None
        if backend_override is None
        else _normalize_backend_override(backend_override, len(shape), torch_names)
    )
    if not isinstance(device_type, str):
        raise TypeError(f"init_device_mesh() device_type must be a str, got {device_type!r}")
    if device_type and not device_type.isalpha():
        raise DeviceMeshError(
            f"Device type with index is not supported but got {device_type!r}: pass "
            "the type alone, e.g. 'cuda' (torch.device(...).type); each rank uses its "
            "current device"
        )
    shape = _check_sizes(shape)

    import torch.distributed as dist

    if not dist.is_initialized():
        ensure_default_group(None)  # from the torchrun environment, as realize would
    if dist.get_backend() == "threaded":
        if timeout is not None:
            raise DeviceMeshError(
                "init_device_mesh(timeout=...) is fmesh's and needs fmesh's groups, "
                "which a threaded world does not use; drop timeout= there"
            )
        return _torch_init_device_mesh(device_type, shape, torch_names, overrides)
    world = dist.get_world_size()
    size = math.prod(shape)
    if size > world:
        raise DeviceMeshError(
            f"Mesh should not be bigger than default world size {world}, but found "
            f"{size} ranks (mesh_shape={shape}); launch more processes or give a "
            "smaller mesh_shape"
        )
    device_type = _set_device(device_type)

    # fmesh's axis names: torch's where they are valid fmesh names (see axis_names).
    names = (
        tuple(f"dim{i}" for i in range(len(shape)))
        if torch_names is None
        else axis_names(torch_names, len(shape))
    )
    descs = dict(zip(names, group_descs(torch_names, len(names))))
    backend: dict[str, str] = {}
    options: dict[str, BackendOptions] = {}
    for name, (b, o) in zip(names, overrides or ()):
        if b is not None:
            backend[name] = check_backend(b, "init_device_mesh() backend_override")
        if o is not None:
            options[name] = o
    built: list[tuple[Root, DeviceMesh]] = []

    def build(realized: RealizedMesh) -> None:
        built.append(
            build_root(
                realized.mesh,
                realized.groups,
                device_type,
                unnamed=torch_names is None,
                timeout=timeout,
                names=None if torch_names == names else torch_names,
            )
        )

    with realizing_torch_roots(), describing_groups(descs.__getitem__):
        # A call that creates groups builds the DeviceMesh while its slowest rank
        # finishes; a memo hit, after.
        realized = realize_for_torch(
            _mesh(shape, names),
            backend=backend or None,
            options=options or None,
            timeout=timeout,
            prepare=build,
        )
    if not built:
        build(realized)
    return adopt_root(built[0], device_type)


_mesh = functools.lru_cache(maxsize=64)(make_mesh)
"""The fmesh mesh of a call (a value: the same arguments give an equal mesh, so a
repeated call skips building it)."""


def _check_shape(mesh_shape: object) -> tuple[Any, ...]:
    """``mesh_shape`` as a tuple (its entries are checked by ``_check_sizes``)."""
    if isinstance(mesh_shape, int | str | bytes) or not isinstance(mesh_shape, Iterable):
        raise TypeError(
            f"init_device_mesh() mesh_shape must be a tuple of ints, got {mesh_shape!r}; "
            "e.g. mesh_shape=(2, 4)"
        )
    return tuple(mesh_shape)


def _check_sizes(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """``shape`` as ints, each >= 1, as torch requires (integers of numpy and other libraries
    accepted, bools not): where torch raises ``ValueError`` for a wrong type and
    ``RuntimeError`` for a negative size, ``DeviceMeshTypeError`` and
    ``DeviceMeshError`` are instances of those."""
    for i, size in enumerate(shape):
        if isinstance(size, bool) or not hasattr(type(size), "__index__"):
            raise DeviceMeshTypeError(
                f"init_device_mesh() mesh_shape must be a tuple of ints, got {size!r} of "
                f"type {type(size).__name__} at index {i} of {shape!r}"
            )
        if operator.index(size) < 1:
            raise DeviceMeshError(
                f"init_device_mesh() mesh_shape sizes must be >= 1, got {size} at index "
                f"{i} of {shape!r}"
            )
    return tuple(operator.index(size) for size in shape)


def _check_names(shape: tuple[Any, ...], mesh_dim_names: object) -> tuple[Any, ...] | None:
    """torch's dim names as a tuple (``None`` for an unnamed mesh), checked as torch
    checks them: unique, one per dim. torch accepts any hashable names (``""``, ints,
    the letters of a str); so does the drop-in."""
    if mesh_dim_names is None:
        return None
    if not isinstance(mesh_dim_names, Iterable):
        raise TypeError(
            f"init_device_mesh() mesh_dim_names must be a tuple of str, got "
            f"{mesh_dim_names!r}; e.g. mesh_dim_names=('dp', 'tp')"
        )
    names = tuple(mesh_dim_names)
    try:
        unique = len(set(names)) == len(names)
    except TypeError:
        raise TypeError(
            f"init_device_mesh() mesh_dim_names must be hashable (str), got {names!r}"
        ) from None
    if not unique:
        raise DeviceMeshError(
            "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in "
            f"mesh_dim_names {names}"
        )
    if len(shape) != len(names):
        hint = (
            f"; a str is a sequence of letters: for one dim pass ({mesh_dim_names!r},)"
            if isinstance(mesh_dim_names, str)
            else ""
        )
        raise DeviceMeshError(
            "mesh_shape and mesh_dim_names should have same length! Found "
            f"len(mesh_dim_names): {len(names)} and len(mesh_shape): {len(shape)} "
            f"(mesh_shape={shape}, mesh_dim_names={names}){hint}"
        )
    return names


def _normalize_backend_override(
    backend_override: Mapping[int | str, object],
    ndim: int,
    mesh_dim_names: Sequence[str] | None,
) -> tuple[BackendConfig, ...]:
    """(backend, options) per dim, as torch normalizes ``backend_override``: a dim is
    named by index or by name (not both); a value is a backend, options, or both."""
    from .._compat import backend_options_type

    options_type = backend_options_type()
    left = dict(backend_override)
    names = tuple(mesh_dim_names or ())
    out: list[BackendConfig] = []
    for index in range(ndim):
        name = names[index] if index < len(names) else None
        if name is not None and name in left:
            if index in left:
                raise DeviceMeshError(
                    f"Found redundant dim index {index} and name {name} in "
                    "backend_override; name each dim once"
                )
            value = left.pop(name)
        elif index in left:
            value = left.pop(index)
        else:
            out.append((None, None))
            continue
        out.append(_backend_config(value, options_type))
    if left:
        raise DeviceMeshError(
            f"Found invalid keys in backend_override: got {list(left)}, expected "
            f"integers in range [0, {ndim}) or one of {names}"
        )
    return tuple(out)


def _backend_config(value: object, options_type: type) -> BackendConfig:
    """One ``backend_override`` value as (backend, options), as torch reads it: a
    backend name, options, or any pair of them (``None`` or ``""`` for the default
    group's backend, ``None`` for no options); torch unpacks any other value as a pair,
    so a wrong length is its ``ValueError`` and a value that is no pair its
    ``TypeError``: ``DeviceMeshTypeError`` is both."""
    if isinstance(value, str):
        return value or None, None
    # torch's options class is looked up at run time; cast to the type checker's name.
    if isinstance(value, options_type):
        return None, cast("BackendOptions", value)
    pair: tuple[object, ...] | None = None
    if isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
        pair = tuple(value)
    if pair is not None and len(pair) == 2:
        backend, options = pair
        if (backend is None or isinstance(backend, str)) and (
            options is None or isinstance(options, options_type)
        ):
            return backend or None, cast("BackendOptions | None", options)
    raise DeviceMeshTypeError(
        "a backend_override value must be a backend name, backend options, or a "
        f"(backend name, options) pair (either may be None), got {value!r}; e.g. "
        "backend_override={0: 'gloo'} or {'tp': ('nccl', options)}"
    )


def _set_device(device_type: str) -> str:
    """``device_type`` checked; this process's device selected as torch's DeviceMesh
    does before creating groups: only when none is selected yet, from ``LOCAL_RANK``
    (skipped on a fake world)."""
    import torch
    import torch.distributed as dist

    # torch accepts "" (no device to set up), and any device type on a fake world (a
    # dry run: it sets up no device).
    if device_type and dist.get_backend() != "fake":
        try:
            device_type = check_device_type(device_type, "init_device_mesh")
        except MeshError as err:
            raise DeviceMeshError(str(err)) from None
    if device_type == "cpu" or dist.get_backend() == "fake":
        return device_type
    handle: Any = getattr(torch, device_type, None)
    initialized = getattr(handle, "is_initialized", None)
    if initialized is None or initialized() or "LOCAL_RANK" not in os.environ:
        return device_type
    handle.set_device(int(os.environ["LOCAL_RANK"]))
    return device_type


def _torch_init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    mesh_dim_names: Sequence[str] | None,
    overrides: tuple[BackendConfig, ...] | None,
) -> DeviceMesh:
    """torch's own ``init_device_mesh`` (threaded worlds: one process plays every rank,
    while fmesh's memo serves one rank per process). torch's own even while routed:
    ``route()`` makes torch's function call this module's."""
    from .._compat.swap import torch_init_device_mesh

    torch_init = torch_init_device_mesh()
    by_index: dict[int | str, str | BackendOptions | tuple[str, BackendOptions]] = {}
    for i, (b, o) in enumerate(overrides or ()):
        if b is not None and o is not None:
            by_index[i] = (b, o)
        elif b is not None:
            by_index[i] = b
        elif o is not None:
            by_index[i] = o
    return torch_init(
        device_type,
        tuple(mesh_shape),
        mesh_dim_names=None if mesh_dim_names is None else tuple(mesh_dim_names),
        backend_override=by_index if overrides is not None else None,
    )
