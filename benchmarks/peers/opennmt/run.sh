#!/usr/bin/env bash
# OpenNMT-py against aiayn's multi30k_cpu: the whole command, timed by stage
# (benchmarks/peers/common.sh), on a quiet machine, alone:
#   bash benchmarks/peers/install.sh opennmt_py      # its venv, once
#   MULTI30K_ROOT=<dir> [SETTING=own] bash benchmarks/peers/opennmt/run.sh
# SETTING=same (default), setting 1: aiayn's model and recipe (same_model.yaml). SETTING=own,
# setting 2: OpenNMT-py's own documented Transformer recipe, the FAQ's "How do I train the
# Transformer model?" (a Transformer base), scaled to the budget (own_recipe.yaml says what
# was changed and why). Both decode with beam 4 and the alpha chosen on val (common.sh).
# Result: $PEER_WORK/result.json (default /tmp/peer_opennmt), OpenNMT-py's logs beside it.
PEER_WORK=${PEER_WORK:-/tmp/peer_opennmt}
source "$(dirname "$0")/../common.sh"
ONMT=$PEERS_DIR/opennmt-py/venv/bin
SETTING=${SETTING:-same}
case "$SETTING" in  # the config, its checkpoint and report intervals (updates), the name
  # setting 1: a checkpoint every 50 updates, of which average() takes 5 an epoch apart
  same) YAML=same_model.yaml SAVE=50 REPORT=50 NAME="same model and recipe" ;;
  own) YAML=own_recipe.yaml SAVE=10 REPORT=5 NAME="OpenNMT-py's FAQ Transformer recipe" ;;
  *) echo "SETTING is same or own, not $SETTING" >&2; exit 2 ;;
esac
[ "$SETTING" = same ] || CHECKPOINTS=last  # setting 2 decodes its last checkpoint
if [ "$SMOKE" = 1 ]; then STEPS=20 SAVE=10 MAXLEN=10 REPORT=5; else STEPS=1000000 MAXLEN=250; fi

version() { dist_version "$ONMT/python" OpenNMT-py; }

prepare() {
  sed -e "s#PEER_WORK#$PEER_WORK#g; s#PEER_TEXT#$PEER_WORK/text#g" \
    -e "s#PEER_STEPS#$STEPS#; s#PEER_SAVE#$SAVE#; s#PEER_REPORT#$REPORT#" \
    -e "s#report_every: 50#report_every: $REPORT#" "$PEERS/opennmt/$YAML" > config.yaml
  mkdir -p model
  "$ONMT/onmt_build_vocab" -config config.yaml -n_sample -1 > vocab.log 2>&1
}

train() {  # no wall-clock limit of its own: stopped at the budget, the last checkpoint kept
  train_timed "$BUDGET" "$ONMT/onmt_train" -config config.yaml
}

# the last checkpoint saved (training was stopped at the budget)
last_checkpoint() { ls model/model_step_*.pt | sort -t_ -k3 -n | tail -1; }

average() {  # its own tool, onmt_average_models, on the last 5 checkpoints an epoch apart
  local chosen
  chosen=$(ls model/model_step_*.pt | "$AIAYN_PY" "$PEERS/checkpoints.py" pick \
    --pattern 'model_step_(\d+)\.pt$')
  # shellcheck disable=SC2086  # one path a word
  "$ONMT/onmt_average_models" -models $chosen -output model/averaged.pt > average.log 2>&1
  echo "$chosen" > averaged_from.txt
}

checkpoint() {  # the weights $CHECKPOINT names
  if [ "$CHECKPOINT" = averaged ]; then echo model/averaged.pt; else last_checkpoint; fi
}

decode() {  # beam 4, GNMT length penalty alpha
  "$ONMT/onmt_translate" -model "$(checkpoint)" -src "text/$1.bpe.en" -output "$3" \
    -beam_size 4 -length_penalty wu -alpha "$2" -batch_size 2000 -batch_type tokens -max_length "$MAXLEN" \
    > "translate.$1.$2.log" 2>&1
}

run_peer opennmt-py "$NAME"
