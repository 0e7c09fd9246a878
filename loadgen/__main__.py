"""Entry point for ``python -m loadgen`` (flags live in ``cli.py``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
