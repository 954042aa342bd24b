"""python -m eqgrad: the command line (eqgrad/tools/cli.py)."""
from eqgrad.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
