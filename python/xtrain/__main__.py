"""`python -m xtrain ...` runs the `xtrain` command (xtrain/cli.py)."""
import sys

from xtrain.cli import main

sys.exit(main())
