"""The drop-in for a whole process, with no line of the trainer changed.

``route()`` makes torch's own ``init_device_mesh`` call fmesh's drop-in: the function
object itself runs fmesh's code (``_compat/swap.py`` says why it is the function and
not the module attributes), so every module that holds it, imported before or after,
gets fmesh's meshes. torch's DeviceMesh methods on those meshes go through fmesh as
they do for the one-import drop-in (``_compat/hook.py``, installed with the first
mesh). The Python processes started after ``route()`` are routed too, until
``unroute()`` (``children.py``). ``python -m fmesh.route SCRIPT`` is in
``fmesh/_cli/route.py``.
"""

from __future__ import annotations

from .._compat.swap import route_init_device_mesh, routed, unroute_init_device_mesh
from .children import carry, drop
from .dropin import init_device_mesh

__all__ = ["route", "unroute"]


def route() -> None:
    """Route torch's own ``init_device_mesh`` through fmesh for the whole process.

    After it, torch's ``init_device_mesh`` (``torch.distributed.device_mesh``'s, and
    the same function wherever it is held: ``from ... import`` done before or after,
    ``torch.distributed.init_device_mesh``, libraries, registries) behaves exactly as
    [`fmesh.device_mesh.init_device_mesh`][fmesh.device_mesh.init_device_mesh], and
    torch's DeviceMesh methods on its meshes go through fmesh. Calling it again
    changes nothing. The Python processes this one starts from then on (Lightning's
    launcher, ``torch.multiprocessing.spawn``, ``subprocess`` runs of
    ``sys.executable``) are routed too: it sets ``FMESH_ROUTE=1``, which they
    inherit, and fmesh's ``.pth`` file routes every interpreter that starts with it.
    ``python -m fmesh.route SCRIPT`` routes as torch is imported.

    Raises:
        RuntimeError: this torch's ``init_device_mesh`` is not a plain Python function
            (fmesh cannot route it in place; the one-import drop-in still works).

    Example, one rank of a dry run on the fake backend:

    >>> import torch.distributed as dist
    >>> import fmesh
    >>> from fmesh.device_mesh import route, unroute
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> route()
    >>> fmesh.init_fake_world(8, 5)
    >>> dm = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    >>> fmesh.cache_stats().created  # fmesh made its groups
    2
    >>> unroute(); fmesh.destroy(); dist.destroy_process_group()
    """
    route_init_device_mesh(init_device_mesh)
    if routed():  # not inside `fmesh plan`, which routes its run its own way
        carry()


def unroute() -> None:
    """Undo [`route`][fmesh.device_mesh.route]: torch's ``init_device_mesh`` runs
    torch's own code again (the same function object, its code, defaults and
    attributes restored). Meshes made while routed keep fmesh's groups, and torch's
    methods on them still go through fmesh. The Python processes started after it are
    not routed (``FMESH_ROUTE`` is removed from the environment). Without a route
    before, it does nothing.

    Raises:
        RuntimeError: another library replaced the code of torch's ``init_device_mesh``
            after ``route()`` (fmesh leaves it as it is).
    """
    unroute_init_device_mesh()
    drop()
