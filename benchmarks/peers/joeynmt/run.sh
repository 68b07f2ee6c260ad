#!/usr/bin/env bash
# JoeyNMT 2.3.0 against aiayn's multi30k_cpu: the whole command, timed by stage
# (benchmarks/peers/common.sh), on a quiet machine, alone:
#   bash benchmarks/peers/install.sh joeynmt      # its venv, once
#   MULTI30K_ROOT=<dir> [SETTING=own] bash benchmarks/peers/joeynmt/run.sh
# SETTING=same (default), setting 1: aiayn's model and recipe (same_model.yaml lists the
# differences). SETTING=own, setting 2: JoeyNMT's own documented Transformer recipe for small
# data, configs/iwslt14_deen_bpe.yaml of v2.3 (own_recipe.yaml says what was changed and why).
# Result: $PEER_WORK/result.json (default /tmp/peer_joeynmt), JoeyNMT's logs beside it.
PEER_WORK=${PEER_WORK:-/tmp/peer_joeynmt}
source "$(dirname "$0")/../common.sh"
JOEY=$PEERS_DIR/joeynmt/venv/bin/python
SETTING=${SETTING:-same}
# the config, its validation interval and its logging interval (updates; JoeyNMT refuses a
# validation interval that the logging interval does not divide), the name
case "$SETTING" in
  same) YAML=same_model.yaml VALID=454 REPORT=2 NAME="same model and recipe" ;;  # 454 = 2 x 227
  own) YAML=own_recipe.yaml VALID=1000 REPORT=50 NAME="JoeyNMT's IWSLT14 recipe" ;;
  *) echo "SETTING is same or own, not $SETTING" >&2; exit 2 ;;
esac
[ "$SETTING" = same ] || CHECKPOINTS=last  # setting 2 decodes its last checkpoint
if [ "$SMOKE" = 1 ]; then UPDATES=20 VALID=20 REPORT=5 MAXLEN=10; else
  UPDATES=1000000 MAXLEN=250; fi
if [ $((VALID % REPORT)) != 0 ]; then
  echo "validation every $VALID updates is not a multiple of logging every $REPORT" >&2; exit 2
fi

version() { dist_version "$JOEY" joeynmt; }

prepare() {  # the config: JoeyNMT reads the text and vocab.txt itself
  sed -e "s#PEER_WORK#$PEER_WORK#g; s#PEER_TEXT#$PEER_WORK/text#g" \
    -e "s#updates: 1000000#updates: $UPDATES#; s#validation_freq: [0-9]*#validation_freq: $VALID#" \
    -e "s#logging_freq: 50#logging_freq: $REPORT#" "$PEERS/joeynmt/$YAML" > config.yaml
}

train() {  # no wall-clock limit of its own: SIGINT at the budget, on which it saves that
  # update's weights (model/latest.ckpt); -t: no test decode after training
  STOP_SIGNAL=INT train_timed "$BUDGET" "$JOEY" -m joeynmt train config.yaml -t
}

average() {  # its checkpoints at each validation (its epoch) and the final weights saved at the
  # interrupt, 5 an epoch apart; JoeyNMT's package has no averaging tool: checkpoints.py
  local chosen
  chosen=$(ls model/[0-9]*.ckpt | "$AIAYN_PY" "$PEERS/checkpoints.py" pick --every "$VALID" \
    --pattern '/(\d+)\.ckpt$')
  # shellcheck disable=SC2086  # one path a word
  "$JOEY" "$PEERS/checkpoints.py" average-torch --key model_state \
    --out model/averaged.ckpt $chosen > average.log 2>&1
  echo "$chosen" > averaged_from.txt
}

decode() {  # beam 4, GNMT length penalty: log p / ((5 + length) / 6)^alpha (joeynmt/search.py)
  local weights=$PEER_WORK/model/latest.ckpt
  [ "$CHECKPOINT" = averaged ] && weights=$PEER_WORK/model/averaged.ckpt
  sed -e "/^  dev: /d; s#^  test: .*#  test: $PEER_WORK/text/$1.bpe#" \
    -e "s#^  load_model: .*#  load_model: $weights#" \
    -e "s#beam_alpha: .*#beam_alpha: $2#; s#max_output_length: .*#max_output_length: $MAXLEN#" \
    config.yaml > "decode.$1.$2.yaml"
  "$JOEY" -m joeynmt test "decode.$1.$2.yaml" -o "decode.$1.$2" > "test.$1.$2.log" 2>&1
  mv "decode.$1.$2.test" "$3"  # its hypotheses of the `test` set, pieces joined by spaces
}

run_peer joeynmt "$NAME"
