"""One rank of ``tests/test_hosts_netns.py``'s jobs, run in its host's network namespace.

Usage: ``python tests/netns_rank.py OUT_DIR`` with torchrun's variables set. The rank
realizes a dp x tp mesh (dp across the two hosts, tp within each); ``FMESH_TEST_DELAY``
(seconds) holds this rank at the start of its first group creation, after writing
``OUT_DIR/in<rank>``. It writes ``OUT_DIR/rank<rank>.json``: the error's class and
message (or none), the ranks it names, and when it came (wall clock).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    faulthandler.dump_traceback_later(100)  # where a rank hangs, should one
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    delay = float(os.environ.get("FMESH_TEST_DELAY", "0"))

    import fmesh
    from fmesh._runtime import groups

    real = groups._new_group
    first = [True]

    def new_group(*args: Any, **kwargs: Any) -> Any:
        if first[0]:
            first[0] = False
            (out / f"in{rank}").write_text("")
            time.sleep(delay)
        return real(*args, **kwargs)

    groups._new_group = new_group
    result: dict[str, Any] = {"error": None}
    try:
        fmesh.realize(fmesh.make_mesh({"dp": 2, "tp": 2}))
    except Exception as err:  # what reached this rank, reported to the test
        result = {
            "error": type(err).__name__,
            "mro": [c.__name__ for c in type(err).__mro__],
            "message": str(err),
            "lost": list(getattr(err, "lost", ())),
        }
    result["at"] = time.time()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # no teardown: a group's destructor may wait on a peer cut off


if __name__ == "__main__":
    main()
