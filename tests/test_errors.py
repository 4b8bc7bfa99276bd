"""A corpus of bad inputs: each raises the documented error with a useful message.

Messages are pinned on the parts a user needs: what was given, what was expected,
and how to fix it. ``pytest.raises`` also guarantees that no bad input returns a mesh.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from cases import bad, case

import fmesh
from fmesh import (
    AxisNotFoundError,
    Layout,
    Mesh,
    MeshError,
    UnrepresentableSplitError,
    make_mesh,
)

M = make_mesh({"dp": 2, "tp": 4})
VALID = re.escape("valid axis names are ['dp', 'tp']")
# A flattened (2,3):(6,1) axis: the DESIGN.md example of a split that is no layout.
AC = fmesh.flatten(make_mesh({"a": 2, "b": 2, "c": 3}), ("a", "c"), "ac")


CONSTRUCTION = [
    case(
        lambda: make_mesh((2, 2), ("a", "a")),
        MeshError,
        r"axis name 'a' appears more than once in \('a', 'a'\)",
        "duplicate names",
    ),
    case(
        lambda: make_mesh((2,), ("",)),
        MeshError,
        r"non-empty strings, got \(''.*name every axis",
        "empty name",
    ),
    case(lambda: make_mesh({"": 2}), MeshError, "non-empty strings", "empty name mapping"),
    case(
        lambda: make_mesh((0,), ("a",)),
        MeshError,
        r"axis 'a' has size 0; axis sizes must be >= 1",
        "zero size",
    ),
    case(
        lambda: make_mesh({"a": -2}),
        MeshError,
        r"axis 'a' has size -2; axis sizes must be >= 1",
        "negative size",
    ),
    case(
        lambda: make_mesh({"a": bad(True)}),
        TypeError,
        r"axis 'a' has size True of type bool; .* must be int",
        "bool size",
    ),
    case(
        lambda: make_mesh((bad(2.0),), ("a",)),
        TypeError,
        r"axis 'a' has size 2\.0 of type float",
        "float size",
    ),
    case(
        lambda: make_mesh((2, 2), ("a",)),
        MeshError,
        r"got 2 sizes \(2, 2\) but 1 names \('a',\); give one name per axis",
        "sizes and names differ in length",
    ),
    case(
        lambda: make_mesh((2,), bad("a")),
        TypeError,
        r"got the string 'a'; write \('a',\)",
        "names as a bare string",
    ),
    case(
        lambda: make_mesh((2,), (bad(1),)),
        TypeError,
        "axis names must be str, got 1 of type int",
        "name not a str",
    ),
    case(
        lambda: make_mesh(bad((2,))),
        TypeError,
        "needs axis_names when axis_sizes is a sequence",
        "sizes without names",
    ),
    case(
        lambda: make_mesh({"a": 2}, bad(("a",))),
        TypeError,
        "the mapping already names the axes",
        "mapping and names",
    ),
    case(
        lambda: make_mesh(bad(3)),
        TypeError,
        "axis_sizes must be a sequence of int or a mapping",
        "sizes not a sequence",
    ),
    # Rank maps.
    case(
        lambda: make_mesh((4,), ("a",), ranks=[0, 1, 1, 2]),
        MeshError,
        r"lists rank 1 more than once \(at indices \[1, 2\]\)",
        "duplicate ranks",
    ),
    case(
        lambda: make_mesh((4,), ("a",), ranks=[0, 1, -1, 2]),
        MeshError,
        "negative rank -1; global ranks are >= 0",
        "negative rank",
    ),
    case(
        lambda: make_mesh((4,), ("a",), ranks=[0, 1, 2]),
        MeshError,
        "ranks has 3 entries but .* has 4 positions",
        "too few ranks",
    ),
    case(
        lambda: make_mesh((2,), ("a",), ranks=[0, 1, 2]),
        MeshError,
        "ranks has 3 entries",
        "too many ranks",
    ),
    case(
        lambda: make_mesh((2,), ("a",), ranks=np.array([0.0, 1.0])),
        TypeError,
        "ranks must hold integers, got an array of dtype float64",
        "float rank array",
    ),
    case(
        lambda: make_mesh((2,), ("a",), ranks=[bad(True), False]),
        TypeError,
        "entries must be int, got True of type bool",
        "bool ranks",
    ),
    case(
        lambda: make_mesh((2,), ("a",), ranks=bad([0.0, 1.0])),
        TypeError,
        "entries must be int, got 0.0 of type float",
        "float ranks",
    ),
    case(
        lambda: make_mesh((2,), ("a",), ranks=bad("01")),
        TypeError,
        "ranks must be a sequence of int or an integer array, got '01'",
        "ranks str",
    ),
    case(
        lambda: Mesh.from_ranks(np.zeros((2, 2)), ("a", "b")),
        TypeError,
        "needs an integer array of global ranks, got dtype float64",
        "from_ranks floats",
    ),
    case(
        lambda: Mesh.from_ranks([[0, 1], [2, 3]], ("a",)),
        MeshError,
        r"2 dimensions \(shape \(2, 2\)\) but 1 axis names",
        "from_ranks ndim",
    ),
    case(
        lambda: Mesh.from_ranks(np.zeros((0, 2), dtype=int), ("a", "b")),
        MeshError,
        r"shape \(0, 2\) is empty",
        "from_ranks empty",
    ),
    case(
        lambda: Mesh.from_ranks([[0, 1], [1, 3]], ("a", "b")),
        MeshError,
        "lists rank 1 more than once",
        "from_ranks duplicates",
    ),
    case(
        lambda: Mesh.from_ranks([[0, 1], [-2, 3]], ("a", "b")),
        MeshError,
        "negative rank -2",
        "from_ranks negative",
    ),
    case(
        lambda: Mesh.from_ranks([0, 1], bad("a")),
        TypeError,
        "got the string 'a'",
        "from_ranks names str",
    ),
    # The Mesh constructor itself.
    case(
        lambda: Mesh(("x",), (Layout.of((8,)),), 8, (0, 1, 2, 3)),
        MeshError,
        "rank_map has 4 entries but the index space has 8",
        "identity rank_map too short",
    ),
    case(
        lambda: Mesh(("x",), (Layout.of((8,)),), 8, (3, 1, 2, 0)),
        MeshError,
        "rank_map has 4 entries but the index space has 8",
        "rank_map too short",
    ),
    case(
        lambda: Mesh(("x",), (Layout.of((4,)),), 4, bad([0, 1, 2, 3])),
        TypeError,
        "rank_map must be a tuple of int or None, got list; use make_mesh",
        "rank_map list",
    ),
    case(
        lambda: Mesh(("x", "y"), (Layout.of((4,)), Layout.of((2,), (2,))), 8),
        MeshError,
        r"not a valid mesh over 8 indices: .* overlap",
        "overlapping axes",
    ),
    case(
        lambda: Mesh(("x",), (Layout.of((4,)),), 6),
        MeshError,
        "does not tile an index space of size 6",
        "axes do not tile",
    ),
    case(
        lambda: Mesh(("x", "y"), (Layout.of((4,)),), 4),
        MeshError,
        "2 axis names .* but 1 layouts",
        "names and axes differ in length",
    ),
    case(
        lambda: Mesh(("x",), (bad((4,)),), 4),
        TypeError,
        "axes must be a tuple of fmesh.Layout",
        "axes not layouts",
    ),
    case(lambda: Mesh((), (), 0), MeshError, "index_size must be >= 1, got 0", "index 0"),
    case(lambda: Mesh((), (), bad(True)), TypeError, "index_size must be int", "index bool"),
    case(
        lambda: Mesh(bad(["x"]), (Layout.of((4,)),), 4),
        TypeError,
        "axis_names must be a tuple of str",
        "names list",
    ),
    # Layouts.
    case(
        lambda: Layout((2, 4), (4, 1)),
        MeshError,
        r"\(2,4\):\(4,1\) is not in canonical form \(it equals \(8\):\(1\)\); "
        r"build it with Layout\.of",
        "layout not canonical",
    ),
    case(
        lambda: Layout((1, 4), (3, 1)),
        MeshError,
        r"not in canonical form \(it equals \(4\):\(1\)\)",
        "layout with a size-1 mode",
    ),
    case(
        lambda: Layout(bad([2]), (1,)),
        TypeError,
        "Layout.shape must be a tuple of int",
        "layout list",
    ),
    case(lambda: Layout.of((0,)), MeshError, "mode of size 0", "layout size 0"),
    case(
        lambda: Layout.of((2,), (-1,)),
        MeshError,
        "stride -1 on a mode of size 2; strides must be positive",
        "negative stride",
    ),
    case(
        lambda: Layout.of((2, 3), (1,)),
        MeshError,
        r"different lengths \(2 vs 1\)",
        "layout lengths",
    ),
    case(lambda: Layout.of((bad(2.0),)), TypeError, "tuple of int", "layout float"),
]


UNKNOWN_AXIS = [
    pytest.param(lambda: fmesh.slice(M, "pp"), "slice", id="slice"),
    pytest.param(lambda: fmesh.slice(M, "dp", "pp"), "slice", id="slice second"),
    pytest.param(lambda: fmesh.flatten(M, ("dp", "pp")), "flatten", id="flatten"),
    pytest.param(lambda: fmesh.unflatten(M, "pp", {"x": 1}), "unflatten", id="unflatten"),
    pytest.param(lambda: fmesh.rename(M, {"pp": "x"}), "rename", id="rename"),
    pytest.param(lambda: fmesh.group(M, "pp", 0), "group", id="group"),
    pytest.param(lambda: M.axis_index("pp"), "Mesh.axis_index", id="axis_index"),
    pytest.param(lambda: M["pp"], "Mesh.__getitem__", id="getitem"),
    pytest.param(lambda: M["dp", "pp"], "Mesh.__getitem__", id="getitem second"),
]


@pytest.mark.parametrize(("call", "fn"), UNKNOWN_AXIS)
def test_unknown_axis(call: Callable[[], object], fn: str) -> None:
    with pytest.raises(
        AxisNotFoundError, match=rf"{re.escape(fn)}\(\): .*has no axis 'pp'; {VALID}"
    ) as info:
        call()
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, MeshError)
    assert isinstance(err, ValueError)


OPERATIONS = [
    case(
        lambda: fmesh.slice(M, bad(1)),
        TypeError,
        r"slice\(\) axis names must be str, got 1",
        "slice int name",
    ),
    case(
        lambda: fmesh.slice(M),
        MeshError,
        r"at least one axis name; valid names are \['dp', 'tp'\]",
        "slice nothing",
    ),
    case(
        lambda: fmesh.slice(M, "dp", "dp"),
        MeshError,
        "got axis 'dp' more than once",
        "slice twice",
    ),
    case(
        lambda: fmesh.flatten(M, bad("dp")),
        TypeError,
        r"takes a sequence of axis names, got 'dp'; write flatten\(mesh, \('dp', \.\.\.\)\)",
        "flatten bare string",
    ),
    case(lambda: fmesh.flatten(M, ()), MeshError, "at least one axis name", "flatten nothing"),
    case(
        lambda: fmesh.flatten(M, ("dp", "dp")),
        MeshError,
        "got axis 'dp' more than once",
        "flatten twice",
    ),
    case(
        lambda: fmesh.flatten(make_mesh({"a": 2, "b": 2, "c": 2}), ("a", "b"), "c"),
        MeshError,
        r"new axis 'c', but the mesh keeps an axis of that name; pass name=",
        "flatten name clash",
    ),
    case(
        lambda: fmesh.flatten(make_mesh({"a": 2, "b": 2, "a_b": 2}), ("a", "b")),
        MeshError,
        "new axis 'a_b', but the mesh keeps",
        "flatten default name clash",
    ),
    case(
        lambda: fmesh.flatten(M, ("dp",), bad(3)),
        TypeError,
        "name must be str, got 3",
        "flatten name int",
    ),
    case(lambda: fmesh.flatten(M, ("dp",), ""), MeshError, "non-empty", "flatten name empty"),
    case(
        lambda: fmesh.unflatten(M, "tp", {"dp": 2, "x": 2}),
        MeshError,
        r"new axis names \['dp'\] already name other axes",
        "unflatten name clash",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"x": 2, "y": 3}),
        MeshError,
        r"multiply to 6, but axis 'tp' has size 4; the sizes must multiply to 4",
        "unflatten wrong product",
    ),
    case(
        lambda: fmesh.unflatten(AC, "ac", {"x": 3, "y": 2}),
        UnrepresentableSplitError,
        r"cannot split axis 'ac' with layout \(2,3\):\(6,1\) into \{'x': 3, 'y': 2\}.*"
        r"that work: \(2, 3\)",
        "unflatten impossible split",
    ),
    case(
        lambda: fmesh.unflatten(AC, "ac", {"x": 3, "y": 1, "z": 2}),
        UnrepresentableSplitError,
        "cannot split axis 'ac'",
        "impossible split with 1",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", bad([("x", 4)])),
        TypeError,
        "sizes must be a mapping name -> size",
        "unflatten list",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {}),
        MeshError,
        "at least one new axis",
        "unflatten nothing",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"x": 0, "y": 4}),
        MeshError,
        "axis 'x' has size 0",
        "unflatten size 0",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"x": -1, "y": -4}),
        MeshError,
        "axis 'x' has size -1",
        "unflatten negative sizes",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"x": bad(True), "y": 4}),
        TypeError,
        "size True of type bool",
        "unflatten bool size",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"x": bad(2.0), "y": 2}),
        TypeError,
        "size 2.0 of type float",
        "unflatten float size",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {bad(1): 4}),
        TypeError,
        "new axis names must be str, got 1",
        "unflatten int name",
    ),
    case(
        lambda: fmesh.unflatten(M, "tp", {"": 4}),
        MeshError,
        "non-empty",
        "unflatten empty name",
    ),
    case(
        lambda: fmesh.rename(M, {"dp": "tp"}),
        MeshError,
        r"rename\(\{'dp': 'tp'\}\) .*axis name 'tp' appears more than once",
        "rename to an existing name",
    ),
    case(
        lambda: fmesh.rename(M, bad([("dp", "x")])),
        TypeError,
        "takes a mapping old -> new",
        "rename list",
    ),
    case(lambda: fmesh.rename(M, {"dp": ""}), MeshError, "non-empty", "rename to empty"),
    case(
        lambda: fmesh.rename(M, {"dp": bad(3)}),
        TypeError,
        "axis names must be str, got 3",
        "rename to int",
    ),
    # Queries.
    case(
        lambda: fmesh.group(M, "dp", 8),
        MeshError,
        r"group\(\): rank 8 is not in Mesh\(dp=2, tp=4\), which covers ranks 0\.\.7",
        "group rank out of range",
    ),
    case(
        lambda: fmesh.group(make_mesh((2,), ("a",), ranks=[3, 5]), "a", 4),
        MeshError,
        "rank 4 is not in .* the ranks in its rank_map",
        "group rank not in rank map",
    ),
    case(
        lambda: fmesh.instance(M, 8),
        MeshError,
        r"instance\(\): rank 8 is not in",
        "instance rank out of range",
    ),
    case(
        lambda: fmesh.group(M, "dp", -1),
        MeshError,
        r"group\(\) got rank -1; global ranks are >= 0",
        "group negative rank",
    ),
    case(
        lambda: fmesh.coordinate(M, -1),
        MeshError,
        r"coordinate\(\) got rank -1; global ranks are >= 0",
        "coordinate negative rank",
    ),
    case(
        lambda: fmesh.instance(M, -3),
        MeshError,
        r"instance\(\) got rank -3",
        "instance negative rank",
    ),
    case(
        lambda: fmesh.coordinate(M, bad(True)),
        TypeError,
        r"coordinate\(\) rank must be int, got True",
        "coordinate bool rank",
    ),
    case(
        lambda: fmesh.group(M, "dp", bad(1.0)),
        TypeError,
        r"group\(\) rank must be int, got 1\.0",
        "group float rank",
    ),
    # Not a mesh.
    case(
        lambda: fmesh.slice(bad("m"), "dp"),
        TypeError,
        r"slice\(\) needs an fmesh\.Mesh, got str",
        "slice non-mesh",
    ),
    case(
        lambda: fmesh.flatten(bad(None), ("dp",)),
        TypeError,
        r"flatten\(\) needs an fmesh\.Mesh, got NoneType",
        "flatten non-mesh",
    ),
    case(
        lambda: fmesh.unflatten(bad({}), "dp", {"a": 2}),
        TypeError,
        r"unflatten\(\) needs an fmesh\.Mesh, got dict",
        "unflatten non-mesh",
    ),
    case(
        lambda: fmesh.rename(bad(1), {}),
        TypeError,
        r"rename\(\) needs an fmesh\.Mesh, got int",
        "rename non-mesh",
    ),
    case(
        lambda: fmesh.coordinate(bad(np.zeros(2)), 0),
        TypeError,
        r"coordinate\(\) needs an fmesh\.Mesh, got ndarray",
        "coordinate non-mesh",
    ),
    case(
        lambda: fmesh.group(bad(M.axes[0]), "dp", 0),
        TypeError,
        r"group\(\) needs an fmesh\.Mesh, got Layout",
        "group non-mesh",
    ),
    case(
        lambda: fmesh.instance(bad("x"), 0),
        TypeError,
        r"instance\(\) needs an fmesh\.Mesh, got str",
        "instance non-mesh",
    ),
    case(
        lambda: fmesh.instances(bad(3)),
        TypeError,
        r"instances\(\) needs an fmesh\.Mesh, got int",
        "instances non-mesh",
    ),
    case(
        lambda: fmesh.flatten(M, bad("dp,tp")),
        TypeError,
        r"got 'dp,tp'; write flatten\(mesh, \('dp', 'tp'\)\)$",
        "flatten comma string",
    ),
    case(
        lambda: M[bad(0)],
        TypeError,
        r"mesh\[\.\.\.\] takes axis names, got 0 of type int; write mesh\['dp'\]",
        "getitem int",
    ),
    case(
        lambda: M[bad(["dp", "tp"])],
        TypeError,
        r"got \['dp', 'tp'\] of type list; write mesh\['dp'\] or mesh\['dp', 'tp'\]",
        "getitem list",
    ),
    case(
        lambda: M[()],
        MeshError,
        r"Mesh.__getitem__\(\) needs at least one axis name; valid names are \['dp', 'tp'\]",
        "getitem nothing",
    ),
    case(
        lambda: M["tp", "tp"],
        MeshError,
        r"Mesh.__getitem__\(\) got axis 'tp' more than once in \('tp', 'tp'\)",
        "getitem twice",
    ),
    case(
        lambda: M[bad(("dp", 1))],
        TypeError,
        r"Mesh.__getitem__\(\) axis names must be str, got 1 of type int",
        "getitem tuple with int",
    ),
    case(
        lambda: fmesh.rank_at(M, (1,)),
        MeshError,
        r"rank_at\(\): coordinate \(1,\) has 1 entries but Mesh\(dp=2, tp=4\) has 2 axes",
        "rank_at short coordinate",
    ),
    case(
        lambda: fmesh.rank_at(M, (1, 4)),
        MeshError,
        r"rank_at\(\): coordinate 4 along axis 'tp' is outside 0..3; the axis has size 4",
        "rank_at out of range",
    ),
    case(
        lambda: fmesh.rank_at(M, (0, 0), instance=1),
        MeshError,
        r"rank_at\(\): instance 1 does not exist; Mesh\(dp=2, tp=4\) has 1 instance \(0..0\)",
        "rank_at instance",
    ),
    case(
        lambda: fmesh.rank_at(M, bad("01")),
        TypeError,
        r"rank_at\(\) takes a coordinate as a sequence of int, got '01'; e.g. rank_at\(mesh, "
        r"\(0, 0\)\)",
        "rank_at string",
    ),
    case(
        lambda: fmesh.rank_at(M, (0, bad(1.0))),
        TypeError,
        r"rank_at\(\) coordinate entries must be int, got 1.0 for axis 'tp'",
        "rank_at float",
    ),
    case(
        lambda: fmesh.rank_at(bad({"dp": 2}), (0,)),
        TypeError,
        r"rank_at\(\) needs an fmesh\.Mesh, got dict",
        "rank_at non-mesh",
    ),
]


@pytest.mark.parametrize(("call", "error", "match"), CONSTRUCTION + OPERATIONS)
def test_bad_input_raises(
    call: Callable[[], object], error: type[BaseException], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        call()
    if issubclass(error, MeshError):
        assert isinstance(info.value, ValueError)
    assert type(info.value) is error


def test_absent_rank_is_not_an_error_for_coordinate() -> None:
    # The contract: coordinate() answers None for a rank outside the mesh.
    assert fmesh.coordinate(M, 8) is None
    assert fmesh.coordinate(make_mesh((2,), ("a",), ranks=[3, 5]), 4) is None


def test_error_hierarchy() -> None:
    assert issubclass(MeshError, ValueError)
    for cls in (
        AxisNotFoundError,
        UnrepresentableSplitError,
        fmesh.MeshMismatchError,
        fmesh.LaunchError,
    ):
        assert issubclass(cls, MeshError)
    assert issubclass(AxisNotFoundError, KeyError)
    # str() is the message, not KeyError's quoted repr of it.
    assert str(AxisNotFoundError("no axis 'x'")) == "no axis 'x'"
