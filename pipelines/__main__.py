"""`python -m pipelines`: placeholder until issue #8 lands."""

import sys

print("pipelines: stage not implemented yet (issue #8)", file=sys.stderr)
raise SystemExit(3)
