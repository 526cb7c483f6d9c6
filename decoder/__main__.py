"""`python -m decoder`: placeholder until issue #6 lands."""

import sys

print("decoder: stage not implemented yet (issue #6)", file=sys.stderr)
raise SystemExit(3)
