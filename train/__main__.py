"""`python -m train`: placeholder until issue #5 lands."""

import sys

print("train: stage not implemented yet (issue #5)", file=sys.stderr)
raise SystemExit(3)
