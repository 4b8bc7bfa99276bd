"""Host analysis (``host_report``) and host-aware construction (``make_hybrid_mesh``),
checked against brute force: groups listed rank by rank, meshes built with numpy."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
from bruteforce import model_of
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import MeshSpec, Op, build_chain, derived_specs, hybrid_shapes

import fmesh
from fmesh import (
    AxisHosts,
    AxisNotFoundError,
    HostReport,
    MeshError,
    host_report,
    make_hybrid_mesh,
    make_mesh,
)


@settings(max_examples=150, deadline=None)
@given(drawn=derived_specs(), host=st.integers(1, 40))
def test_host_report_matches_brute_force(
    drawn: tuple[MeshSpec, tuple[Op, ...]], host: int
) -> None:
    spec, chain = drawn
    mesh, model = build_chain(spec, chain), model_of(spec, chain)
    report = host_report(mesh, host)
    assert report.ranks_per_host == host
    assert report.axis_names == model.names
    per_host = Counter(int(r) // host for r in model.rank_map.tolist())
    assert report.hosts == len(per_host)
    assert report.partly_filled == sum(1 for n in per_host.values() if n < host)
    crossing_axes = []
    for name, entry in zip(model.names, report.axes, strict=True):
        groups = model.groups(name)
        crossing = sum(1 for g in groups if len({r // host for r in g}) > 1)
        assert entry == AxisHosts(name, len(groups[0]), len(groups), crossing)
        assert report[name] is entry
        expected = (
            "intra-host"
            if crossing == 0
            else "cross-host"
            if crossing == len(groups)
            else "mixed"
        )
        assert entry.placement == expected
        assert entry.crosses_hosts == (crossing > 0)
        if crossing:
            crossing_axes.append(name)
    assert report.cross_host_axes == tuple(crossing_axes)


def test_host_report_of_a_huge_mesh_needs_no_listing() -> None:
    # 2**40 ranks on hosts of 8: only the per-host counting path can answer this.
    report = host_report(make_mesh({"pp": 2**20, "dp": 2**17, "tp": 8}), 8)
    assert report.hosts == 2**37 and report.partly_filled == 0
    assert report.cross_host_axes == ("pp", "dp")
    assert report["tp"] == AxisHosts("tp", 8, 2**37, 0)


def expected_hybrid(
    intra: tuple[int, ...], inter: tuple[int, ...]
) -> np.ndarray[tuple[int, ...], np.dtype[np.int64]]:
    """JAX's hybrid layout with numpy: host-major ranks, inter part major per axis."""
    per_host, hosts = math.prod(intra), math.prod(inter)
    ranks = np.arange(per_host * hosts, dtype=np.int64).reshape(*inter, *intra)
    k = len(intra)
    order = [j for i in range(k) for j in (i, k + i)]
    return ranks.transpose(order).reshape([a * b for a, b in zip(inter, intra, strict=True)])


@settings(max_examples=100, deadline=None)
@given(hybrid_shapes())
def test_make_hybrid_mesh_matches_numpy(
    drawn: tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]],
) -> None:
    names, intra, inter = drawn
    mesh = make_hybrid_mesh(intra, inter, names)
    assert mesh.axis_names == names
    assert mesh.num_instances == 1
    assert np.array_equal(fmesh.instances(mesh)[0], expected_hybrid(intra, inter))
    mapped = make_hybrid_mesh(
        dict(zip(names, intra, strict=True)),
        {n: s for n, s in zip(names, inter, strict=True) if s != 1},
    )
    assert mapped == mesh
    # The point of it: an axis stays inside a host exactly when its inter part is 1.
    report = host_report(mesh, math.prod(intra))
    assert report.hosts == math.prod(inter)
    for name, across in zip(names, inter, strict=True):
        assert report[name].crosses_hosts == (across > 1)
        assert report[name].placement == ("intra-host" if across == 1 else "cross-host")


