"""torch's ``init_device_mesh``, built on fmesh: adopt fmesh by changing one import,
or none.

::

    # from torch.distributed.device_mesh import init_device_mesh
    from fmesh.device_mesh import init_device_mesh

or, with no line changed, ``torchrun ... -m fmesh.route train.py`` (``route()`` in
code): torch's own ``init_device_mesh`` behaves as this one for the whole process.

A public submodule of fmesh, a thin module over private code (as
``jax.sharding``). ``init_device_mesh`` takes torch's arguments and returns a torch
``DeviceMesh`` that behaves as the one torch builds, made by ``make_mesh`` ->
``realize`` -> ``to_device_mesh``: each rank creates only its own groups, each group
once per process, ranks that disagree get an error instead of a hang, and a repeated
call is a memo hit. Where torch raises ``RuntimeError``, it raises
``DeviceMeshError`` (also a ``RuntimeError`` and an ``fmesh.MeshError``).
"""

from ._core.errors import DeviceMeshError as DeviceMeshError
from ._core.errors import DeviceMeshTypeError as DeviceMeshTypeError
from ._torch.dropin import init_device_mesh as init_device_mesh
from ._torch.route import route as route
from ._torch.route import unroute as unroute

__all__ = ["DeviceMeshError", "DeviceMeshTypeError", "init_device_mesh", "route", "unroute"]
