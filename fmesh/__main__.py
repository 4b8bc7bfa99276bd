"""``python -m fmesh``: the fmesh command line (see ``fmesh._cli``)."""

import sys

from ._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
