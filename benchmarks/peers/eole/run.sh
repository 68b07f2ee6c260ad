#!/usr/bin/env bash
# eole against aiayn's multi30k_cpu: the whole command, timed by stage
# (benchmarks/peers/common.sh), on a quiet machine, alone:
#   bash benchmarks/peers/install.sh eole      # its venv, once
#   MULTI30K_ROOT=<dir> [SETTING=own] bash benchmarks/peers/eole/run.sh
# SETTING=same (default), setting 1: aiayn's model and recipe (same_model.yaml). SETTING=own,
# setting 2: eole's own documented Transformer recipe, recipes/wmt17/wmt17_ende.yaml (a
# Transformer big), scaled to the budget (own_recipe.yaml says what was changed and why).
# Both decode with beam 4 and the alpha chosen on val (common.sh).
# Result: $PEER_WORK/result.json (default /tmp/peer_eole), eole's logs beside it.
PEER_WORK=${PEER_WORK:-/tmp/peer_eole}
source "$(dirname "$0")/../common.sh"
EOLE=$PEERS_DIR/eole/venv/bin/eole
SETTING=${SETTING:-same}
case "$SETTING" in  # the config, its checkpoint and report intervals (updates), the name
  # setting 1: a checkpoint every 50 updates, of which average() takes 5 an epoch apart
  same) YAML=same_model.yaml SAVE=50 REPORT=50 NAME="same model and recipe" ;;
  own) YAML=own_recipe.yaml SAVE=4 REPORT=1 NAME="eole's WMT17 recipe" ;;  # ~60 updates
  *) echo "SETTING is same or own, not $SETTING" >&2; exit 2 ;;
esac
[ "$SETTING" = same ] || CHECKPOINTS=last  # setting 2 decodes its last checkpoint
if [ "$SMOKE" = 1 ]; then STEPS=20 SAVE=10 MAXLEN=10 REPORT=5; else STEPS=1000000 MAXLEN=250; fi

version() { dist_version "$PEERS_DIR/eole/venv/bin/python" eole; }

prepare() {
  sed -e "s#PEER_WORK#$PEER_WORK#g; s#PEER_TEXT#$PEER_WORK/text#g; s#PEER_STEPS#$STEPS#g" \
    -e "s#PEER_SAVE#$SAVE#g; s#PEER_REPORT#$REPORT#g" \
    -e "s#save_checkpoint_steps: [0-9]*#save_checkpoint_steps: $SAVE#; s#report_every: 50#report_every: $REPORT#" \
    "$PEERS/eole/$YAML" > config.yaml
  "$EOLE" build_vocab -config config.yaml -n_sample -1 > vocab.log 2>&1
}

train() {  # eole has no wall-clock limit: stopped at the budget, the last checkpoint kept
  train_timed "$BUDGET" "$EOLE" train -config config.yaml
}

# the last checkpoint saved (training was stopped at the budget)
last_checkpoint() { ls -d model/step_* | sort -t_ -k2 -n | tail -1; }

average() {  # eole 0.6.4 ships no averaging tool (OpenNMT-py's onmt_average_models is not in
  # it): checkpoints.py means each tensor of the last 5 checkpoints an epoch apart
  local chosen
  chosen=$(ls -d model/step_* | "$AIAYN_PY" "$PEERS/checkpoints.py" pick --pattern 'step_(\d+)$')
  # shellcheck disable=SC2086  # one path a word
  "$PEERS_DIR/eole/venv/bin/python" "$PEERS/checkpoints.py" average-safetensors \
    --out model/averaged $chosen > average.log 2>&1
  echo "$chosen" > averaged_from.txt
}

checkpoint() {  # the weights $CHECKPOINT names
  if [ "$CHECKPOINT" = averaged ]; then echo model/averaged; else last_checkpoint; fi
}

decode() {  # beam 4, GNMT length penalty alpha
  "$EOLE" predict -model_path "$(checkpoint)" -src "text/$1.bpe.en" -output "$3" \
    -beam_size 4 -length_penalty wu -alpha "$2" -batch_size 2000 -batch_type tokens -max_length "$MAXLEN" \
    > "predict.$1.$2.log" 2>&1
}

run_peer eole "$NAME"