def test_make_hybrid_mesh_like_jax() -> None:
    # create_hybrid_device_mesh((1, 8), (4, 1)): four hosts of 8, one host per row.
    mesh = make_hybrid_mesh((1, 8), (4, 1), ("dp", "tp"))
    assert mesh == make_mesh({"dp": 4, "tp": 8})
    # tp split across 2 hosts of 8, dp inside a host.
    split = make_hybrid_mesh({"dp": 2, "tp": 4}, {"tp": 2})
    assert fmesh.instances(split)[0].tolist() == [
        [0, 1, 2, 3, 8, 9, 10, 11],
        [4, 5, 6, 7, 12, 13, 14, 15],
    ]
    assert host_report(split, 8).cross_host_axes == ("tp",)
    # The result is an ordinary mesh: slice, flatten and unflatten work on it.
    tp = fmesh.unflatten(split, "tp", {"node": 2, "gpu": 4})
    assert fmesh.group(tp, "gpu", 9) == (8, 9, 10, 11)
    assert fmesh.group(tp, "node", 9) == (1, 9)


def test_a_single_host() -> None:
    report = host_report(make_mesh({"dp": 2, "tp": 2}), 8)
    assert (report.hosts, report.partly_filled, report.cross_host_axes) == (1, 1, ())


BAD_CALLS = [
    (
        lambda: host_report(make_mesh({"dp": 2}), 0),
        MeshError,
        r"host_report\(\): ranks_per_host is 0; expected the number of ranks on one host",
    ),
    (
        lambda: host_report(make_mesh({"dp": 2}), True),
        TypeError,
        r"ranks_per_host must be int, got True",
    ),
    (
        lambda: host_report({"dp": 2}, 8),  # type: ignore[arg-type]  # on purpose
        TypeError,
        r"host_report\(\) needs an fmesh.Mesh, got dict",
    ),
    (
        lambda: host_report(make_mesh({"dp": 2}), 8)["tp"],
        AxisNotFoundError,
        re.escape("HostReport has no axis 'tp'; valid axis names are ['dp']"),
    ),
    (
        lambda: make_hybrid_mesh({"dp": 2}, {"pp": 2}),
        MeshError,
        re.escape("inter_host names axes ['pp'] that intra_host {'dp': 2} lacks")
        + ".*size 1 for an axis that only spans hosts, e.g. {'pp': 1, ...}",
    ),
    (
        lambda: make_hybrid_mesh((2, 4), (2,), ("dp", "tp")),
        MeshError,
        r"got 2 intra-host sizes \(2, 4\), 1 inter-host sizes \(2,\) and 2 names",
    ),
    (
        lambda: make_hybrid_mesh((2,), (2,)),  # type: ignore[call-overload]  # on purpose
        TypeError,
        r"needs axis_names when the sizes are sequences",
    ),
    (
        lambda: make_hybrid_mesh({"dp": 2}, (2,)),  # type: ignore[call-overload]  # on purpose
        TypeError,
        r"intra_host as a mapping but inter_host as a sequence",
    ),
    (
        lambda: make_hybrid_mesh({"dp": 2}, {"dp": 2}, ("dp",)),  # type: ignore[call-overload]  # on purpose
        TypeError,
        r"mapping already names the axes, so drop axis_names",
    ),
    (
        lambda: make_hybrid_mesh({"dp": 0}, {}),
        MeshError,
        r"axis 'dp' has size 0; axis sizes must be >= 1",
    ),
    (
        lambda: make_hybrid_mesh({"dp": 2}, {"dp": 1.5}),  # type: ignore[dict-item]  # on purpose
        TypeError,
        r"axis 'dp' has size 1.5 of type float",
    ),
    (
        lambda: make_hybrid_mesh("dp", {}),  # type: ignore[call-overload]  # on purpose
        TypeError,
        r"intra_host must be a mapping name -> size or a sequence of int, got 'dp'",
    ),
]


@pytest.mark.parametrize(("call", "error", "match"), BAD_CALLS)
def test_bad_arguments(call: object, error: type[Exception], match: str) -> None:
    assert callable(call)
    with pytest.raises(error, match=match):
        call()


def test_report_is_a_frozen_value() -> None:
    report = host_report(make_mesh({"dp": 2, "tp": 8}), 8)
    assert isinstance(report, HostReport)
    assert report == host_report(make_mesh({"dp": 2, "tp": 8}), 8)
    assert hash(report) == hash(host_report(make_mesh({"dp": 2, "tp": 8}), 8))
