"""`python -m vocab`: placeholder until issue #4 lands."""

import sys

print("vocab: stage not implemented yet (issue #4)", file=sys.stderr)
raise SystemExit(3)
