"""Render a results file: the full table (``results.md``) and the benchmark page's section.

Everything here is a function of the results payload alone (what ``results.json``
holds), so ``docs/benchmarks.md`` can be checked against the committed results: every
number between its markers, prose included, is rendered here from a row. (Functions
named ``readme_*`` render that section; it lived in the README before 0.4.)
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from pathlib import Path

from .elastic import prose as elastic_prose
from .shared import (
    EXPERT_NAMES,
    NAMES,
    Json,
    Row,
    fmt_ratio,
    fmt_value,
    shape_str,
    world_str,
)

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
HEADER = (
    "| section | benchmark | ranks | fmesh | torch | torch/fmesh | note |",
    "|---|---|---|--:|--:|--:|---|",
)


def load(path: Path) -> Json:
    payload: Json = json.loads(path.read_text())
    return payload


def rows_of(payload: Json) -> list[Row]:
    return [Row(**r) for r in payload["rows"]]


def ahead_note(row: Row) -> str:
    """The row's note, prefixed with a plain verdict where fmesh is not ahead."""
    both = (row.fmesh, row.torch)
    if None not in both and max(v or 0.0 for v in both) < row.resolution:
        return f"**below resolution** ({fmt_value(row.resolution, row.unit)}): {row.note}"
    if row.ratio is None or row.ratio > 1.05:
        return row.note
    if row.ratio >= 0.95:
        verdict = "**par**" if row.unit != "count" or row.ratio != 1 else "**equal**"
    else:
        verdict = "**torch ahead**"
    return f"{verdict}: {row.note}"


def caption(payload: Json) -> str:
    m = payload["machine"]
    shapes = ", ".join(
        f"{world_str(int(w))} = {shape_str(shape)}" for w, shape in payload["shapes"].items()
    )
    titan = int(payload["titan_world"])
    return (
        f"*fmesh {m['fmesh']} vs torch {m['torch']} `DeviceMesh`, `{m['command']}` on "
        f"{m['platform']}, {m['cpus_usable']} CPUs, {m['memory_gib']} GiB, Python "
        f"{m['python']}, {m['date'][:10]} (shared machine, load average "
        f"{m['loadavg_start'][0]:.1f} at the start and {m['loadavg_end'][0]:.1f} at the "
        "end: medians of repeats; pure ops: batches interleaved, gc off in a batch). "
        "Ratio = torch / fmesh: above 1, fmesh "
        f"is faster or smaller. Mesh {shape_str(NAMES)}: {shapes}; flattens dp = "
        "(dp_replicate, dp_shard), dp_shard_cp = (dp_shard, cp), dp_cp = (dp_replicate, "
        f"dp_shard, cp). torchtitan's meshes at {world_str(titan)}: the dense mesh above "
        f"and the expert view {shape_str(EXPERT_NAMES)} = "
        f"{shape_str(payload['expert_shape'])}, flattens batch, loss and fsdp of the "
        f"dense one. Memo hits: the 3-axis mesh {shape_str(('dp', 'fsdp', 'tp'))} = "
        f"{shape_str(('(pp·dp_replicate)', '(dp_shard·cp)', 'tp'))} of each shape."
        f"{merged(m)}*"
    )


def merged(machine: Json) -> str:
    """A sentence per section run merged into the results (``--section``), if any."""
    return "".join(
        f" Rows of `{r['command']}` (fmesh {r['fmesh']}, torch {r['torch']}): that run, "
        f"{r['date'][:10]}, load average {r['loadavg_start'][0]:.1f} at the start and "
        f"{r['loadavg_end'][0]:.1f} at the end."
        for r in machine.get("merged", [])
    )


def table(rows: Iterable[Row]) -> list[str]:
    lines = list(HEADER)
    for r in rows:
        torch = fmt_value(r.torch, r.unit) if r.skipped is None else r.skipped
        lines.append(
            f"| {r.section} | {r.bench} | {r.world} | {fmt_value(r.fmesh, r.unit)} | "
            f"{torch} | {fmt_ratio(r.ratio)} | {ahead_note(r)} |"
        )
    return lines


