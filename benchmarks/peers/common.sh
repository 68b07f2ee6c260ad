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
set -euo pipefail
PEERS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); REPO=$(cd "$PEERS/../.." && pwd)
PEERS_DIR=${PEERS_DIR:-/work/peers}
BUDGET=${BUDGET:-3300}
ALPHAS=${ALPHAS:-"0.6 1.0 1.5 2.0"}
SMOKE=${SMOKE:-0}
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

choose_and_test() {  # decode val at each alpha, keep the best, decode and score test2016
  local alpha bleu t0=$SECONDS
  BEST_ALPHA=""; BEST_VAL=-1
  for alpha in $ALPHAS; do
    decode val "$alpha" "hyp.val.$alpha"
    bleu=$(score val "hyp.val.$alpha")
    echo -e "$alpha\t$bleu" >> val_alphas.tsv
    if "$AIAYN_PY" -c "import sys; sys.exit(not $bleu > $BEST_VAL)"; then
      BEST_ALPHA=$alpha; BEST_VAL=$bleu
    fi
  done
  echo -e "choose_alpha_on_val\t$((SECONDS - t0))" >> "$PEER_WORK/stages.tsv"
  timed test decode test2016 "$BEST_ALPHA" hyp.test2016
  TEST_BLEU=$(score test2016 hyp.test2016)
}

run_peer() {  # run_peer <name> <setting>: the whole command, result.json at the end
  PEER_NAME=$1
  rm -rf "$PEER_WORK"; mkdir -p "$PEER_WORK"; cd "$PEER_WORK"
  : > stages.tsv
  timed text "$AIAYN_PY" "$PEERS/text.py" export --out "$PEER_WORK/text"
  if declare -F prepare > /dev/null; then timed prepare prepare; fi
  timed train train
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
