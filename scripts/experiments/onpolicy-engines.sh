#!/usr/bin/env bash
# One point of the on-policy curve (issue 68) in the engines: polyspec's decoder, vLLM's CPU build and llama.cpp,
# each beside its own plain decoding and its own n-gram mode, on the 24 held-out chat prompts.
#
#   R=runs/oc POINT=1120000 bash scripts/experiments/onpolicy-engines.sh            # every engine
#   R=runs/oc POINT=1120000 ENGINES="polyspec vllm" bash scripts/experiments/onpolicy-engines.sh
#
# Steps, each skipped when its output is there (rerun the same command to go on):
#   1. a bundle of the point's drafter (python -m export --drafter en=<point>/finetune/final) → <point>/bundle;
#   2. polyspec: UNISPEC draft-length calibration, then ar, eagle3, pld, hybrid in one run (decoder.bench, bf16 with
#      --exact on: shape-invariant forwards, so every output must equal ar's) → <point>/eval/;
#   3. vLLM (its own venv, make setup-vllm): plain, eagle3 at each VLLM_SWEEP length, vLLM's ngram; fp32, at each
#      VLLM_BATCH size (default 1; VLLM_BATCH=1,16 adds the 16-prompt groups); outputs against plain
#      (python -m engines.vllm) → <point>/vllm/ (batch 1) or <point>/vllm-b<sizes>/;
#   4. llama.cpp: make check-llamacpp with the point's bundle, the same prompts and length (builds llama.cpp once;
#      GGUFs, plain, the drafter, its n-gram mode) → <point>/llamacpp/.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${R:-runs/oc}
TARGET=${TARGET:-smollm2-135m-instruct}
L=${LANG_CODE:-en}
POINT=${POINT:?the point, e.g. POINT=1120000}
ENGINES=${ENGINES:-polyspec vllm llamacpp}
PROMPTS=${PROMPTS:-24}
N=${N:-128}
VLLM_SWEEP=${VLLM_SWEEP:-1,2,3}
VLLM_BATCH=${VLLM_BATCH:-1}
PY=${PY:-.venv/bin/python}
P=$R/oc-$POINT
B=$P/bundle
V=$P/vllm
[[ $VLLM_BATCH == 1 ]] || V=$P/vllm-b${VLLM_BATCH//,/-}
say() { echo "[onpolicy-engines $(date +%H:%M:%S)] $*"; }

[[ -f $P/$L/finetune/final/model.safetensors ]] || { echo "$P: no trained point (onpolicy-curve.sh)" >&2; exit 2; }
say "1. the bundle of $P"
[[ -f $B/manifest.json ]] || $PY -m export --langs "$L" --run "$R" --target "$TARGET" --out "$B" \
  --sizes 8192,16384,32768 --drafter "$L=$P/$L/finetune/final"
for engine in $ENGINES; do
  case $engine in
    polyspec)
      say "2. polyspec: calibration, then ar, eagle3, pld, hybrid"
      [[ -f $B/calibration.json ]] || $PY -m decoder.calibrate --bundle "$B" --target "$TARGET" --sizes 1,2,3,4,6 \
        --prompts 8 --max-new-tokens 64 --exact on
      [[ -f $P/eval/report.json ]] || $PY -m decoder.bench --bundle "$B" --target "$TARGET" --out "$P/eval" \
        --questions synth/data/heldout.jsonl --methods ar,eagle3,pld,hybrid --max-new-tokens "$N" --exact on ;;
    vllm)
      say "3. vLLM: plain, eagle3 at $VLLM_SWEEP, ngram (fp32, batch $VLLM_BATCH)"
      make -s setup-vllm
      [[ -f $V/vllm.json ]] || POLYSPEC_VLLM_PYTHON=.venv-vllm/bin/python $PY -m engines.vllm --target "$TARGET" \
        --drafters "$B" --out "$V" --prompts "$PROMPTS" --n "$N" --sweep "$VLLM_SWEEP" --batch "$VLLM_BATCH" \
        --dtype float32 ;;
    llamacpp)
      say "4. llama.cpp"
      [[ -f $P/llamacpp/llamacpp.json ]] || make -s check-llamacpp RUN="$P" BUNDLE="$B" TARGET="$TARGET" \
        LLAMACPP_PROMPTS="$PROMPTS" LLAMACPP_N="$N" ;;
    *) echo "unknown engine $engine (polyspec, vllm, llamacpp)" >&2; exit 2 ;;
  esac
done
