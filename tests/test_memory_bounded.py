"""Memory is bounded by what is live: thousands of roots with distinct dim names, built
and dropped one after the other on a fake world, leave the memo's tables (the stream's
calls, the rank space's meshes) at a bounded size, and Python memory flat. A repeat of
a call whose entry was dropped is still a hit (it creates nothing, agrees with nobody).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

from _dist import run_spawn

WORLD = 8
ROOTS = 2000


def _sizes() -> dict[str, int]:
    from fmesh._runtime.memo import state
    from fmesh._torch import interop, routing

    with state.lock:
        calls = sum(len(s.calls) for s in state.streams.values())
        known = sum(len(s.known) for s in state.streams.values())
    return {
        "calls": calls,
        "known": known,
        "meshes": sum(len(s._meshes) for s in routing._spaces.values()),
        "named": sum(len(n) for n in interop.state.named_axes.values()),
        "device_meshes": len(interop.state.device_meshes),
        "axis_memo": len(state.axis_memo),
    }


def roots_job(_: int, __: int) -> dict[str, Any]:
    import fmesh
    from fmesh.device_mesh import init_device_mesh

    fmesh.init_fake_world(WORLD, 3)
    first = fmesh.make_mesh({"first_a": 2, "first_b": 4})
    fmesh.realize(first)
    out: dict[str, Any] = {}
    tracemalloc.start()
    for i in range(ROOTS):
        dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=(f"a{i}", f"b{i}"))
        dm._flatten(f"f{i}")
        dm._unflatten(1, (2, 2), (f"x{i}", f"y{i}"))
        del dm
        if i == ROOTS // 2:
            gc.collect()
            out["half"] = (_sizes(), tracemalloc.get_traced_memory()[0])
    gc.collect()
    out["end"] = (_sizes(), tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    # The very first call's entry went long ago: its repeat is still a hit.
    again = fmesh.realize(first)
    out["first_again"] = {"created": again.created, "calls": _sizes()["calls"]}
    return out


def test_tables_stay_bounded_over_thousands_of_roots(tmp_path: Path) -> None:
    from fmesh._runtime.bounded import KEPT

    out = run_spawn(roots_job, 1, tmp_path=tmp_path, launch_env=False, timeout=300).values()[0]
    half, end = out["half"][0], out["end"][0]
    # 3 calls and 2 meshes per root: unbounded, they would be 6000 and 4000 by now.
    assert end["calls"] <= KEPT < 3 * ROOTS, out
    assert end["meshes"] <= KEPT < 2 * ROOTS, out
    # Same shapes under other names: the same axes, groups and memo entries.
    assert end["known"] == half["known"] and end["axis_memo"] == half["axis_memo"], out
    assert end["named"] == half["named"] and end["device_meshes"] == half["device_meshes"]
    # Python memory flat over the second thousand roots (it grew ~4.5 MB per 1000).
    assert out["end"][1] - out["half"][1] < 1_000_000, out
    assert out["first_again"]["created"] == 0, out
