#!/usr/bin/env bash
# Run 5 of experiments/multi30k_cpu_en_de.md: the recipe with the cooldown levers that won on
# val in run 6 of multi30k_cpu_levers_h200.md, one CPU hour, alone; then the averaged
# checkpoint scored on val (alpha 2.0, 1.5) and test2016 (alpha 2.0 and val's best). With the
# venv active:
#   MULTI30K_ROOT=../shared/data/multi30k bash experiments/multi30k_cpu_en_de_run5/run.sh [work dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-/tmp/run5}; rm -rf "$W"; mkdir -p "$W"
export WANDB_MODE=offline
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
python benchmarks/machine.py > "$W/machine.txt" 2>&1
/usr/bin/time -v -o "$W/train.time" python train.py experiment=multi30k_cpu logger=many \
  trainer.enable_progress_bar=false optim.cooldown=0.4 callbacks.average.last=3 \
  decode.length_penalty=2.0 hydra.run.dir="$W/run" > "$W/train.log" 2>&1
score() {  # score <split> <alpha>: tokenized lowercased BLEU of the averaged checkpoint
  python evaluate.py ckpt_path="$W/run/checkpoints/averaged.ckpt" split="$1" tok_bleu=true \
    device=cpu decode.length_penalty="$2" hydra.run.dir="$W/eval_$1_$2" > "$W/eval_$1_$2.log" 2>&1
  python -c "import json; print(json.load(open('$W/eval_$1_$2/bleu.json'))['bleu_tok'])"
}
best=2.0 best_bleu=-1
for alpha in 2.0 1.5; do
  bleu=$(score val $alpha); echo -e "val\t$alpha\t$bleu" | tee -a "$W/scores.tsv"
  if python -c "import sys; sys.exit(not $bleu > $best_bleu)"; then best=$alpha best_bleu=$bleu; fi
done
for alpha in $(echo 2.0 $best | tr ' ' '\n' | sort -u); do
  echo -e "test\t$alpha\t$(score test $alpha)" | tee -a "$W/scores.tsv"
done
