"""The JSON form of a mesh (``Mesh.to_json`` / ``Mesh.from_json``): versioned, exact.

Works on a mesh's fields, so it needs no ``Mesh``: ``loads`` checks the schema and
returns the fields, and the ``Mesh`` constructor validates them as a mesh.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .checks import is_int
from .errors import MeshError
from .layout import Layout

__all__ = ["JSON_VERSION", "Fields", "dumps", "loads"]

Fields = tuple[tuple[str, ...], tuple[Layout, ...], int, "tuple[int, ...] | None"]
"""(axis names, axes, index size, rank map): what ``Mesh(...)`` takes."""


JSON_VERSION = 1
"""The schema version ``Mesh.to_json`` writes and ``Mesh.from_json`` reads."""
_VERSION_KEY = "fmesh_mesh"
_FIELDS = (_VERSION_KEY, "axes", "index_size", "rank_map")
_AXIS_FIELDS = ("name", "shape", "stride")
_JSON_EXAMPLE = (
    '{"fmesh_mesh": 1, "axes": [{"name": "dp", "shape": [2], "stride": [1]}], '
    '"index_size": 2, "rank_map": null}'
)


def _bad_json(what: str) -> MeshError:
    return MeshError(
        f"Mesh.from_json(): {what}; expected the text Mesh.to_json() writes, "
        f"e.g. {_JSON_EXAMPLE}"
    )


def _json_payload(text: str) -> dict[str, object]:
    """The checked top-level object: the version and the set of fields."""
    try:
        payload: object = json.loads(text)
    except ValueError as err:  # json.JSONDecodeError, or a recursion/overflow refusal
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise _bad_json(f"the text {shown!r} is not JSON ({err})") from None
    if not isinstance(payload, dict):
        raise _bad_json(f"the JSON is a {type(payload).__name__}, not an object")
    if _VERSION_KEY not in payload:
        raise _bad_json(f"the object has no {_VERSION_KEY!r} version field")
    version = payload[_VERSION_KEY]
    if not is_int(version) or version != JSON_VERSION:
        raise MeshError(
            f"Mesh.from_json(): schema version {version!r} is not supported; this "
            f"fmesh reads version {JSON_VERSION} (write the text with the same or an "
            "older fmesh, or upgrade fmesh)"
        )
    _check_fields(payload, _FIELDS, "the object")
    return payload


def _check_fields(obj: dict[str, object], fields: tuple[str, ...], where: str) -> None:
    missing = [f for f in fields if f not in obj]
    extra = sorted(str(k) for k in obj if k not in fields)
    if missing or extra:
        parts = ([f"lacks {missing}"] if missing else []) + (
            [f"has unknown fields {extra}"] if extra else []
        )
        raise _bad_json(f"{where} {' and '.join(parts)}; its fields are {list(fields)}")


def _int_list(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise _bad_json(f"{where} is {value!r}, not a list of integers")
    return tuple(value)


def _fields(payload: dict[str, object]) -> Fields:
    raw_axes = payload["axes"]
    if not isinstance(raw_axes, list):
        raise _bad_json(f"'axes' is {raw_axes!r}, not a list of axis objects")
    names: list[str] = []
    layouts: list[Layout] = []
    for k, axis in enumerate(raw_axes):
        if not isinstance(axis, dict):
            raise _bad_json(f"axes[{k}] is {axis!r}, not an object")
        _check_fields(axis, _AXIS_FIELDS, f"axes[{k}]")
        name = axis["name"]
        if not isinstance(name, str):
            raise _bad_json(f"axes[{k}].name is {name!r}, not a string")
        shape = _int_list(axis["shape"], f"axes[{k}].shape")
        stride = _int_list(axis["stride"], f"axes[{k}].stride")
        try:
            layouts.append(Layout.of(shape, stride))
        except MeshError as err:
            raise _bad_json(f"axis {name!r} is no layout: {err}") from None
        names.append(name)
    index_size = payload["index_size"]
    if not isinstance(index_size, int) or isinstance(index_size, bool):
        raise _bad_json(f"'index_size' is {index_size!r}, not an integer")
    raw_map = payload["rank_map"]
    rank_map = None if raw_map is None else _int_list(raw_map, "'rank_map'")
    return tuple(names), tuple(layouts), index_size, rank_map


def dumps(
    names: Sequence[str],
    axes: Sequence[Layout],
    index_size: int,
    rank_map: Sequence[int] | None,
) -> str:
    """One line of JSON in the schema of ``JSON_VERSION``."""
    payload = {
        _VERSION_KEY: JSON_VERSION,
        "axes": [
            {"name": n, "shape": list(a.shape), "stride": list(a.stride)}
            for n, a in zip(names, axes)
        ],
        "index_size": index_size,
        "rank_map": None if rank_map is None else list(rank_map),
    }
    return json.dumps(payload)


def loads(text: str) -> Fields:
    """The fields of the mesh ``text`` describes; ``MeshError`` when the text is
    not JSON, not an fmesh mesh, of another version, or has bad fields."""
    return _fields(_json_payload(text))
