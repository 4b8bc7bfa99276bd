"""Run a script with torch's ``init_device_mesh`` routed through fmesh: zero lines changed.

::

    torchrun --nproc-per-node 8 -m fmesh.route train.py --steps 10
    python -m fmesh.route train.py --steps 10
    python -m fmesh.route -m package.train --steps 10

As torch is imported, ``fmesh.device_mesh.route()`` makes torch's own
``init_device_mesh`` (wherever it is held, in the script, its libraries and torch)
behave as the one-import drop-in, ``fmesh.device_mesh.init_device_mesh``; torch's
DeviceMesh methods on its meshes go through fmesh too, and so do the Python processes
the script starts (``FMESH_ROUTE=1``). The script runs exactly as ``python SCRIPT``
runs it (a directory or zip file with a ``__main__.py`` too, and ``-m MODULE`` as
``python -m``): it is ``sys.modules["__main__"]``, with Python's ``sys.argv``,
``sys.path``, ``__spec__``, ``__loader__`` and ``__package__``, and its tracebacks and
exit status are Python's, without this runner's frames.
"""

import sys as _sys

from ._cli.route import main as _main

__all__: list[str] = []

if __name__ == "__main__":
    _sys.exit(_main(_sys.argv[1:]))