def results_md(payload: Json) -> str:
    """``results.md``: the caption and every row."""
    return "\n".join([caption(payload), "", *table(rows_of(payload))]) + "\n"


def readme_rows(rows: list[Row]) -> list[Row]:
    """Each benchmark at its largest size, and ``every_size`` ones at every size."""
    largest: dict[str, int] = {}
    for r in rows:
        largest[r.key] = max(largest.get(r.key, 0), r.ranks)
    return [r for r in rows if r.every_size or r.ranks == largest[r.key]]


class Finder:
    """Rows by key and size, and their figures formatted, for the prose."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def get(self, key: str, ranks: int | None = None) -> Row | None:
        found = [r for r in self.rows if r.key == key]
        if ranks is None:
            return max(found, key=lambda r: r.ranks, default=None)
        return next((r for r in found if r.ranks == ranks), None)

    def f(self, key: str, ranks: int | None = None) -> str:
        row = self.get(key, ranks)
        return "—" if row is None else fmt_value(row.fmesh, row.unit)

    def t(self, key: str, ranks: int | None = None) -> str:
        row = self.get(key, ranks)
        if row is None:
            return "—"
        return fmt_value(row.torch, row.unit) if row.skipped is None else row.skipped

    def ratio(self, key: str, ranks: int | None = None) -> str:
        row = self.get(key, ranks)
        return "—" if row is None else fmt_ratio(row.ratio)

    def sizes(self, key: str) -> list[int]:
        return sorted({r.ranks for r in self.rows if r.key == key})


def fmt_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} minutes"


def intro(payload: Json) -> str:
    worlds = [int(w) for w in payload["shapes"]]
    return (
        "`python -m bench` measures fmesh and torch's `DeviceMesh` side by side in one "
        "run and rewrites `bench/results.json`, `bench/results.md` and this section "
        f"(the run below took {fmt_duration(payload['machine']['seconds'])}); "
        "`python -m bench --quick` and `--smoke` write to `bench/out/` (ignored by git) "
        "instead. `tests/test_bench.py` checks that this section is what "
        "`bench/results.json` renders. Shown: each benchmark at its largest size, and at "
        "every size the real-gloo wall times, groups and memo hits, the fake-backend memo "
        "hits, the store server's CPU per rank and its extrapolations; `bench/results.md` "
        f"has every size ({world_str(min(worlds))} to {world_str(max(worlds))} ranks on "
        "the fake backend)."
    )


def prose(payload: Json, rows: list[Row], shown: list[Row]) -> list[str]:
    """Sentences about the results, every figure taken from a row."""
    q = Finder(rows)
    out: list[str] = []
    pure = q.sizes("pure.slice1")
    if pure:
        lo, hi = pure[0], pure[-1]
        ops = (
            ("slice", "pure.slice1"),
            ("flatten", "pure.flatten"),
            ("unflatten", "pure.unflatten"),
            ("coordinate", "pure.coordinate"),
        )
        fm = ", ".join(f"{name} {q.f(key, lo)} and {q.f(key, hi)}" for name, key in ops)
        th = ", ".join(f"{name} {q.t(key, lo)} and {q.t(key, hi)}" for name, key in ops)
        out.append(
            f"At {world_str(lo)} and {world_str(hi)} ranks, fmesh's pure operations take: "
            f"{fm}; torch's: {th}."
        )
    behind = [r for r in shown if r.ratio is not None and r.ratio < 0.95]
    if behind:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in behind)
        text = f"torch is ahead in {len(behind)} of the {len(shown)} rows shown: {labels}."
        if any(r.key == "pure.coordinate_cached" for r in behind):
            text += (
                " For the coordinate, torch returns the tuple it cached when it built "
                "the mesh (an O(world) search, the row above it); fmesh computes it in "
                "O(number of axes), and a `RealizedMesh` holds it as `.coordinate`."
            )
        out.append(text)
    else:
        out.append(f"fmesh is ahead or at par in all {len(shown)} rows shown.")
    par = [r for r in shown if r.ratio is not None and 0.95 <= r.ratio <= 1.05]
    if par:
        labels = "; ".join(f"{r.bench} at {r.world} ({fmt_ratio(r.ratio)})" for r in par)
        out.append(f"fmesh is only at par (within 5%) or equal in {len(par)}: {labels}.")
    fake = q.get("fake.trainer5.calls")
    if fake is not None:
        w = fake.ranks
        out.append(
            f"On the fake backend at {world_str(w)} ranks, the 5-d mesh and its three "
            f"flattens leave {q.f('fake.trainer5.groups', w)} groups on the rank with "
            f"fmesh and {q.t('fake.trainer5.groups', w)} with torch; torch calls "
            f"`new_group` {q.t('fake.trainer5.calls', w)} times to get there, fmesh "
            f"creates {q.f('fake.trainer5.calls', w)} groups."
        )
    titan = q.get("fake.titan.seconds")
    if titan is not None:
        w = titan.ranks
        out.append(
            f"torchtitan's trainer meshes at {world_str(w)} ranks (a 1-d world mesh "
            "unflattened into the dense and the expert view, and three flattens): fmesh "
            f"realizes them in {q.f('fake.titan.seconds', w)}, torch builds them in "
            f"{q.t('fake.titan.seconds', w)} ({q.ratio('fake.titan.seconds', w)}). fmesh "
            f"creates {q.f('fake.titan.calls', w)} groups and the rank holds "
            f"{q.f('fake.titan.groups', w)}; torch makes {q.t('fake.titan.calls', w)} "
            f"`new_group` calls and the rank holds {q.t('fake.titan.groups', w)}. Peak RSS "
            f"grows by {q.f('fake.titan.rss_peak_delta', w)} with fmesh, "
            f"{q.t('fake.titan.rss_peak_delta', w)} with torch."
        )
    sub = q.get("interop.sub_device_mesh.first")
    if sub is not None:
        w = sub.ranks
        out.append(
            f"A torch `DeviceMesh` for the `dp_shard`, `tp` sub-mesh at {world_str(w)} "
            "ranks: fmesh's `realized.to_device_mesh('cpu')` takes "
            f"{q.f('interop.sub_device_mesh.first', w)} on the first call and "
            f"{q.f('interop.sub_device_mesh.repeat', w)} after; torch's "
            f"`dm['dp_shard', 'tp']` {q.t('interop.sub_device_mesh.first', w)} and "
            f"{q.t('interop.sub_device_mesh.repeat', w)}."
        )
    out.extend(_gloo_prose(q))
    out.extend(_hit_prose(q))
    out.extend(_store_prose(q))
    out.extend(_dropin_prose(q))
    out.extend(elastic_prose(q.get("elastic.recovery.seconds")))
    out.extend(_titan_prose(q))
    return out


def _titan_prose(q: Finder) -> list[str]:
    row = q.get("titan.fake.seconds")
    if row is None:
        return []
    k = "titan.fake.seconds"
    fake = _and([world_str(w) for w in q.sizes(k)])
    text = (
        "torchtitan's `ParallelDims.build_mesh` (its calls rewritten in `bench/titan.py`) "
        "with `fmesh.device_mesh.init_device_mesh` in place of torch's, every other call "
        f"torch's own `DeviceMesh` method: on the fake backend at {fake} ranks it takes "
        f"{_each(q, k, 'f')} against {_each(q, k, 't')} with torch's "
        f"({_each(q, k, 'ratio')}); at {row.world} ranks the rank makes "
        f"{q.f('titan.fake.new_group')} torch `new_group` calls (torch "
        f"{q.t('titan.fake.new_group')}) and constructs {q.f('titan.fake.groups')} "
        f"process groups (torch {q.t('titan.fake.groups')})."
    )
    g = "titan.gloo.seconds"
    if q.sizes(g):
        text += (
            f" On real gloo at {_and([str(w) for w in q.sizes(g)])} ranks: "
            f"{_each(q, g, 'f')} against {_each(q, g, 't')} (slowest rank)."
        )
    return [text]


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _each(q: Finder, key: str, side: str) -> str:
    """A figure at every size of ``key`` (``side``: ``f``, ``t`` or ``ratio``)."""
    get = {"f": q.f, "t": q.t, "ratio": q.ratio}[side]
    return _and([get(key, w) for w in q.sizes(key)])


def _gloo_prose(q: Finder) -> list[str]:
    row = q.get("gloo.trainer5.seconds")
    if row is None:
        return []
    k = "gloo.trainer5.seconds"
    sizes = _and([str(w) for w in q.sizes(k)])
    w, label = row.ranks, row.world
    return [
        f"On real gloo at {sizes} ranks, realize + 3 flattens takes fmesh "
        f"{_each(q, k, 'f')} (slowest rank) and torch's recipe {_each(q, k, 't')} "
        f"(torch / fmesh: {_each(q, k, 'ratio')}). At {label} ranks it adds "
        f"{q.f('gloo.trainer5.keys', w)} keys to the rendezvous store (torch "
        f"{q.t('gloo.trainer5.keys', w)}) and sends {q.f('gloo.trainer5.requests', w)} "
        f"store requests per rank (torch {q.t('gloo.trainer5.requests', w)}); of these, "
        f"fmesh's agreement costs {q.f('gloo.trainer5.agree', w)} per rank and creating "
        "call, a cross-rank check torch's recipe does not make. Repeating the recipe "
        "(values built anew, every realize call a memo hit) takes "
        f"{q.f('gloo.memo.seconds', w)} on the slowest rank and sends "
        f"{q.f('gloo.memo.requests', w)} store requests; after any "
        f"phase, {q.f('gloo.agree.keys_left', w)} agreement keys are left in the store. A "
        "new 1-d world mesh, served by the default group, takes fmesh "
        f"{q.f('gloo.world_1d.seconds', w)} and {q.f('gloo.world_1d.requests', w)} store "
        f"requests; torch's `init_device_mesh` of it {q.t('gloo.world_1d.seconds', w)} "
        f"and {q.t('gloo.world_1d.requests', w)}."
    ]


def _hit_prose(q: Finder) -> list[str]:
    out: list[str] = []
    k = "gloo.hit.seconds"
    row = q.get(k)
    if row is not None:
        sizes = _and([str(w) for w in q.sizes(k)])
        out.append(
            "A memo hit, realizing again a 3-axis mesh, its 5 slices and 3 flattens, "
            f"takes fmesh {_each(q, k, 'f')} per call (median; slowest rank) on real gloo "
            f"at {sizes} ranks, and {q.f('gloo.hit_fresh.seconds', row.ranks)} at "
            f"{row.world} ranks when the values are freshly built equal ones; torch's "
            f"slicing of its own mesh for the same sub-meshes takes {_each(q, k, 't')}. "
            + _hit_requests(q)
        )
    fake = q.sizes("fake.hit.seconds")
    if fake:
        k = "fake.hit.seconds"
        out.append(
            f"On the fake backend, a hit takes fmesh {_each(q, k, 'f')} at "
            f"{_and([world_str(w) for w in fake])} ranks "
            f"({_each(q, 'fake.hit_fresh.seconds', 'f')} with fresh values); torch's "
            f"slicing {_each(q, k, 't')}."
        )
    return out


def _zero(q: Finder, key: str, side: str) -> bool:
    """``key``'s figure (``fmesh`` or ``torch``) is 0 at every size it was measured."""
    rows = [q.get(key, w) for w in q.sizes(key)]
    return bool(rows) and all(r is not None and getattr(r, side) == 0 for r in rows)


