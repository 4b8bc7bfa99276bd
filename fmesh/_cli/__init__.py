"""The ``fmesh`` command line (``python -m fmesh``)."""
