#!/usr/bin/env bash
# Run 7 of experiments/multi30k_cpu_en_de.md: the published small-model shape
# (experiment=multi30k_tiny: 4+4 layers of d_model 128, d_ff 256, dropout 0.3, 10k vocabulary,
# 4 096-token batches, inverse-sqrt peaking at 5e-3, the average of the last 10 epochs) in the
# CPU recipe's hour: the 55-minute budget instead of 8 000 updates, its warmup scaled by the
# same share (2 000 of 8 000 -> WARMUP of the updates an hour holds, measured by a short probe
# first), and the CPU recipe's capped greedy validation. One CPU hour, alone; then the averaged
# checkpoint scored on val at each alpha and test2016 at val's best (beam 4, as every record).
# With the venv active:
#   MULTI30K_ROOT=../shared/data/multi30k WARMUP=<n> bash experiments/multi30k_cpu_en_de_run7/run.sh [work dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-/tmp/run7}; rm -rf "$W"; mkdir -p "$W"
export WANDB_MODE=offline
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
: "${WARMUP:?set WARMUP to a quarter of the updates an hour holds}"
python benchmarks/machine.py > "$W/machine.txt" 2>&1
/usr/bin/time -v -o "$W/train.time" python train.py experiment=multi30k_tiny logger=many \
  trainer.enable_progress_bar=false trainer.max_steps=-1 trainer.max_time=00:00:55:00 \
  optim.warmup_steps="$WARMUP" val_decode.max_len_a=1.5 val_decode.max_len_b=5 \
  decode.beam_size=4 decode.length_penalty=1.5 hydra.run.dir="$W/run" > "$W/train.log" 2>&1
score() {  # score <split> <alpha>: tokenized lowercased BLEU of the averaged checkpoint
  python evaluate.py ckpt_path="$W/run/checkpoints/averaged.ckpt" split="$1" tok_bleu=true \
    device=cpu decode.length_penalty="$2" hydra.run.dir="$W/eval_$1_$2" > "$W/eval_$1_$2.log" 2>&1
  python -c "import json; print(json.load(open('$W/eval_$1_$2/bleu.json'))['bleu_tok'])"
}
best=1.5 best_bleu=-1
for alpha in 1.0 1.5 2.0 2.5; do
  bleu=$(score val $alpha); echo -e "val\t$alpha\t$bleu" | tee -a "$W/scores.tsv"
  if python -c "import sys; sys.exit(not $bleu > $best_bleu)"; then best=$alpha best_bleu=$bleu; fi
done
echo -e "test\t$best\t$(score test $best)" | tee -a "$W/scores.tsv"
