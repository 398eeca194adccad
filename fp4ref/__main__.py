"""``python -m fp4ref``: the ``fp4ref`` command (fp4ref.cli)."""
from .cli import main

if __name__ == "__main__":  # not on a plain import (e.g. a walk over the package's modules)
    raise SystemExit(main())
