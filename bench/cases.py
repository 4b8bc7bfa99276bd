"""Every benchmark, as one table: what runs, at which sizes, and the rows it reports.

Each :class:`~bench.runners.Case` names its runner and worker (:mod:`bench.work` on a
fake world or gloo ranks, :mod:`bench.jobs`, :mod:`bench.store_load`), its sizes and
repeats per mode (``full``, ``quick``, ``smoke``) and its metrics: one row each at
every size. ``python -m bench --section NAME`` runs the cases of one name. A metric is
``M(key, where in a result, label, note, unit, over ranks, ...)``.
"""

from __future__ import annotations

from . import jobs, store_load, titan, work
from .runners import Case, PerMode, extrapolate
from .runners import Metric as M
from .shared import Json

# fmt: off
MODES = ("full", "quick", "smoke")
WORLDS = {"full": (2**10, 2**14, 2**17, 2**20), "quick": (2**10, 2**14, 2**17),
          "smoke": (2**6, 2**8)}
BIG = {"full": (2**17,), "quick": (2**17,), "smoke": (2**8,)}
"""The world of torchtitan's meshes, of to_device_mesh and of the drop-in's fake rows."""
LARGEST = {"full": (2**20,), "quick": (2**14,), "smoke": (2**8,)}
GLOO = {"full": ((1, 1, 2, 1, 2), (1, 2, 2, 1, 2), (2, 2, 2, 1, 2)),
        "quick": ((1, 1, 2, 1, 2),), "smoke": ((1, 1, 2, 1, 1),)}
TITAN_FAKE = {"full": (2**10, 2**17), "quick": (2**10, 2**17), "smoke": (2**4, 2**6)}
"""torchtitan's recipe on a fake world: the drop-in's growth from the smallest size to
the largest (``titan.growth``), each size in fresh processes."""
TITAN_K: PerMode = {"full": 7, "quick": 3, "smoke": 2}
TITAN_TORCH_K: PerMode = {"full": (7, 3), "quick": (3, 2)}
"""Fresh processes per size; torch's build at 2^17 takes seconds: fewer there."""
THREE: PerMode = {"full": 3}
GLOO_REPEATS: PerMode = {"full": (7, 5, 5)}
"""Jobs per gloo size: medians of at least 5."""
BATCHES = {"full": {"repeats": 9, "target_s": 0.03}, "quick": {"repeats": 3, "target_s": 0.02},
           "smoke": {"repeats": 2, "target_s": 0.002}}
"""Timed batches of a repeated call (pure ops, to_device_mesh, the drop-in), and the
length of one."""
HITS = {"full": {"rounds": 1000, "budget_s": 0.3}, "quick": {"rounds": 300, "budget_s": 0.1},
        "smoke": {"rounds": 20, "budget_s": 0.01}}
"""Rounds of the memo-hit workload, and the time after which torch's stops adding rounds."""
ROOTS = {"full": {"roots": 1000}, "quick": {"roots": 1000}, "smoke": {"roots": 600}}
"""Roots per half of the distinct-names workload: more than fill fmesh's bounded tables
(1,024 entries each), so the second half shows what stays."""
CALLS: dict[str, Json] = {"full": {"calls": 3}, "quick": {"calls": 2},
         "smoke": {"calls": 2, "steady_s": 1.0, "timeout_s": 6.0}}
"""Store-load calls per phase; a smoke run finds the dead rank sooner (a shorter timeout)."""
# fmt: on


def realize_metrics(key: str, label: str, torch: str) -> tuple[M, ...]:
    baseline = f"torch: {torch}"
    # fmt: off
    return (
        M(f"fake.{key}.seconds", "seconds", f"{label}: wall time", baseline),
        M(f"fake.{key}.groups", "groups", f"{label}: groups the rank holds",
          f"{baseline}; torch registers only the groups the rank is in", "count"),
        M(f"fake.{key}.calls", "calls", f"{label}: group-creation calls by the rank",
          f"{baseline}; torch: new_group calls (every subgroup of the world); fmesh: "
          "groups it created", "count"),
        M(f"fake.{key}.rss_peak_delta", "rss_peak_delta", f"{label}: peak RSS growth",
          f"{baseline}; fresh process, kernel peak-RSS mark reset before; counts C++ "
          "allocations too", "B", resolution=2**20),
    )
    # fmt: on


