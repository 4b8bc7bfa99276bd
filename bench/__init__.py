"""Benchmarks of fmesh against torch's ``DeviceMesh``, side by side in one run.

Run from the repository root: ``python -m bench`` (see :mod:`bench.cli`). Every figure
is fmesh vs torch, measured in the same run, medians of repeats; ratio = torch / fmesh,
so above 1 means fmesh is faster or smaller.

* :mod:`bench.cases` -- every benchmark as one table: runner, worker, sizes, rows;
* :mod:`bench.runners` -- how a case runs (fresh fake-world processes, real gloo jobs,
  the store load) and how its rows are read; :mod:`bench.launch` -- the processes;
* :mod:`bench.work`, :mod:`bench.jobs`, :mod:`bench.titan` -- what is measured;
  :mod:`bench.torch_ref` -- torch's side (the only module using private torch names);
* :mod:`bench.store_load` -- one TCPStore server and thousands of simulated ranks
  (``docs/design/store-load.md``); :mod:`bench.counting` -- store requests on the wire;
* :mod:`bench.soak` -- leaks and crash rates on 4 gloo ranks (``python -m bench.soak``).
"""
