"""`python -m xtrain ...` runs the `xtrain` command (xtrain/trainer/cli.py)."""
import sys

from xtrain.trainer.cli import main

sys.exit(main())