def titan_metrics(key: str, where: str, spmd: str = "spmd_types") -> tuple[M, ...]:
    def m(read: str, name: str, unit: str, what: str, note: str, res: float = 0.0) -> M:
        label = f"ParallelDims.build_mesh ({spmd}), one-import change: {what}"
        note += "; torch: the same recipe with torch's init_device_mesh"
        every = name in ("seconds", "cpu")
        return M(f"titan.{key}.{name}", read, label, note, unit, every_size=every,
                 resolution=res, best=name == "cpu")  # fmt: skip

    fake = key != "gloo"
    # fmt: off
    return (
        m("seconds", "seconds", "s", "wall time", f"{where}; {{config}}; {{same}}"),
        *[m("cpu", "cpu", "s", "process CPU time, least of the processes",
            f"{where.replace('median', 'least')}; time.process_time() around the build "
            "(every thread of the process); {config}")] * fake,
        m("new_group", "new_group", "count", "torch new_group calls",
          "per rank (max over ranks)"),
        m("constructed", "groups", "count", "process groups constructed",
          "_new_process_group_helper calls that made a group, per rank (max)"),
        m("rss_peak", "rss_peak", "B", "peak RSS", "ru_maxrss of the process (max over ranks)",
          2**20),
    )
    # fmt: on


FRESH = "one rank, median of {n_fmesh} fresh processes (torch: {n_torch})"
NEW = "realize + 3 flattens"
TORCH_RECIPE = "torch: init_device_mesh('cpu') + 3 _flatten calls"
ON_WIRE = "counted on the wire by every rank's store client"
HIT_LABEL = "memo hit: a 3-axis mesh, its slices and flattens again, per call"
FRESH_LABEL = "memo hit with freshly constructed equal mesh values, per call"
HIT_SAME = (
    "median call; fmesh: realize of the 9 values it realized before (mesh, 5 slices, 3 "
    "flattens); torch: the 8 slicing/_flatten expressions for the same sub-meshes of its "
    "init_device_mesh mesh, each called before"
)
HIT_FRESH = (
    "median call; fmesh: realize of newly built values equal to those it realized before "
    "(construction not timed); torch: the same 8 expressions as above"
)
DROPIN = "torch: torch.distributed.device_mesh.init_device_mesh, same arguments"
DROPIN_FAKE = f"fmesh: fmesh.device_mesh.init_device_mesh; {DROPIN}"
DROPIN_GLOO = f"real gloo processes; {DROPIN}"
SUB = "DeviceMesh of the `dp_shard`, `tp` sub-mesh"
INTEROP = (
    "fmesh: to_device_mesh('cpu') of the realized slice (its realize, a memo hit, took "
    "{realize_s} more); torch: dm['dp_shard', 'tp'] of init_device_mesh's mesh"
)
DM5 = "init_device_mesh of the 5-d mesh"
PLAN = f"fmesh plan of torchtitan's recipe, {jobs.PLAN_RANKS} ranks"
WATCH = (
    "fmesh's liveness watch while a call creates groups (the call's verdict keys, and "
    "each rank's port address fmesh/l/<rank>, written once per process and read once by "
    "its watcher): reads of the verdict once a wait passes one interval; mean over ranks "
    "and watched calls; torch watches nothing"
)
SIM = "N simulated ranks, each its own TCPStore client to one server, in groups of {group}"
GLOO_CALL = (
    "fmesh: record, peer watch, closing round, cleanup, and gloo's rendezvous through "
    "fmesh's store, creation held {hold}; torch: gloo's rendezvous of the same group"
)
WAIT = "every rank waiting in its creation (fmesh's watch at default settings)"
NONE = "a blocked wait: none"

