"""``Mesh.to_json`` / ``Mesh.from_json``: an exact round trip and clear errors."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from bruteforce import check_mesh, model_of
from hypothesis import given, settings
from strategies import MeshSpec, Op, build_chain, derived_specs

import fmesh
from fmesh import Mesh, MeshError, make_mesh


@settings(max_examples=100, deadline=None)
@given(derived_specs())
def test_round_trip_is_exact(drawn: tuple[MeshSpec, tuple[Op, ...]]) -> None:
    spec, chain = drawn
    mesh = build_chain(spec, chain)
    text = mesh.to_json()
    back = Mesh.from_json(text)
    assert back == mesh and hash(back) == hash(mesh)
    assert back.rank_map == mesh.rank_map and back.axes == mesh.axes
    assert back.to_json() == text
    # The mesh read back answers every query like the brute-force model of the chain.
    check_mesh(back, model_of(spec, chain))


@settings(max_examples=60, deadline=None)
@given(derived_specs())
def test_schema(drawn: tuple[MeshSpec, tuple[Op, ...]]) -> None:
    spec, chain = drawn
    mesh = build_chain(spec, chain)
    payload = json.loads(mesh.to_json())
    assert list(payload) == ["fmesh_mesh", "axes", "index_size", "rank_map"]
    assert payload["fmesh_mesh"] == 1
    assert [a["name"] for a in payload["axes"]] == list(mesh.axis_names)
    for entry in payload["axes"]:
        assert list(entry) == ["name", "shape", "stride"]
        # Each axis lists the indices of its first group, in coordinate order.
        values = [0]
        for size, stride in zip(entry["shape"], entry["stride"], strict=True):
            values = [v + k * stride for v in values for k in range(size)]
        pos = mesh.axis_names.index(entry["name"])
        assert values == mesh.axes[pos].values()
    ranks = spec.rank_list()
    is_identity = ranks == list(range(len(ranks)))
    if payload["rank_map"] is None:
        assert is_identity
    else:
        assert payload["rank_map"] == ranks and not is_identity


def test_example_text() -> None:
    mesh = make_mesh({"dp": 2, "tp": 2}, ranks=[3, 2, 1, 0])
    text = (
        '{"fmesh_mesh": 1, "axes": [{"name": "dp", "shape": [2], "stride": [2]}, '
        '{"name": "tp", "shape": [2], "stride": [1]}], "index_size": 4, '
        '"rank_map": [3, 2, 1, 0]}'
    )
    assert mesh.to_json() == text
    assert Mesh.from_json(text) == mesh
    # Hand-written layouts are canonicalized: (2,2):(2,1) is (4):(1).
    loose = (
        '{"fmesh_mesh":1,"axes":[{"name":"w","shape":[2,2],"stride":[2,1]}],'
        '"index_size":4,"rank_map":null}'
    )
    assert Mesh.from_json(loose) == make_mesh({"w": 4})


def _with(**changes: Any) -> str:
    payload: dict[str, Any] = json.loads(make_mesh({"dp": 2, "tp": 2}).to_json())
    for key, value in changes.items():
        if value is _DROP:
            del payload[key]
        else:
            payload[key] = value
    return json.dumps(payload)


_DROP = object()
_AXIS = {"name": "dp", "shape": [2], "stride": [1]}

BAD_TEXT = [
    ("dp=2,tp=4", r"the text 'dp=2,tp=4' is not JSON \(Expecting value"),
    ("", r"the text '' is not JSON"),
    ("[1, 2]", r"the JSON is a list, not an object"),
    ('{"axes": []}', r"the object has no 'fmesh_mesh' version field"),
    (_with(fmesh_mesh=2), r"schema version 2 is not supported; this fmesh reads version 1"),
    (_with(fmesh_mesh="1"), r"schema version '1' is not supported"),
    (_with(fmesh_mesh=True), r"schema version True is not supported"),
    (_with(rank_map=_DROP), r"the object lacks \['rank_map'\]; its fields are"),
    (_with(extra=1), r"the object has unknown fields \['extra'\]"),
    (_with(axes={"dp": 2}), r"'axes' is \{'dp': 2\}, not a list of axis objects"),
    (_with(axes=[[2]]), r"axes\[0\] is \[2\], not an object"),
    (_with(axes=[{"name": "dp", "shape": [2]}]), r"axes\[0\] lacks \['stride'\]"),
    (_with(axes=[{**_AXIS, "size": 2}]), r"axes\[0\] has unknown fields \['size'\]"),
    (_with(axes=[{**_AXIS, "name": 3}]), r"axes\[0\].name is 3, not a string"),
    (
        _with(axes=[{**_AXIS, "shape": [2.0]}]),
        r"axes\[0\].shape is \[2.0\], not a list of int",
    ),
    (_with(axes=[{**_AXIS, "stride": [True]}]), r"axes\[0\].stride is \[True\], not a list"),
    (_with(axes=[{**_AXIS, "stride": [0]}]), r"axis 'dp' is no layout: .*strides must be"),
    (_with(index_size="4"), r"'index_size' is '4', not an integer"),
    (_with(rank_map=[0, 1, 2, "3"]), r"'rank_map' is \[0, 1, 2, '3'\], not a list"),
    (
        _with(rank_map=[0, 1, 1, 2]),
        r"the JSON describes no valid mesh: rank_map lists rank 1 more than once",
    ),
    (
        _with(index_size=6),
        r"the JSON describes no valid mesh: axes .* are not a valid mesh over 6",
    ),
    (
        _with(axes=[_AXIS, {"name": "dp", "shape": [2], "stride": [2]}]),
        r"the JSON describes no valid mesh: axis name 'dp' appears more than once",
    ),
]


@pytest.mark.parametrize(("text", "match"), BAD_TEXT)
def test_bad_text_raises_mesh_error(text: str, match: str) -> None:
    with pytest.raises(MeshError, match=r"^Mesh\.from_json\(\): " + match):
        Mesh.from_json(text)


def test_not_json_errors_show_an_example() -> None:
    with pytest.raises(MeshError, match=re.escape('e.g. {"fmesh_mesh": 1, "axes": [{')):
        Mesh.from_json("{")


def test_wrong_types() -> None:
    with pytest.raises(TypeError, match=r"takes a str, got bytes; decode bytes first"):
        Mesh.from_json(b"{}")  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(TypeError, match=r"takes a str, got dict$"):
        Mesh.from_json({})  # type: ignore[arg-type]  # the wrong type on purpose


def test_a_large_rank_map_round_trips() -> None:
    ranks = list(range(2**16 - 1, -1, -1))
    mesh = fmesh.flatten(make_mesh({"a": 2**8, "b": 2**8}, ranks=ranks), ("b", "a"))
    assert Mesh.from_json(mesh.to_json()) == mesh
