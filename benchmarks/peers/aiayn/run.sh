#!/usr/bin/env bash
# aiayn's row of the peer table, through the same stages as the peers (text, training, alpha
# on val, test, one scorer): `python train.py experiment=multi30k_cpu`, the recipe as shipped
# and setting 1 by definition, stopped by its own clock (trainer.max_time) after the budget.
# Its whole command also prepares its BPE, validates every epoch, averages the last 5
# snapshots (its final weights and its last 4 epoch ends) and decodes test2016; the table's
# val and test columns then decode the averaged checkpoint with `evaluate.py` at each alpha,
# as every peer's are, and the last checkpoint too (its own row). Timed alone:
#   MULTI30K_ROOT=<dir> bash benchmarks/peers/aiayn/run.sh
# Result: $PEER_WORK/result.json (default /tmp/peer_aiayn), the run directory in run/.
PEER_WORK=${PEER_WORK:-/tmp/peer_aiayn}
HYP_PIECES=  # evaluate.py writes plain text
CHECKPOINTS=${CHECKPOINTS:-"averaged last"}
source "$(dirname "$0")/../common.sh"
export WANDB_MODE=offline
if [ "$SMOKE" = 1 ]; then LIMIT=(trainer.max_steps=20); else  # the budget as DD:HH:MM:SS
  LIMIT=("trainer.max_time=$(printf '00:%02d:%02d:%02d' $((BUDGET / 3600)) \
    $((BUDGET % 3600 / 60)) $((BUDGET % 60)))"); fi

version() { git -C "$REPO" rev-parse --short HEAD; }

train() {  # the data root is the peers' Multi30k copy, as text.py export reads it
  train_timed "$((BUDGET + 900))" "$AIAYN_PY" "$REPO/train.py" experiment=multi30k_cpu \
    "hydra.run.dir=$PEER_WORK/run" trainer.enable_progress_bar=false "${LIMIT[@]}"
}

decode() {  # beam 4, GNMT length penalty alpha, on the averaged checkpoint the recipe tests
  # (or the last one)
  local role=$1 eval_dir=$PEER_WORK/eval.$CHECKPOINT.$1.$2
  [ "$1" = test2016 ] && role=test
  rm -rf "$eval_dir"  # this script's scratch: DECODE_ONLY=1 decodes again
  "$AIAYN_PY" "$REPO/evaluate.py" "ckpt_path=$PEER_WORK/run/checkpoints/$CHECKPOINT.ckpt" \
    "split=$role" decode.length_penalty="$2" "hydra.run.dir=$eval_dir" \
    > "evaluate.$CHECKPOINT.$1.$2.log" 2>&1
  cp "$eval_dir/hypotheses.$role.txt" "$3"
}

run_peer aiayn "same model and recipe"