# fmt: off
STORE = (
    M("store.call.requests", "requests", "a creating call (gloo): store requests per rank",
      f"{SIM}; {GLOO_CALL}; counted on the wire, mean over ranks and calls", "count",
      every_size=True),
    M("store.call.check", "own", "the cross-rank check of a creating call: store requests "
      "per rank", f"{SIM}; fmesh: record, watch, closing round and cleanup (keys under "
      "fmesh/); torch: the store barrier each new_group call runs with "
      "TORCH_DIST_INIT_BARRIER=1 (off by default), over the whole world, N/{group} calls for "
      "these groups (measured on {barriers}, scaled)", "count", torch="barrier"),
    M("store.call.nccl", "nccl", "a creating call (NCCL, eager): store requests per rank",
      f"{SIM}; fmesh: its check as above and the unique-id exchange; torch: the exchange "
      "(group rank 0 sets the id, the others read it)", "count",
      limit="a creating call's record and closing round are 3 requests per rank (a "
      "compare_set, an add, a wait or the last rank's set), which torch, checking nothing, "
      "does not make, on top of the same exchange ({torch:.3g} per rank): without them "
      "ranks that disagree hang in NCCL's creation instead of raising"),
    M("store.call.seconds", "seconds", "a creating call (gloo): wall time",
      f"{SIM}; all ranks at once on this machine's CPUs, each a thread in a crowd of "
      "{per_crowd}, so the crowds' own CPU per rank and call ({crowd_cpu}: fmesh's record, "
      "closing round and sliced waits) adds up across ranks here, where on a real job each "
      "rank spends it on its own CPU; the watch's share of a call grows with its time",
      every_size=True),
    M("store.call.cpu_per_rank", "cpu_rank", "a creating call (gloo): server CPU per rank",
      f"{SIM}; CPU time of the server process (all its threads) per call and rank",
      every_size=True),
    M("store.call.rate", "rate", "a creating call (gloo): server requests per second",
      f"{SIM}; all ranks' requests over the phase's wall time: bounded by the clients' "
      "CPUs on this machine", "/s"),
    M("store.call.keys_left", "keys_left", "keys one call leaves in the store (all ranks)",
      "fmesh's keys are removed by their last reader; gloo's rendezvous keys stay (one per "
      "rank), on both sides", "count"),
    M("store.watch.per_rank", "watch_rank", f"{WAIT}: store requests per rank per second",
      f"{SIM}; reads of the outcome, sliced waits", "/s", skipped=NONE, every_size=True),
    M("store.watch.server", "watch_rate", f"{WAIT}: server requests per second",
      f"{SIM}; all ranks", "/s", skipped=NONE),
    M("store.watch.server_cpu", "watch_cpu", f"{WAIT}: server CPU seconds per second",
      f"{SIM}; CPU time of the server process", "count", skipped=NONE),
    M("store.find.seconds", "find_s", "a rank's process SIGKILLed mid-creation: until every "
      "survivor raised PeerLostError", f"{SIM}; from the kill to the last survivor's error, "
      "fmesh's watch at default settings; torch's survivors wait for its timeout (gloo: 30 "
      "minutes)", skipped="waits its timeout", every_size=True),
    M("store.find.early", "early", "live ranks that raised before the kill (taken for dead)",
      f"{SIM}; the crowds share this machine's CPUs: a rank's watch thread can run late",
      "count", skipped="waits", every_size=True),
)