def _hit_requests(q: Finder) -> str:
    k = "gloo.hit.requests"
    row = q.get(k)
    if row is None:
        return ""
    if _zero(q, k, "fmesh") and _zero(q, k, "torch"):
        return "Neither sends a store request (0 per call on every rank, at every size)."
    return f"Store requests per call at {row.world} ranks: fmesh {q.f(k)}, torch {q.t(k)}."


def _store_prose(q: Finder) -> list[str]:
    row = q.get("store.requests")
    if row is None:
        return []
    w = row.ranks
    far = q.sizes("store.cpu_per_call_extrapolated")
    k = "store.cpu_per_call_extrapolated"
    measured = _and([str(n) for n in q.sizes("store.requests")])
    text = (
        f"Store load, one TCPStore server and {measured} simulated ranks (each its own "
        f"client connection): a creating call's agreement costs each rank "
        f"{q.f('store.requests', w)} store requests at {w} ranks, torch's "
        f"`_store_based_barrier` {q.t('store.requests', w)}; the server spends "
        f"{_each(q, 'store.cpu_per_rank', 'f')} of CPU per rank (torch's barrier "
        f"{_each(q, 'store.cpu_per_rank', 't')}), {q.f('store.cpu_per_call', w)} per call "
        f"in all at {w} ranks (torch {q.t('store.cpu_per_call', w)})."
    )
    if far:
        text += (
            " Extrapolated along a straight line through the measured sizes (not "
            f"measured): {_and([f'{q.f(k, n)} at {world_str(n)} ranks' for n in far])} "
            f"per call, torch's barrier {_and([q.t(k, n) for n in far])}."
        )
    text += (
        f" torch's barrier leaves {q.t('store.keys_left', w)} keys per call in the store, "
        f"fmesh's agreement {q.f('store.keys_left', w)}."
    )
    if _zero(q, "gloo.hit.requests", "fmesh"):
        text += (
            " A memo hit sends no store request (the gloo rows above), so it costs the "
            "server nothing at any world size."
        )
    return [text]


