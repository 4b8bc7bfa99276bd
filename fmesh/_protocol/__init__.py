"""The cross-rank protocol: what ranks do together, apart from what one process does.

``stream.py`` says how calls are matched across ranks (stream names, call codes,
numbering, agreement keys); ``agreement.py`` agrees on a call and ``records.py`` keeps
its shared records and what ranks do when it fails; ``arrivals.py`` waits for and warns
about late ranks; ``liveness.py``, ``watch.py`` and ``sentinel.py`` make a lost rank a
dead one. It imports only the core and the compat package: the runtime (``_runtime/``)
calls it, never the reverse. Layers: ``docs/design/runtime-layers.md``.
"""
