"""`python -m export`: placeholder until issue #6 lands."""

import sys

print("export: stage not implemented yet (issue #6)", file=sys.stderr)
raise SystemExit(3)