def wrap(text: str) -> str:
    return textwrap.fill(text, width=88, break_long_words=False, break_on_hyphens=False)


def readme_block(payload: Json) -> str:
    """The README's benchmark section, between the markers (markers excluded)."""
    rows = rows_of(payload)
    shown = readme_rows(rows)
    parts = [
        wrap(intro(payload)),
        "\n".join([caption(payload), "", *table(shown)]),
        *map(wrap, prose(payload, rows, shown)),
    ]
    return "\n" + "\n\n".join(parts) + "\n"


def readme_section(readme: str) -> str:
    """What the README holds between the markers."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(f"README must hold {BEGIN} and {END} once each")
    return readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)]


def with_section(readme: str, block: str) -> str:
    """The README with ``block`` between the markers."""
    readme_section(readme)  # checks the markers
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}{block}{END}{tail}"


def _dropin_prose(q: Finder) -> list[str]:
    row = q.get("dropin.fake.first")
    if row is None:
        return []
    w = row.ranks
    on_gloo = "; ".join(
        f"{q.f('dropin.gloo.first', n)} vs {q.t('dropin.gloo.first', n)} first and "
        f"{q.f('dropin.gloo.repeat', n)} vs {q.t('dropin.gloo.repeat', n)} again at {n}"
        for n in q.sizes("dropin.gloo.first")
    )
    return [
        "`fmesh.device_mesh.init_device_mesh` against torch's `init_device_mesh`, same "
        f"arguments (the 5-d mesh): at {world_str(w)} ranks on the fake backend the "
        f"first call takes {q.f('dropin.fake.first', w)} against "
        f"{q.t('dropin.fake.first', w)} ({q.ratio('dropin.fake.first', w)}) and the "
        f"same call again {q.f('dropin.fake.repeat', w)} (a memo hit) against "
        f"{q.t('dropin.fake.repeat', w)} ({q.ratio('dropin.fake.repeat', w)})"
        + (f"; on real gloo, {on_gloo} ranks." if on_gloo else ".")
    ]
