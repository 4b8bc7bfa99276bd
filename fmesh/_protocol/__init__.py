"""The cross-rank protocol: what ranks do together, apart from what one process does.

``stream.py`` says how calls are matched across ranks (stream names, call codes,
numbering); ``agreement.py`` puts a rank's record of a creating call in and names a
rank that makes another call, ``records.py`` holds what ranks write; ``watch.py`` runs
a call's waits (the closing round, the verdict, a rank given up on) with
``arrivals.py`` (late ranks, the timeout, the keys a call leaves); ``verdicts.py``
words a failed call's verdict; ``port.py``,
``links.py`` and ``ring.py`` make a lost rank a process that has exited (liveness its
kernel keeps); ``connections.py`` holds the store connections a call uses and
hardens them; ``liveness.py`` is what the runtime calls. It imports only
the core and the compat package: the runtime (``_runtime/``) calls it, never the
reverse. Layers: ``docs/design/runtime-layers.md``.
"""
