#!/usr/bin/env bash
# The EAGLE-3 drafter's held-out score against pretrain tokens of general text (issue 60, item 3; seed 004's P step).
#
#   bash scripts/experiments/learning-curve.sh           # the chat target, the cpu-chat run's answers, 4 points
#   RUN=runs/chat LC=runs/lc POINTS="0 100000 300000 1000000" FT_EPOCHS=2 bash scripts/experiments/learning-curve.sh
#
# Reads a finished `make all PROFILE=cpu-chat RUN=$RUN` (its distilled answers with captured features, its vocabulary,
# its held-out answers); builds the English corpus for the target once (python -m corpus) and the target's prefill
# features on its first max(POINTS) tokens (python -m corpus prefill). Then, for each point N: the pretrain reads the
# answers + the first N corpus tokens (one epoch, cosine schedule annealed to 0), the finetune the answers (FT_EPOCHS),
# both with the profile's recipe (configs/train/eagle3-cpu.yaml, 16K head); no checkpoint is picked on the held-out
# prompts: the score is the final weights' on all 24 (train/score.py: the decoder's greedy chain, γ 4).
# Resumable: a point whose finetune has final/ is skipped. Writes $LC/learning-curve.json, .md and .png (python -m
# pipelines.learning_curve table).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${RUN:-runs/chat}
LC=${LC:-runs/lc}
TARGET=${TARGET:-smollm2-135m-instruct}
LANG_CODE=${LANG_CODE:-en}
POINTS=${POINTS:-0 100000 300000 1000000}
FT_EPOCHS=${FT_EPOCHS:-2}
PY=${PY:-.venv/bin/python}
ACC=${ACC:-.venv/bin/accelerate}
max=0
for n in $POINTS; do (( n > max )) && max=$n; done

if (( max > 0 )); then
  [[ -f $LC/corpus/$LANG_CODE/manifest.json ]] || $PY -m corpus --langs "$LANG_CODE" --target "$TARGET" --run "$LC"
  [[ -f $LC/corpus/$LANG_CODE-prefill/stats.json ]] || \
    $PY -m corpus prefill --lang "$LANG_CODE" --target "$TARGET" --run "$LC" --max-tokens "$((max + 1024))"
fi

common=(--config configs/train/eagle3-cpu.yaml "target=$TARGET" "lang=$LANG_CODE" "run=$RUN" eagle.vocab_size=16384
        report_to=none eval_every=100000 data.eval_max_examples=24)
for n in $POINTS; do
  dir=lc-$n
  [[ -f $RUN/$dir/$LANG_CODE/finetune/final/model.safetensors ]] && { echo "[lc] $n: done"; continue; }
  pre=("$RUN/synth/$LANG_CODE-distill/data.jsonl")
  if (( n > 0 )); then  # the first n tokens of the prefilled corpus (its chunks in document order), beside the answers
    sub=$LC/corpus/$LANG_CODE-prefill/data-$n.jsonl
    $PY -m pipelines.learning_curve prefix --src "$LC/corpus/$LANG_CODE-prefill/data.jsonl" --tokens "$n"
    pre+=("$sub")
  fi
  list=$(IFS=,; echo "[${pre[*]}]")
  echo "[lc] $n: pretrain on $list"
  $ACC launch --num_processes 1 --num_cpu_threads_per_process "$(nproc)" train/drafter.py "${common[@]}" "train_dir=$dir" stage=pretrain "data.pretrain=$list" \
    pretrain.epochs=1
  $ACC launch --num_processes 1 --num_cpu_threads_per_process "$(nproc)" train/drafter.py "${common[@]}" "train_dir=$dir" stage=finetune "finetune.epochs=$FT_EPOCHS"
done
$PY -m pipelines.learning_curve table --run "$RUN" --corpus "$LC" --points "$POINTS" --lang "$LANG_CODE"
