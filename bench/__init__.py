"""Benchmarks of fmesh against torch's ``DeviceMesh``, side by side in one run.

Run from the repository root: ``python -m bench`` (see :mod:`bench.cli`). Every figure
is fmesh vs torch, measured in the same run, medians of repeats; ratio = torch / fmesh,
so above 1 means fmesh is faster or smaller.

* :mod:`bench.cases` -- every benchmark as one table: worker, sizes, rows;
* :mod:`bench.runners` -- how a case runs (fake backend, real gloo, store load) and
  how its rows are read;
* :mod:`bench.workloads`, :mod:`bench.jobs`, :mod:`bench.titan` -- what is measured, on
  the fake backend, on real gloo, and torchtitan's ``build_mesh``;
* :mod:`bench.store_load` and :mod:`bench.store_ranks` -- one TCPStore server and
  thousands of simulated ranks (``docs/design/store-load.md``);
* :mod:`bench.torch_ref` -- torch's side (the only bench module using private torch
  names); :mod:`bench.counting` -- store requests as they go on the wire;
* :mod:`bench.launch` (fresh processes), :mod:`bench.shared` (shapes, rows, timing),
  :mod:`bench.report` (the tables and the section of ``docs/benchmarks.md``);
* :mod:`bench.soak` -- leaks and crashes on 4 gloo ranks (``python -m bench.soak``).
"""
