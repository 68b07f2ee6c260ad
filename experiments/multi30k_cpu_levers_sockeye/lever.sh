#!/usr/bin/env bash
# One lever of experiment=multi30k_cpu at a fixed update budget (issue 52: why Sockeye trains
# the same model better): train, then the averaged checkpoint's tokenized val BLEU (beam 4) at
# length penalty 1.0, 1.5 and 2.0, and on past the grid's end by 0.5 while the last is best (as
# benchmarks/peers/common.sh), and test2016 at val's best. From the repo root, alone:
#   MULTI30K_ROOT=<dir> bash experiments/multi30k_cpu_levers_sockeye/lever.sh <name> [overrides...]
# Writes $LEVERS/<name>/ (default /tmp/lev): run/ (the training run), scores.tsv, overrides.txt.
# SCORE_ONLY=1 lever.sh <name>: the decodes again, on the run a lever.sh of <name> trained.
set -u
export WANDB_MODE=offline PYTHONUNBUFFERED=1
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
NAME=$1; shift; L=${LEVERS:-/tmp/lev}/$NAME
if [ -e "$L" ] && [ ! -e "$L/overrides.txt" ]; then  # scratch space: never someone's run
  echo "$L exists and is not an earlier lever's directory; choose another name or LEVERS" >&2; exit 2
fi
if [ "${SCORE_ONLY:-0}" = 1 ]; then
  [ -e "$L/run/checkpoints/averaged.ckpt" ] || { echo "$L has no trained run to score" >&2; exit 2; }
  rm -rf "$L"/eval_* "$L/scores.tsv"
else
  rm -rf "$L"; mkdir -p "$L"
  STEPS=${STEPS:-3400}  # the updates of the recipe's hour on the 2-core AVX2 EPYC (peers/same_pipeline/aiayn_*)
  echo "$@" > "$L/overrides.txt"; date > "$L/start"; git rev-parse --short HEAD > "$L/commit"
  python train.py experiment=multi30k_cpu trainer.max_time=null trainer.max_steps="$STEPS" \
    trainer.enable_progress_bar=false logger=csv test=false "$@" hydra.run.dir="$L/run" > "$L/train.log" 2>&1
  echo "train rc=$?" >> "$L/progress"
fi
score() {  # score <split> <alpha>: appends "<split>\t<alpha>\t<BLEU>" to scores.tsv, prints BLEU
  python evaluate.py ckpt_path="$L/run/checkpoints/averaged.ckpt" split="$1" tok_bleu=true \
    decode.length_penalty="$2" hydra.run.dir="$L/eval_$1_$2" > "$L/eval_$1_$2.log" 2>&1
  local bleu
  bleu=$(python -c "import json; print(json.load(open('$L/eval_$1_$2/bleu.json'))['bleu_tok'])")
  echo -e "$1\t$2\t$bleu" >> "$L/scores.tsv"
  echo "$bleu"
}
try_alpha() {  # try_alpha <alpha>: val's BLEU at it; kept as $chosen if the best so far
  local bleu
  bleu=$(score val "$1")
  if python -c "import sys; sys.exit(not $bleu > $best)"; then best=$bleu chosen=$1; fi
}
best=0 chosen="" alpha=""
for alpha in 1.0 1.5 2.0; do try_alpha "$alpha"; done
while [ "$chosen" = "$alpha" ]; do  # the last alpha tried is the best: try a longer one
  alpha=$(python -c "print($alpha + 0.5)")
  try_alpha "$alpha"
done
score test "$chosen" > /dev/null
[ "${SCORE_ONLY:-0}" = 1 ] && date > "$L/rescored" || date > "$L/done"
