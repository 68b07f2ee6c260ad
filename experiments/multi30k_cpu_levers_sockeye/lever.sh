#!/usr/bin/env bash
# One lever of experiment=multi30k_cpu at a fixed update budget (issue 52: why Sockeye trains
# the same model better): train, then the averaged checkpoint's tokenized val BLEU (beam 4) at
# length penalty 1.0, 1.5 and 2.0, and test2016 at val's best. From the repo root, alone:
#   MULTI30K_ROOT=<dir> bash experiments/multi30k_cpu_levers_sockeye/lever.sh <name> [overrides...]
# Writes $LEVERS/<name>/ (default /tmp/lev): run/ (the training run), scores.tsv, overrides.txt.
set -u
export WANDB_MODE=offline PYTHONUNBUFFERED=1
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
NAME=$1; shift; L=${LEVERS:-/tmp/lev}/$NAME
if [ -e "$L" ] && [ ! -e "$L/overrides.txt" ]; then  # scratch space: never someone's run
  echo "$L exists and is not an earlier lever's directory; choose another name or LEVERS" >&2; exit 2
fi
rm -rf "$L"; mkdir -p "$L"
STEPS=${STEPS:-3400}  # the updates of the recipe's hour on the 2-core AVX2 EPYC (peers/same_pipeline/aiayn_*)
echo "$@" > "$L/overrides.txt"; date > "$L/start"; git rev-parse --short HEAD > "$L/commit"
python train.py experiment=multi30k_cpu trainer.max_time=null trainer.max_steps="$STEPS" \
  trainer.enable_progress_bar=false logger=csv test=false "$@" hydra.run.dir="$L/run" > "$L/train.log" 2>&1
echo "train rc=$?" >> "$L/progress"
best=0 chosen=""
for alpha in 1.0 1.5 2.0; do
  python evaluate.py ckpt_path="$L/run/checkpoints/averaged.ckpt" split=val tok_bleu=true \
    decode.length_penalty=$alpha hydra.run.dir="$L/eval_val_$alpha" > "$L/eval_val_$alpha.log" 2>&1
  bleu=$(python -c "import json; print(json.load(open('$L/eval_val_$alpha/bleu.json'))['bleu_tok'])")
  echo -e "val\t$alpha\t$bleu" >> "$L/scores.tsv"
  if python -c "import sys; sys.exit(not $bleu > $best)"; then best=$bleu chosen=$alpha; fi
done
python evaluate.py ckpt_path="$L/run/checkpoints/averaged.ckpt" split=test tok_bleu=true \
  decode.length_penalty=$chosen hydra.run.dir="$L/eval_test_$chosen" > "$L/eval_test.log" 2>&1
bleu=$(python -c "import json; print(json.load(open('$L/eval_test_$chosen/bleu.json'))['bleu_tok'])")
echo -e "test\t$chosen\t$bleu" >> "$L/scores.tsv"
date > "$L/done"
