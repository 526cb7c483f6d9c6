"""`python -m synth`: placeholder until issue #3 lands."""

import sys

print("synth: stage not implemented yet (issue #3)", file=sys.stderr)
raise SystemExit(3)
