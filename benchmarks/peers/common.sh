# Sourced by each peer's run.sh: the stages every peer shares (text, training, averaging, alpha
# on val, test, scoring, result.json). The peer script defines `train` (within $BUDGET
# seconds), `decode <split> <alpha> <output file of subword lines, in the split's order>`
# (HYP_PIECES= when the lines are plain text; $CHECKPOINT names the weights to decode:
# `averaged` or `last`), `version` (the framework's version) and optionally `prepare`
# (binarize, vocabulary) and, where $CHECKPOINTS has `averaged`, `average` (the last 5
# checkpoints an epoch apart, with the framework's own tool where it has one:
# checkpoints.py), then calls `run_peer <name> <setting>`. Environment:
#   MULTI30K_ROOT  the Multi30k files (train/val/test2016 .en/.de)
#   PEERS_DIR      the peer venvs (benchmarks/peers/install.sh), default /work/peers
#   PEER_WORK      scratch directory, emptied first (default /tmp/peer_<name>)
#   BUDGET         seconds of training (3300: 55 minutes)
#   ALPHAS         length settings tried on val (default "0.6 1.0 1.5 2.0")
#   CHECKPOINTS    the weights scored, each with its own alpha: "averaged" (setting 1's
#                  default), "last" (setting 2's), or both (aiayn's setting 1)
#   PEER_MALLOC    keep (default): every process keeps freed memory for reuse, set for all by
#                  the environment (GLIBC_TUNABLES); default: glibc as it comes, for all
#   SMOKE=1        a check of the script, not a result: few updates, short decodes
#   DECODE_ONLY=1  decode again (alpha on val, test2016) from the model a finished run in
#                  $PEER_WORK trained, and rewrite its result.json: a decoding fix needs no
#                  new hour of training
set -euo pipefail
PEERS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); REPO=$(cd "$PEERS/../.." && pwd)
PEERS_DIR=${PEERS_DIR:-/work/peers}
BUDGET=${BUDGET:-3300}
ALPHAS=${ALPHAS:-"0.6 1.0 1.5 2.0"}
CHECKPOINTS=${CHECKPOINTS:-averaged}
PEER_MALLOC=${PEER_MALLOC:-keep}
case "$PEER_MALLOC" in  # one allocator setting for every process of every system
  # glibc's mallopt M_MMAP_MAX 0 and M_TRIM_THRESHOLD 1 GiB: what aiayn's train.py sets in its
  # own process (aiayn/kernels/allocator.py), which it leaves alone when the environment does
  keep) export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824 ;;
  default) unset GLIBC_TUNABLES; export AIAYN_KEEP_FREED_MEMORY=0 ;;
  *) echo "PEER_MALLOC is keep or default, not $PEER_MALLOC" >&2; exit 2 ;;
esac
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
  decode val "$1" "hyp.$CHECKPOINT.val.$1"
  bleu=$(score val "hyp.$CHECKPOINT.val.$1")
  echo -e "$CHECKPOINT\t$1\t$bleu" >> val_alphas.tsv
  if "$AIAYN_PY" -c "import sys; sys.exit(not $bleu > $BEST_VAL)"; then
    BEST_ALPHA=$1; BEST_VAL=$bleu
  fi
}

choose_and_test() {  # for each of $CHECKPOINTS: the best alpha on val (past the grid's end
  # while the last one is best: length penalties differ between frameworks), then decode and
  # score test2016 with it; scores.tsv: checkpoint, alpha, val BLEU, test BLEU
  local alpha t0 test_bleu
  : > scores.tsv
  for CHECKPOINT in $CHECKPOINTS; do
    t0=$SECONDS BEST_ALPHA="" BEST_VAL=-1
    for alpha in $ALPHAS; do try_alpha "$alpha"; done
    while [ "$BEST_ALPHA" = "$alpha" ] && [ "$SMOKE" != 1 ]; do
      alpha=$("$AIAYN_PY" -c "print($alpha + 0.5)")
      try_alpha "$alpha"
    done
    echo -e "choose_alpha_on_val.$CHECKPOINT\t$((SECONDS - t0))" >> "$PEER_WORK/stages.tsv"
    timed "test.$CHECKPOINT" decode test2016 "$BEST_ALPHA" "hyp.$CHECKPOINT.test2016"
    test_bleu=$(score test2016 "hyp.$CHECKPOINT.test2016")
    echo -e "$CHECKPOINT\t$BEST_ALPHA\t$BEST_VAL\t$test_bleu" >> scores.tsv
  done
}

run_peer() {  # run_peer <name> <setting>: the whole command, result.json at the end
  PEER_NAME=$1
  if [ "$DECODE_ONLY" = 1 ]; then  # the trained model in $PEER_WORK kept, decoding redone
    cd "$PEER_WORK"; rm -f val_alphas.tsv scores.tsv hyp.*
    sed -i '/^choose_alpha_on_val/d; /^test/d' stages.tsv
  else
    rm -rf "$PEER_WORK"; mkdir -p "$PEER_WORK"; cd "$PEER_WORK"
    : > stages.tsv
    timed text "$AIAYN_PY" "$PEERS/text.py" export --out "$PEER_WORK/text"
    if declare -F prepare > /dev/null; then timed prepare prepare; fi
    timed train train
    # a system whose own command averages (aiayn's recipe) defines no `average`
    if [[ " $CHECKPOINTS " == *" averaged "* ]] && declare -F average > /dev/null; then
      timed average average
    fi
  fi
  choose_and_test
  "$AIAYN_PY" "$PEERS/result.py" "$PEER_WORK" --framework "$PEER_NAME" --setting "$2" \
    --smoke "$SMOKE" --version "$(version)" --malloc "$PEER_MALLOC"
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
