"""``python -m relayrl ...``: the ``relayrl`` command, for environments whose scripts dir is not on PATH
(a venv used without activating it, ``uv run python -m``, notebooks)."""

import sys

from relayrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
