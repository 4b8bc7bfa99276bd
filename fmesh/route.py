"""Run a script with torch's ``init_device_mesh`` routed through fmesh: zero lines changed.

::

    torchrun --nproc-per-node 8 -m fmesh.route train.py --steps 10
    python -m fmesh.route train.py --steps 10
    python -m fmesh.route -m package.train --steps 10

Before the script runs, ``fmesh.device_mesh.route()`` makes torch's own
``init_device_mesh`` (wherever it is held, in the script, its libraries and torch)
behave as the one-import drop-in, ``fmesh.device_mesh.init_device_mesh``; torch's
DeviceMesh methods on its meshes go through fmesh too. The script runs as Python runs
it (``runpy``): ``__name__ == "__main__"``, its arguments in ``sys.argv``, its folder
first on ``sys.path``, and its tracebacks without this runner's frames.
"""

import sys as _sys

from ._torch.route import main as _main

__all__: list[str] = []

if __name__ == "__main__":
    _sys.exit(_main(_sys.argv[1:]))
