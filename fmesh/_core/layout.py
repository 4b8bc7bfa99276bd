"""Row-major CuTe-style layouts: the integer algebra under every mesh axis.

A ``Layout`` ``(s_1, ..., s_m):(d_1, ..., d_m)`` maps a coordinate
``c in [0, s_1*...*s_m)`` to the index ``sum(digit_j * d_j)``, where the digits are
``c`` written in mixed radix ``s`` with the **last** mode varying fastest (row-major,
as PyTorch does; CuTe itself is column-major).

Layouts are kept in canonical form, so two layouts that compute the same function
compare equal: size-1 modes are dropped and adjacent modes ``j, j+1`` with
``d_j == s_{j+1} * d_{j+1}`` are merged. Modes are never sorted, because the order of
modes is part of the function.

Every operation here costs O(number of modes); nothing enumerates a rank space except
``Layout.values``, which is O(size) by nature.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import final

import attrs

from .checks import is_int
from .errors import MeshError, UnrepresentableSplitError

__all__ = ["Layout"]

Mode = tuple[int, int]  # (size, stride)


def _int_tuple(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(is_int(v) for v in value):
        raise TypeError(f"Layout.{name} must be a tuple of int, got {value!r}")
    return value


def _shape_tuple(value: object) -> tuple[int, ...]:
    return _int_tuple("shape", value)


def _stride_tuple(value: object) -> tuple[int, ...]:
    return _int_tuple("stride", value)


def _coalesce(modes: Iterable[Mode]) -> tuple[Mode, ...]:
    """Drop size-1 modes and merge adjacent modes that are contiguous."""
    out: list[Mode] = []
    for size, stride in modes:
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            prev_size, _ = out[-1]
            out[-1] = (prev_size * size, stride)
        else:
            out.append((size, stride))
    return tuple(out)


def _check_positive(fn: str, values: tuple[object, ...]) -> None:
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(
                f"{fn} takes ints, got {value!r} of type {type(value).__name__} in {values!r}"
            )
        if value < 1:
            raise MeshError(f"{fn} takes sizes and steps >= 1, got {values!r}")


def _validate_modes(shape: tuple[int, ...], stride: tuple[int, ...]) -> None:
    if len(shape) != len(stride):
        raise MeshError(
            f"Layout shape {shape} and stride {stride} have different lengths "
            f"({len(shape)} vs {len(stride)}); give one stride per mode."
        )
    for size, step in zip(shape, stride, strict=True):
        if size < 1:
            raise MeshError(
                f"Layout shape {shape} has a mode of size {size}; every mode size "
                "must be a positive int."
            )
        if size > 1 and step < 1:
            raise MeshError(
                f"Layout {shape}:{stride} has stride {step} on a mode of size {size}; "
                "strides must be positive (fmesh layouts index ranks, so they never "
                "run backwards or repeat)."
            )


def _format(modes: Sequence[Mode]) -> str:
    if not modes:
        return "():()"
    sizes = ",".join(str(s) for s, _ in modes)
    strides = ",".join(str(d) for _, d in modes)
    return f"({sizes}):({strides})"


@final
@attrs.frozen(slots=True, repr=False)
class Layout:
    """A canonical row-major layout: a function from ``[0, size)`` to indices.

    Build one with [`Layout.of`][fmesh.Layout.of], which canonicalizes; the plain constructor
    accepts only a layout that is already canonical.

    >>> Layout.of((2, 4), (4, 1))
    Layout((8):(1))
    >>> Layout.of((2, 3), (1, 2)).values()
    [0, 2, 4, 1, 3, 5]
    """

    shape: tuple[int, ...] = attrs.field(converter=_shape_tuple)
    """Size of each mode, slowest first."""
    stride: tuple[int, ...] = attrs.field(converter=_stride_tuple)
    """Stride of each mode, slowest first."""

    def __attrs_post_init__(self) -> None:
        _validate_modes(self.shape, self.stride)
        modes = tuple(zip(self.shape, self.stride, strict=True))
        if _coalesce(modes) != modes:
            canonical = _format(_coalesce(modes))
            raise MeshError(
                f"Layout {_format(modes)} is not in canonical form (it equals "
                f"{canonical}); build it with Layout.of(shape, stride), which "
                "drops size-1 modes and merges contiguous ones."
            )

    @classmethod
    def of(cls, shape: Sequence[int], stride: Sequence[int] | None = None) -> Layout:
        """The canonical layout with these modes (row-major strides by default)."""
        shape_t = _int_tuple("shape", tuple(shape))
        stride_t = (
            _row_major_strides(shape_t)
            if stride is None
            else _int_tuple("stride", tuple(stride))
        )
        _validate_modes(shape_t, stride_t)
        return cls._from_modes(zip(shape_t, stride_t, strict=True))

    @classmethod
    def _from_modes(cls, modes: Iterable[Mode]) -> Layout:
        """The canonical layout of ``modes`` (ints), one value per distinct ``modes``:
        the same axes recur in every mesh a trainer builds, and checking a new layout
        costs more than the rest of a mesh."""
        return _canonical(tuple(modes))

    @property
    def modes(self) -> tuple[Mode, ...]:
        """``(size, stride)`` pairs, slowest first."""
        return tuple(zip(self.shape, self.stride, strict=True))

    @property
    def size(self) -> int:
        """Number of coordinates (the product of the mode sizes; 1 when empty)."""
        return math.prod(self.shape)

    @property
    def cosize(self) -> int:
        """One past the largest index the layout produces."""
        return 1 + sum((s - 1) * d for s, d in self.modes)

    @property
    def is_ascending(self) -> bool:
        """Whether indices grow with the coordinate (strides sorted descending)."""
        return all(a > b for a, b in zip(self.stride, self.stride[1:]))

    def __call__(self, coord: int) -> int:
        """The index of coordinate ``coord``."""
        if not 0 <= coord < self.size:
            raise MeshError(
                f"coordinate {coord} is outside layout {self!r}, whose coordinates "
                f"are 0..{self.size - 1}"
            )
        index = 0
        for size, stride in reversed(self.modes):
            coord, digit = divmod(coord, size)
            index += digit * stride
        return index

    def values(self) -> list[int]:
        """Every index in coordinate order (O(size), the innermost mode's runs as
        ranges: a group of thousands of ranks is listed at C speed)."""
        out = [0]
        for size, stride in self.modes:
            span = size * stride
            out = list(itertools.chain.from_iterable(range(b, b + span, stride) for b in out))
        return out

    def coordinate_of(self, index: int) -> int:
        """The coordinate of ``index`` relative to its group base, digit by digit.

        Valid for indices of a mesh whose modes tile the index space (then each
        mode's digit is ``index // stride % size``); O(number of modes).
        """
        coord = 0
        for size, stride in zip(self.shape, self.stride):
            coord = coord * size + (index // stride) % size
        return coord

    def group_base(self, index: int) -> int:
        """The base of the group holding ``index``: the index at coordinate 0.

        Every group of an axis is ``base + self(c)``; this inverts that for the
        index's own group, in O(number of modes) (same validity as
        [`coordinate_of`][fmesh.Layout.coordinate_of]).

        >>> Layout.of((2, 2), (4, 1)).group_base(7)
        2
        """
        return index - self(self.coordinate_of(index))

    def compose(self, size: int, step: int) -> Layout:
        """``self o (size:step)``: the layout ``k -> self(k * step)`` for ``k < size``.

        As in CuTe, ``step`` must divide out of the fastest modes (the step and each
        mode size it crosses divide one another); then ``size`` takes whole modes and
        finally part of one, so the result is exact or refused, never truncated.
        For the row-major sizes [`split`][fmesh.Layout.split] composes with, which multiply to
        [`size`][fmesh.Layout.size], this refuses exactly the splits that are not layouts.

        Raises:
            TypeError: when ``size`` or ``step`` is not an int.
            MeshError: when ``size`` or ``step`` is below 1.
            UnrepresentableSplitError: when the rule above fails (it does whenever
                ``size > 1`` and ``size * step`` exceeds [`size`][fmesh.Layout.size]).
        """
        _check_positive("Layout.compose()", (size, step))
        if size == 1:
            return Layout((), ())  # only coordinate 0, which every layout maps to 0
        modes = list(self.modes)
        rest = step
        # Divide the step out of the fastest modes first (row-major: walk from the end).
        while rest > 1 and modes:
            m_size, m_stride = modes[-1]
            if rest % m_size == 0:
                modes.pop()
                rest //= m_size
            elif m_size % rest == 0:
                modes[-1] = (m_size // rest, m_stride * rest)
                rest = 1
            else:
                raise UnrepresentableSplitError(
                    f"{self!r} o ({size}:{step}) is not a layout: step {rest} and "
                    f"mode size {m_size} do not divide each other"
                )
        if rest > 1:
            raise UnrepresentableSplitError(
                f"{self!r} o ({size}:{step}) is out of range: the layout has only "
                f"{self.size} coordinates"
            )
        taken: list[Mode] = []
        want = size
        while want > 1 and modes:
            m_size, m_stride = modes.pop()
            if want % m_size == 0:
                taken.append((m_size, m_stride))
                want //= m_size
            elif want < m_size:
                # The first `want` coordinates of this mode: they never carry.
                taken.append((want, m_stride))
                want = 1
            else:
                raise UnrepresentableSplitError(
                    f"{self!r} o ({size}:{step}) is not a layout: {want} more "
                    f"coordinates are needed, which is more than mode size {m_size} "
                    "but not a multiple of it"
                )
        if want > 1:
            raise UnrepresentableSplitError(
                f"{self!r} o ({size}:{step}) is out of range: the layout has only "
                f"{self.size} coordinates"
            )
        taken.reverse()
        return Layout._from_modes(taken)

    def split(self, sizes: Sequence[int]) -> tuple[Layout, ...]:
        """Compose with the row-major layout of ``sizes``: one layout per size.

        The product of ``sizes`` must equal [`size`][fmesh.Layout.size].
        """
        _check_positive("Layout.split()", tuple(sizes))
        if math.prod(sizes) != self.size:
            raise MeshError(
                f"cannot split layout {self!r} of size {self.size} into {tuple(sizes)}: "
                f"their product is {math.prod(sizes)}"
            )
        steps = _row_major_strides(tuple(sizes))
        return tuple(self.compose(t, r) for t, r in zip(sizes, steps, strict=True))

    def complement(self, index_size: int) -> Layout:
        """The layout of group bases: ``self`` and its complement tile ``[0, index_size)``.

        Raises:
            MeshError: when the modes overlap or do not tile ``index_size``.
        """
        return Layout._from_modes(complement_modes(self.modes, index_size))

    @staticmethod
    def concat(layouts: Iterable[Layout]) -> Layout:
        """The coalesced concatenation of the modes of ``layouts``, in order."""
        return Layout._from_modes(m for layout in layouts for m in layout.modes)

    def __repr__(self) -> str:
        return f"Layout({_format(self.modes)})"

    def __str__(self) -> str:
        return _format(self.modes)


def _row_major_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for size in reversed(sizes):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


def row_major(sizes: Sequence[int]) -> tuple[Layout, ...]:
    """One single-mode layout per size, with row-major strides."""
    sizes_t = tuple(sizes)
    return tuple(
        Layout._from_modes([(s, d)])
        for s, d in zip(sizes_t, _row_major_strides(sizes_t), strict=True)
    )


@functools.lru_cache(maxsize=1024)
def _canonical(modes: tuple[Mode, ...]) -> Layout:
    canon = _coalesce(modes)
    return Layout(tuple(s for s, _ in canon), tuple(d for _, d in canon))


def complement_modes(modes: Iterable[Mode], index_size: int) -> tuple[Mode, ...]:
    """Modes (slowest first) filling the gaps of ``modes`` in ``[0, index_size)``.

    Checks strong non-overlap on the way: sorted by stride, each stride must be a
    multiple of the next smaller stride times its size, and ``index_size`` a multiple
    of the largest stride times its size.
    """
    ascending = sorted((d, s) for s, d in modes if s > 1)
    gaps: list[Mode] = []
    covered = 1  # every index below `covered` (in steps of 1) is spanned so far
    for stride, size in ascending:
        if stride % covered != 0:
            raise MeshError(
                f"layout modes {_format([(s, d) for d, s in ascending])} overlap: "
                f"stride {stride} is not a multiple of {covered}, the span of the "
                "modes below it"
            )
        gaps.append((stride // covered, covered))
        covered = stride * size
    if index_size % covered != 0:
        raise MeshError(
            f"layout modes {_format([(s, d) for d, s in ascending])} span {covered} "
            f"indices, which does not tile an index space of size {index_size}; the "
            "index space must be a multiple of the span"
        )
    gaps.append((index_size // covered, covered))
    return _coalesce(reversed(gaps))