CASES: tuple[Case, ...] = (
    Case("pure", "pure ops", "fake", work.pure, (
        M("pure.construct", "construct", "construct the 5-d mesh (no groups)",
          "torch: DeviceMesh(_init_backend=False), what init_device_mesh does before "
          "creating groups"),
        M("pure.slice1", "slice1", "slice `tp`", "torch: dm['tp']"),
        M("pure.slice2", "slice2", "slice `dp_shard`, `tp`", "torch: dm['dp_shard', 'tp']"),
        M("pure.flatten", "flatten", "flatten `dp_replicate`, `dp_shard`",
          "torch: first _flatten under a fresh name, which creates its groups (fake "
          "backend); fmesh is pure"),
        M("pure.unflatten", "unflatten", "unflatten `world` into the 5 axes",
          "torch: _unflatten of a 1-d mesh without groups (its best case; with groups it "
          "also creates them)"),
        M("pure.coordinate", "coordinate", "coordinate of a rank",
          "torch: _compute_coordinate_on_dim, the O(world) search every DeviceMesh "
          "construction and slice runs"),
        M("pure.coordinate_cached", "coordinate_cached", "this rank's coordinate, cached",
          "fmesh: a realized mesh's coordinate (computed once, at realize); torch: "
          "get_coordinate() returns the tuple cached at construction; a difference under "
          "2 ns is the timer's noise on a call of about 30 ns", resolution=2e-9),
    ), WORLDS, per_mode=BATCHES, both=True),
    Case("fake", "realize (fake)", "fake", work.build,
         realize_metrics("trainer5", NEW, "init_device_mesh + 3 _flatten calls"),
         WORLDS, {"full": 5}, spec={"what": "trainer5"}, timeout_s=300.0),
    Case("fake", "realize (fake)", "fake", work.build, realize_metrics(
        "titan", "torchtitan's trainer meshes (world, dense, expert, 3 flattens)",
        "1-d init_device_mesh, _unflatten into dense and expert views, 3 _flatten calls",
    ), BIG, THREE, spec={"what": "titan"}, timeout_s=300.0),
    Case("fake", "interop (fake)", "fake", work.interop, (
        M("interop.sub_device_mesh.first", "first", f"{SUB}: first call",
          f"{INTEROP}; fresh process, one call each (median over processes)"),
        M("interop.sub_device_mesh.repeat", "repeat", f"{SUB}: repeated calls",
          f"{INTEROP}; median of batches"),
    ), BIG, THREE, per_mode=BATCHES, both=True, timeout_s=300.0),
    Case("hits", "memo hit (fake)", "fake", work.hits, (
        M("fake.hit.seconds", "same", HIT_LABEL, f"{{shape}} mesh; {HIT_SAME}",
          every_size=True),
        M("fake.hit_fresh.seconds", "fresh", FRESH_LABEL, f"{{shape}} mesh; {HIT_FRESH}",
          torch="same"),
    ), WORLDS, per_mode=HITS, both=True),
    Case("gloo", "realize (gloo)", "gloo", jobs.realize, (
        M("gloo.trainer5.seconds", "new.seconds", f"{NEW}: wall time, max over ranks",
          f"real gloo processes; {TORCH_RECIPE}", every_size=True),
        M("gloo.trainer5.groups", "new.groups", f"{NEW}: groups per rank",
          "fmesh reuses one group for axes with the same members", "count", every_size=True),
        M("gloo.trainer5.keys", "new.keys", f"{NEW}: rendezvous-store keys added (all ranks)",
          "store.num_keys() before and after, read by rank 0", "count", "rank0"),
        M("gloo.trainer5.requests", "new.requests", f"{NEW}: store requests per rank",
          "every request of the rank's store client, counted on the wire (a get is 2), mean "
          f"over ranks: gloo's rendezvous, and fmesh's agreement; {TORCH_RECIPE}", "count",
          "mean", counted=True),
        M("gloo.trainer5.agree", "new.agree",
          f"{NEW}: agreement store requests per rank per creating call",
          "fmesh's cross-rank check before creating groups (keys under fmesh/a/), mean over "
          "ranks and creating calls; torch's recipe checks nothing", "count",
          "per:new.agreements", skipped="no check", counted=True),
        M("gloo.trainer5.watch", "new.watch",
          f"{NEW}: peer-watch store requests per rank per creating call", WATCH, "count",
          "per:new.watches", skipped="no watch", counted=True),
        M("gloo.memo.seconds", "memo.seconds",
          "the same realize calls again (memo hits): wall time, max over ranks",
          "the recipe again: its mesh values built anew (make_mesh, flatten, slice) and 4 "
          "realize calls, each a lookup in the process's memo (no store request, no peer); "
          "ranks share the CPUs, so the slowest rank's wall time includes waiting for one",
          skipped="no memo"),
        M("gloo.memo.requests", "memo.requests", "the same realize calls again: store "
          "requests (all ranks)", ON_WIRE, "count", "sum", skipped="no memo", counted=True),
        M("gloo.agree.keys_left", "*.agree_left",
          "agreement keys left in the store after a phase, most of any phase",
          "read by rank 0 after each phase (every rank's keys): a call's last reader removes "
          "them", "count", "rank0", skipped="no agreement"),
        M("gloo.world_1d.seconds", "world_1d.seconds",
          "a new 1-d world mesh (no group created): wall time, max over ranks",
          "fmesh: a memo hit (the default group serves it), the first realize call in the "
          "process; torch: init_device_mesh of the 1-d world"),
        M("gloo.world_1d.requests", "world_1d.requests",
          "a new 1-d world mesh: store requests (all ranks)", ON_WIRE, "count", "sum",
          counted=True),
        M("gloo.world_1d.keys", "world_1d.keys", "a new 1-d world mesh: rendezvous-store keys "
          "added", "store.num_keys() before and after", "count", "rank0"),
        M("gloo.hit.seconds", "hit.same", HIT_LABEL,
          f"{HIT_SAME}; max over ranks of each rank's median", every_size=True),
        M("gloo.hit_fresh.seconds", "hit.fresh", FRESH_LABEL,
          f"{HIT_FRESH}; max over ranks of each rank's median", torch="hit.same"),
        M("gloo.hit.requests", "hit.requests", "memo hit: store requests per call",
          "every call of both hit rows on every rank, counted on the wire", "count",
          "per:hit.calls", counted=True),
    ), GLOO, GLOO_REPEATS, per_mode=HITS, timeout_s=300.0),
    Case("store_load", "store load", "store", None, STORE, store_load.SIZES,
         per_mode=CALLS, after=extrapolate),
    Case("dropin", "drop-in (fake)", "fake", work.build, (
        M("dropin.fake.first", "seconds", f"{DM5}: first call",
          f"{DROPIN_FAKE}; fresh process (median over processes)"),
        M("dropin.fake.repeat", "repeat", f"{DM5}: the same call again",
          f"{DROPIN_FAKE}; per call; fmesh: a memo hit"),
    ), BIG, THREE, spec={"what": "dropin", "again": True}, per_mode=BATCHES,
         timeout_s=300.0),
    Case("dropin", "drop-in (gloo)", "gloo", work.build, (
        M("dropin.gloo.first", "seconds", f"{DM5}: first call: wall time, max over ranks",
          DROPIN_GLOO, every_size=True),
        M("dropin.gloo.repeat", "repeat",
          f"{DM5}: the same call again: per call, max over ranks",
          f"{DROPIN_GLOO}; fmesh: a memo hit", every_size=True),
    ), GLOO, GLOO_REPEATS, spec={"what": "dropin", "again": 50}, timeout_s=300.0),
    Case("elastic", "elastic (gloo)", "gloo", jobs.elastic, (
        M("elastic.recovery.seconds", "cost", "a SIGKILLed rank: failed collective to the "
          "first good step after it, less recover's wait, slowest survivor",
          "recover, shrink along dp, realize among survivors, retry the step (collective "
          f"timeout {jobs.COLLECTIVE_S:g} s, recover timeout {jobs.RECOVER_S:g} s)",
          skipped="no in-process recovery"),
    ), {mode: ((2, 2, 2),) for mode in MODES}, {"full": 5}, impls=("fmesh",), timeout_s=120.0,
         may_die=(jobs.VICTIM,)),
    Case("memory", "memory", "fake", work.roots, (
        M("memory.roots.growth", "growth",
          "roots with distinct dim names, built and dropped: memory growth",
          "fake backend; each root (2x4) built, _flatten-ed and _unflatten-ed under new "
          "names, then dropped; tracemalloc's current size after {roots2} roots less after "
          "{roots}; torch's groups of every root stay registered", "B"),
    ), {mode: (8,) for mode in MODES}, per_mode=ROOTS,
         skip_torch={"smoke": "skipped in smoke mode (a minute of torch new_group calls)"},
         timeout_s=300.0),
    Case("memory", "memory", "fake", work.value_size, (
        M("memory.value.pickle", "pickle", "one mesh value: pickle size",
          "torch: DeviceMesh without groups", "B"),
        M("memory.value.deep", "deep", "one mesh value: deep size",
          "sys.getsizeof over reachable objects (+ tensor storage)", "B"),
        M("memory.value.construct_peak", "construct_peak",
          "one mesh value: tracemalloc peak while constructing",
          "Python allocations only (torch's tensor storage not seen)", "B"),
    ), LARGEST, both=True, timeout_s=300.0),
    Case("memory", "memory", "fake", work.build, tuple(
        M(f"memory.realized.traced_{what}", f"traced_{what}",
          f"realized mesh + 3 flattens: tracemalloc {what}", "fake backend; torch: "
          "init_device_mesh + 3 _flatten calls; Python allocations only", "B")
        for what in ("retained", "peak")
    ), LARGEST, spec={"what": "trainer5", "trace": True}, timeout_s=300.0),
    *(Case("titan", "torchtitan (fake)", "fake", work.build,
           titan_metrics(key, FRESH, spmd), TITAN_FAKE, TITAN_K, TITAN_TORCH_K,
           spec={"what": "torchtitan", "spmd": spmd, "creation": True, "freeze": True},
           after=titan.growth, interleave=True)
      for key, spmd in (("fake", "spmd_types"), ("partial_dtensor", "partial_dtensor"))),
    Case("titan", "torchtitan (gloo)", "gloo", work.build,
         titan_metrics("gloo", "real gloo, slowest rank"),
         {"full": (4, 8, 16), "quick": (4,), "smoke": (4,)}, {"full": 5},
         spec={"what": "torchtitan", "spmd": "spmd_types", "creation": True}),
    Case("plan", "plan (fake)", "fake", jobs.plan, (
        M("plan.titan.seconds", "seconds", f"{PLAN}, wall time",
          "the whole command as a subprocess, importing torch included; each rank on a "
          "fresh fake world; target: under 10 s at 2^17", skipped="torch has no planner"),
        M("plan.titan.peak_rss", "peak_rss", f"{PLAN}, peak RSS",
          "largest resident set of the command (torch's DeviceMesh holds an O(world) rank "
          "map per root)", "B", skipped="torch has no planner", resolution=2**20),
    ), {"full": (2**17, 2**20), "quick": (2**17,), "smoke": (2**9,)}, THREE,
         impls=("fmesh",)),
)
# fmt: on
