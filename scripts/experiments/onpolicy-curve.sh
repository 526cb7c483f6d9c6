#!/usr/bin/env bash
# The chat drafter's learning curve on on-policy data (issue 68): held-out τ and α against the answer tokens the
# target wrote for its own prompts, each point from the same 1M-token corpus pretrain.
#
#   bash scripts/experiments/onpolicy-curve.sh              # every step; rerun the same command to go on
#   R=runs/oc STEP=data bash scripts/experiments/onpolicy-curve.sh   # only the data (Alg. 1, prompts, answers)
#   STEP=plan bash scripts/experiments/onpolicy-curve.sh   # print the settings and the finetunes, run nothing
#
# PACKS=<folder>: the run's synth folders as packs (python -m synth pack: text and token ids, no features, small
# enough to keep in the repository), unpacked first where the run lacks them, their features made again by the
# target's prefill — how the data outlives a disk that is not kept between sessions.
# Steps, each skipped when its output is there (so a stopped run continues where it stopped; the synth steps
# resume inside themselves with the same data as one uninterrupted run):
#   1. ADASPEC Alg. 1 at scale: N_INSTR instructions by the target, rotating few-shot prompts, near-duplicates out;
#   2. the English corpus (Debian documentation) and the prompt set (Alg. 1 + the pool + N_CORPUS corpus-paragraph
#      prompts, near-duplicates out, shuffled; synth/<lang>-prompts/report.json says its diversity);
#   3. the target's answers at T = 0, 0.7, 1.0 (the profiles' temperatures), features captured from the generating
#      forwards (the transformers engine: faster here than vLLM with its feature prefill, docs/experiments.md);
#   1–3 again per later data round: N_INSTR and N_CORPUS may be lists, the running totals of each round
#      (N_INSTR="1150 2400" N_CORPUS="200 500"): Alg. 1 goes on to the round's total, the round's prompt set
#      (<lang>-prompts-r<i>) holds only prompts no earlier round had, its answers go to <lang>-distill-r<i>; a
#      point takes the rounds in order, so data grows without redoing a round and the points still nest;
#   4. the greedy answers to both held-out sets (synth/data/heldout.jsonl, synth/data/heldout-chat.jsonl);
#   5. the corpus prefill (1M tokens) and the shared pretrain on it (the vocabulary, wordfreq + the Alg. 1 pairs, is
#      made in step 2, before any answer exists, so no point's head is ranked on another point's data);
#   6. per point N (answer tokens): finetune from the pretrain on the first N answer tokens, EPOCHS(N) epochs
#      (max(2, round(4·√(140000/N))): 4, 3, 2, 2, 2 at the default points), scored on both held-out sets, and
#      beside each score the decoder's own α₁..α₄ and τ on the same prompts (python -m pipelines.score_check
#      --drafter: <point>/finetune/score_check-{heldout,heldout-chat}.json; a gap is a train/decode mismatch);
#      SEEDS also at SEED_POINTS;
#   7. the recipe A/B at AB_POINT (default: the largest point), one finetune per arm of ARMS
#      ("name:override,override …"; an arm that changes the drafter's shape, eagle.num_layers, pretrains its own;
#      `epochs*2` doubles the point's epochs), scored like a point;
#   8. the table and plot (python -m pipelines.onpolicy_curve table).
# Another target and language (issue 68's default-target points):
#   R=runs/oc-gemma TARGET=gemma3-270m LANG_CODE=de TEMPS=0.0,0.7 MAX_NEW=112 DISTILL_BATCH=128 N_INSTR=1200 \
#     N_CORPUS=300 POINTS="23000 230000" SEEDS= SEED_POINTS= ARMS= PRETRAIN_TOKENS=500000   (docs/experiments.md)
# a language with no prompts in synth/data/heldout-chat.jsonl (English only) is scored on synth/data/heldout.jsonl
# alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${R:-runs/oc}
TARGET=${TARGET:-smollm2-135m-instruct}
L=${LANG_CODE:-en}
N_INSTR=${N_INSTR:-7000}
N_CORPUS=${N_CORPUS:-1300}
POINTS=${POINTS:-140000 300000 700000 1400000 3000000}
# SEEDS, SEED_POINTS and ARMS: set but empty means none (make chat-large), unset the default
SEEDS=${SEEDS-1}
SEED_POINTS=${SEED_POINTS-140000 700000}
AB_POINT=${AB_POINT:-${POINTS##* }}
# EAGLE-3's own recipe (lr 5e-5, warmup, 0.8^i by draft position: eagle.ttt_decay's default, more epochs), LK
# losses' acceptance loss (speculators' lk_hybrid), training-time test depth 4, a two-layer drafter
ARMS=${ARMS-lr5e-5:optim.lr=5e-5,epochs*2 lk:eagle.token_loss=lk_hybrid ttt4:eagle.ttt_steps=4 l2:eagle.num_layers=2}
names=()  # the arms' names (oc-<ab-point>-<name>/)
for a in $ARMS; do names+=("${a%%:*}"); done
PRETRAIN_TOKENS=${PRETRAIN_TOKENS:-1000000}
TEMPS=${TEMPS:-0.0,0.7,1.0}
MAX_NEW=${MAX_NEW:-192}
DISTILL_BATCH=${DISTILL_BATCH:-32}  # rows a distillation batch; Gemma-3 (262K head): 128, the profiles' own
STEP=${STEP:-all}
PACKS=${PACKS:-}
PY=${PY:-.venv/bin/python}
ACC=${ACC:-.venv/bin/accelerate}
S=$R/synth
say() { echo "[onpolicy-curve $(date +%H:%M:%S)] $*"; }
if [[ $STEP == plan ]]; then
  echo "run=$R target=$TARGET lang=$L temperatures=$TEMPS max_new=$MAX_NEW distill_batch=$DISTILL_BATCH"
  echo "rounds: instructions=[$N_INSTR] corpus_prompts=[$N_CORPUS] pretrain_tokens=$PRETRAIN_TOKENS"
  [[ -n $PACKS ]] && echo "packs: $(find "$PACKS" -name '*.tar.xz' 2>/dev/null | wc -l) in $PACKS"
  echo "points=[$POINTS] seeds=[$SEEDS] seed_points=[$SEED_POINTS] ab_point=$AB_POINT arms=[${names[*]}]"
  n_seed_runs=$(( $(wc -w <<< "$SEEDS") * $(wc -w <<< "$SEED_POINTS") ))
  echo "finetunes: $(wc -w <<< "$POINTS") points + $n_seed_runs seed runs + ${#names[@]} arms"
  exit 0
fi

if [[ -n $PACKS ]] && compgen -G "$PACKS/*.tar.xz" > /dev/null; then
  say "0. the packed data ($PACKS)"
  $PY -m synth unpack "$PACKS"/*.tar.xz --run "$R" --target "$TARGET"
fi
distill=(--config configs/synth/distill.yaml --lang "$L" --target "$TARGET" --run "$R" capture_features=true
         feature_layers=eagle3 seed=0 "sampling.max_new_tokens=$MAX_NEW" "engine.batch_size=$DISTILL_BATCH")
# 1: the second held-out set has this language's prompts (read by its one reader, polyspec/heldout.py)
chat=$($PY -c 'import sys; from polyspec.heldout import load_heldout_chat as c; print(int(bool(c(sys.argv[1]))))' "$L")
read -r -a instr <<< "$N_INSTR"
read -r -a ncorpus <<< "$N_CORPUS"
(( ${#instr[@]} == ${#ncorpus[@]} )) || { echo "N_INSTR and N_CORPUS need one total per data round" >&2; exit 2; }
srcs=() earlier=()
for i in "${!instr[@]}"; do
  r=$((i + 1)) sfx=""
  (( r > 1 )) && sfx="-r$r"
  say "1. Alg. 1 (round $r): ${instr[$i]} instructions"
  $PY -m synth --lang "$L" --target "$TARGET" --run "$R" --n "${instr[$i]}" --batch-size 64 few_shot=3 \
    few_shot_variants=64 filters.near_duplicate=0.7 instruction.max_new_tokens=64 response.max_new_tokens=32
  [[ -f $R/corpus/$L/manifest.json ]] || $PY -m corpus --langs "$L" --target "$TARGET" --run "$R"
  say "2. the prompt set (round $r)"
  [[ -f $S/$L-prompts$sfx/prompts.jsonl ]] || $PY -m synth prompts --lang "$L" --run "$R" \
    --corpus "${ncorpus[$i]}" --out-name "prompts$sfx" "${earlier[@]}"
  earlier+=(--exclude "$S/$L-prompts$sfx/prompts.jsonl")
  # one vocabulary for every point, from data none of them trains on (wordfreq + the Alg. 1 pairs), made before
  # the answers exist (summary.json: what `python -m vocab` writes last)
  [[ -f $R/vocab/summary.json ]] || $PY -m vocab --config configs/vocab/default.yaml --langs "$L" \
    --sources wordfreq,synth@0.5 --target "$TARGET" --run "$R" "mask_sizes=[8192,16384,32768]"
  say "3. the answers (round $r)"
  $PY -m synth distill "${distill[@]}" max_feature_gb=40 --prompts "$S/$L-prompts$sfx/prompts.jsonl" \
    --out-name "distill$sfx" --temperatures "$TEMPS"
  srcs+=(--src "$S/$L-distill$sfx/data.jsonl")
done
say "4. the held-out answers"
$PY -m synth distill "${distill[@]}" --prompts heldout --out-name heldout --temperatures 0
(( chat )) && $PY -m synth distill "${distill[@]}" --prompts heldout-chat --out-name heldout-chat --temperatures 0
[[ $STEP == data ]] && exit 0

say "5. corpus prefill, pretrain"
[[ -f $R/corpus/$L-prefill/stats.json ]] || \
  $PY -m corpus prefill --lang "$L" --target "$TARGET" --run "$R" --max-tokens "$((PRETRAIN_TOKENS + 1024))"
$PY -m pipelines.learning_curve prefix --src "$R/corpus/$L-prefill/data.jsonl" --tokens "$PRETRAIN_TOKENS"
train=(--num_processes 1 --num_cpu_threads_per_process "$(nproc)" train/drafter.py --config configs/train/eagle3-cpu.yaml
       "lang=$L" "target=$TARGET" "run=$R" features=captured eagle.vocab_size=16384 report_to=none "eagle.vocab_langs=[$L]")
pre=$R/oc-pretrain/$L/pretrain/final
[[ -f $pre/model.safetensors ]] || $ACC launch "${train[@]}" train_dir=oc-pretrain stage=pretrain pretrain.epochs=1 \
  "data.pretrain=[$R/corpus/$L-prefill/data-$PRETRAIN_TOKENS.jsonl]"

epochs() { $PY -c "import math,sys; print(max(2, round(4 * math.sqrt(140000 / int(sys.argv[1])))))" "$1"; }
point() {  # point N SEED [ARM OVERRIDES…]
  local n=$1 seed=$2 arm=${3:-} dir=oc-$1 init=$pre over=() o
  (( seed )) && dir=$dir-s$seed
  local ep; ep=$(epochs "$n")
  if [[ -n $arm ]]; then
    dir=$dir-$arm
    for o in "${@:4}"; do [[ $o == 'epochs*2' ]] && ep=$((2 * ep)) || over+=("$o"); done
    if [[ " ${over[*]} " == *" eagle.num_layers="* ]]; then  # another shape: its own pretrain
      init=$R/oc-pretrain-$arm/$L/pretrain/final
      [[ -f $init/model.safetensors ]] || $ACC launch "${train[@]}" "train_dir=oc-pretrain-$arm" stage=pretrain \
        pretrain.epochs=1 "data.pretrain=[$R/corpus/$L-prefill/data-$PRETRAIN_TOKENS.jsonl]" "${over[@]}"
    fi
  fi
  local out=$R/$dir/$L
  if [[ ! -f $out/finetune/final/model.safetensors ]]; then
    local parts
    parts=$($PY -m pipelines.onpolicy_curve answers "${srcs[@]}" --tokens "$n" | paste -sd,)
    say "6. point $n seed $seed ${arm:+arm $arm }: $ep epochs"
    $ACC launch "${train[@]}" "train_dir=$dir" stage=finetune "seed=$seed" "init_from=$init" \
      "data.finetune=[$parts]" "data.eval_file=[$S/$L-heldout/data.jsonl]" \
      "finetune.epochs=$ep" eval_every=100000 data.eval_max_examples=24 "${over[@]}"
  fi
  # the same final weights scored on the chat held-out set (32 prompts): an eval-only stage → $dir-chat/…/eval_only.json
  (( chat )) && [[ ! -f $R/$dir-chat/$L/finetune/eval_only.json ]] && \
    $ACC launch "${train[@]}" "train_dir=$dir-chat" stage=finetune eval_only=true "init_from=$out/finetune/final" \
      "data.finetune=[$S/$L-heldout-chat/data.jsonl]" "data.eval_file=[$S/$L-heldout-chat/data.jsonl]" \
      data.eval_max_examples=32 "${over[@]}"
  # the decoder's own α and τ (chain γ 4) beside the training score, on each held-out set's captured answers
  [[ -n $arm ]] && return 0  # the A/B compares training scores
  local hs
  for hs in heldout $( (( chat )) && echo heldout-chat); do
    [[ -f $out/finetune/score_check-$hs.json ]] || \
      $PY -m pipelines.score_check --run "$R" --target "$TARGET" --drafter "$out/finetune/final" --lang "$L" \
        --heldout "$S/$L-$hs/data.jsonl" --gamma 4
  done
}
for n in $POINTS; do point "$n" 0; done
for s in $SEEDS; do for n in $SEED_POINTS; do point "$n" "$s"; done; done
for a in $ARMS; do
  say "7. recipe A/B at $AB_POINT: ${a%%:*}"
  IFS=, read -r -a o <<< "${a#*:}"
  point "$AB_POINT" 0 "${a%%:*}" "${o[@]}"
done
say "8. the table"
$PY -m pipelines.onpolicy_curve table --run "$R" --points "$POINTS" --seeds "$SEEDS" --lang "$L" \
  --ab-point "$AB_POINT" --arms "${names[*]}" $( (( chat )) || echo --no-chat)
