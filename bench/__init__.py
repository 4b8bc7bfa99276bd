"""Benchmarks of fmesh against torch's ``DeviceMesh``, side by side in one run.

Run from the repository root: ``python -m bench`` (see :mod:`bench.cli`). Every
figure is fmesh vs torch, measured in the same run, medians of repeats; ratio =
torch / fmesh, so above 1 means fmesh is faster or smaller.

One module per subject, each declaring its rows as data:

* :mod:`bench.pure` -- pure operations (no process group for fmesh);
* :mod:`bench.fake` -- realize on torch's ``fake`` backend (large worlds), and
  ``to_device_mesh`` of a sub-mesh;
* :mod:`bench.hits` -- memo hits against torch slicing its own mesh (fake backend;
  the same workload is a phase of the gloo jobs);
* :mod:`bench.gloo` -- realize on real gloo processes (the bench's own launcher);
* :mod:`bench.store_load` -- what a creating call's agreement costs one TCPStore
  server, at up to 1024 simulated ranks (fmesh's agreement vs torch's store barrier);
* :mod:`bench.dropin` -- ``fmesh.device_mesh.init_device_mesh`` against torch's
  ``init_device_mesh``: the first call and the same call again (fake and gloo);
* :mod:`bench.memory` -- size of a mesh value and of a realized mesh;
* :mod:`bench.titan` -- torchtitan's ``ParallelDims.build_mesh`` through the
  one-import change (fmesh's ``init_device_mesh``, torch's methods after it)
  against torch (fake and gloo); ``python -m bench --section titan`` alone;

with :mod:`bench.shared` (shapes, rows, timing, formatting), :mod:`bench.launch`
(fresh processes), :mod:`bench.counting` (store requests as they go on the wire),
:mod:`bench.recipes` (the meshes a trainer builds, for both libraries),
:mod:`bench.torch_ref` (torch's side; the only bench module using private torch
names) and :mod:`bench.report` (the tables and the section of
``docs/benchmarks.md``).
"""
