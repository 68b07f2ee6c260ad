# Sourced by each peer's run.sh: the stages every peer shares (text, alpha on val, test,
# scoring, result.json). The peer script defines `train` (within $BUDGET seconds), `decode
# <split> <alpha> <output file of subword lines, in the split's order>` (HYP_PIECES= when the
# lines are plain text), `version` (the framework's version) and optionally `prepare`
# (binarize, vocabulary), then calls `run_peer <name> <setting>`. Environment:
#   MULTI30K_ROOT  the Multi30k files (train/val/test2016 .en/.de)
#   PEERS_DIR      the peer venvs (benchmarks/peers/install.sh), default /work/peers
#   PEER_WORK      scratch directory, emptied first (default /tmp/peer_<name>)
#   BUDGET         seconds of training (3300: 55 minutes)
#   ALPHAS         length settings tried on val (default "0.6 1.0 1.5 2.0")
#   SMOKE=1        a check of the script, not a result: few updates, short decodes
#   DECODE_ONLY=1  decode again (alpha on val, test2016) from the model a finished run in
#                  $PEER_WORK trained, and rewrite its result.json: a decoding fix needs no
#                  new hour of training
set -euo pipefail
PEERS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); REPO=$(cd "$PEERS/../.." && pwd)
PEERS_DIR=${PEERS_DIR:-/work/peers}
BUDGET=${BUDGET:-3300}
ALPHAS=${ALPHAS:-"0.6 1.0 1.5 2.0"}
SMOKE=${SMOKE:-0}
DECODE_ONLY=${DECODE_ONLY:-0}
AIAYN_PY=${AIAYN_PY:-$REPO/.venv/bin/python}
HYP_PIECES=${HYP_PIECES---pieces}  # how decode writes: subword pieces (or plain text)
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
# OpenNMT-py's and fairseq's checkpoints hold an argparse.Namespace, which the weights-only
# load of torch >= 2.6 refuses; each peer loads only the checkpoints its own run wrote
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1

timed() {  # timed <stage> <command...>: runs it, appends "<stage>\t<seconds>" to stages.tsv
  local name=$1 t0=$SECONDS; shift
  "$@"
  echo -e "$name\t$((SECONDS - t0))" >> "$PEER_WORK/stages.tsv"
}

score() {  # score <split> <hypothesis file>: tokenized lowercased BLEU, the one scorer
  "$AIAYN_PY" "$PEERS/text.py" score --hyp "$2" $HYP_PIECES --split "$1" --lang de \
    | "$AIAYN_PY" -c "import json, sys; print(json.load(sys.stdin)['bleu_tok'])"
}

try_alpha() {  # try_alpha <alpha>: decode and score val at it, keep it if it is the best
  local bleu
  decode val "$1" "hyp.val.$1"
  bleu=$(score val "hyp.val.$1")
  echo -e "$1\t$bleu" >> val_alphas.tsv
  if "$AIAYN_PY" -c "import sys; sys.exit(not $bleu > $BEST_VAL)"; then
    BEST_ALPHA=$1; BEST_VAL=$bleu
  fi
}

choose_and_test() {  # the best alpha on val (past the grid's end while the last one is best:
  # length penalties differ between frameworks), then decode and score test2016 with it
  local alpha t0=$SECONDS
  BEST_ALPHA=""; BEST_VAL=-1
  for alpha in $ALPHAS; do try_alpha "$alpha"; done
  while [ "$BEST_ALPHA" = "$alpha" ] && [ "$SMOKE" != 1 ]; do
    alpha=$("$AIAYN_PY" -c "print($alpha + 0.5)")
    try_alpha "$alpha"
  done
  echo -e "choose_alpha_on_val\t$((SECONDS - t0))" >> "$PEER_WORK/stages.tsv"
  timed test decode test2016 "$BEST_ALPHA" hyp.test2016
  TEST_BLEU=$(score test2016 hyp.test2016)
}

run_peer() {  # run_peer <name> <setting>: the whole command, result.json at the end
  PEER_NAME=$1
  if [ "$DECODE_ONLY" = 1 ]; then  # the trained model in $PEER_WORK kept, decoding redone
    cd "$PEER_WORK"; rm -f val_alphas.tsv hyp.*
    sed -i '/^choose_alpha_on_val\t/d; /^test\t/d' stages.tsv
  else
    rm -rf "$PEER_WORK"; mkdir -p "$PEER_WORK"; cd "$PEER_WORK"
    : > stages.tsv
    timed text "$AIAYN_PY" "$PEERS/text.py" export --out "$PEER_WORK/text"
    if declare -F prepare > /dev/null; then timed prepare prepare; fi
    timed train train
  fi
  choose_and_test
  "$AIAYN_PY" "$PEERS/result.py" "$PEER_WORK" --framework "$PEER_NAME" --setting "$2" \
    --alpha "$BEST_ALPHA" --val "$BEST_VAL" --test "$TEST_BLEU" --smoke "$SMOKE" \
    --version "$(version)"
}

dist_version() {  # dist_version <python> <distribution>: its installed version
  "$1" -c "from importlib.metadata import version; print(version('$2'))"
}

train_timed() {  # train_timed <seconds> <command...>: train.log, train.time (peak RSS); a
  # framework without a clock of its own is stopped at <seconds> (exit 124 is the budget) by
  # SIGTERM, or by $STOP_SIGNAL where it saves its weights on another (JoeyNMT: INT)
  local limit=$1; shift
  /usr/bin/time -v -o train.time timeout -s "${STOP_SIGNAL:-TERM}" "$limit" "$@" > train.log 2>&1 \
    || [ $? -eq 124 ]
}
