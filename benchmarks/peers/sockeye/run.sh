#!/usr/bin/env bash
# Sockeye 3.1.34 against aiayn's multi30k_cpu.
# SETTING=same (default), setting 1, the same model and recipe: post-norm
# Transformer 3+3 (no pre-processing, "drn" after each sublayer, no final LayerNorm), d_model
# 256, 4 heads, d_ff 1024, dropout 0.1 on the residuals and on the embeddings (with their
# positions), none on attention or after the ReLU, all embeddings shared, label smoothing
# 0.1 as torch computes it (aiayn's), Adam (0.9, 0.98) with inv-sqrt-decay:
# 0.033541 * min(1, t / 500) / sqrt(max(t, 500)) peaks at 1.5e-3 on update 500, batches of
# <= 2 000 padded target tokens (max-word; buckets 8 tokens wide on both sides), seed 1234.
# Differences Sockeye does not let us remove:
# - its attention's projections have no bias (aiayn's have), its output layer has one
#   (aiayn's has none), and its LayerNorm eps is 1e-6 (aiayn's: 1e-5)
# - --max-seconds is checked only at a checkpoint: training stops at the first one after the
#   budget. A checkpoint (loss-only validation, no decoding) every 100 updates keeps that
#   overshoot under 100 updates, where aiayn validates once an epoch (~280 updates here).
# - its vocabulary is built from the training text's pieces (the shared 8k less pieces that
#   never occur there, padded to a multiple of 8), not read from vocab.txt
# - the last batch of each length bucket is filled up with random repeats of its sentences
# - its tok/sec counts padded source tokens: result.py takes its sentences/s times the mean
#   target length, and its 50-update windows include any checkpoint (validation) within
# SETTING=own, setting 2: Sockeye's own documented Transformer recipe for small data, the
# training command of its IWSLT 2017 tutorial (docs/tutorials/multilingual.md,
# https://awslabs.github.io/sockeye/tutorials/multilingual.html): Sockeye's defaults with a
# shared vocabulary and all embeddings tied. Those defaults (arguments.py): a Transformer base,
# 6+6 pre-norm layers, d_model 512, 8 heads, d_ff 2048, dropout 0.1 on attention, activations
# and residuals, no embedding dropout, label smoothing 0.1 (its mxnet-style), Adam (0.9,
# 0.999) at 2e-4 without warmup, times 0.9 after 8 checkpoints without a better val
# perplexity, batches of 4 096 target words, a checkpoint every 4 000 updates that also
# greedy-decodes 500 val sentences, seed 1. Changed, and why:
# - --use-cpu (no GPU) and --max-seconds (the budget, as in setting 1).
# - a checkpoint every 10 updates, not 4 000: --max-seconds is checked only at a checkpoint,
#   an update of this model takes about 18 s here (the SMOKE=1 run: 0.055-0.059 updates/s),
#   so about 180 fit in the budget, and the harness decodes the last checkpoint. The plateau
#   schedule counts checkpoints, so its patience of 8 is 80 updates here, not 32 000.
# - --decode-and-evaluate 0: the 500-sentence decode at each of these checkpoints would take
#   much of the budget, and the harness does not use it.
# - the data as in setting 1 (the same text and vocabulary for every peer, 250 positions).
# Decoding as the tutorial's sockeye-translate command: no --max-output-length, so Sockeye's
# own limit, ceil(source length x (mean + 2 std of the training data's length ratio)), not
# setting 1's 250 tokens for every sentence. Beam 4 and alpha are the harness's, as for all.
# Whole command timed by stage, alone:
#   bash benchmarks/peers/install.sh sockeye      # its venv, once
#   MULTI30K_ROOT=<dir> [SETTING=own] bash benchmarks/peers/sockeye/run.sh
# Result: $PEER_WORK/result.json (default /tmp/peer_sockeye), Sockeye's logs beside it.
PEER_WORK=${PEER_WORK:-/tmp/peer_sockeye}
source "$(dirname "$0")/../common.sh"
SOCKEYE=$PEERS_DIR/sockeye/venv/bin
SETTING=${SETTING:-same}
SAME=(--seed 1234 --num-layers 3 --num-embed 256 --transformer-model-size 256
  --transformer-attention-heads 4 --transformer-feed-forward-num-hidden 1024
  --transformer-preprocess "" --transformer-postprocess drn --weight-tying-type src_trg_softmax
  --embed-dropout 0 --transformer-dropout-prepost 0.1 --transformer-dropout-attention 0
  --transformer-dropout-act 0 --label-smoothing 0.1 --label-smoothing-impl torch
  --optimizer adam --optimizer-betas 0.9:0.98 --initial-learning-rate 0.033541
  --learning-rate-scheduler-type inv-sqrt-decay --learning-rate-warmup 500
  --gradient-clipping-type none --batch-type max-word --batch-size 2000
  --batch-sentences-multiple-of 1 --keep-last-params 12)  # average(): 5 an epoch apart
OWN=(--weight-tying-type src_trg_softmax --keep-last-params 2)  # the tutorial; disk space
case "$SETTING" in  # its flags, the checkpoint interval (updates), the name
  same) FLAGS=("${SAME[@]}") EVERY=100 NAME="same model and recipe" ;;
  own) FLAGS=("${OWN[@]}") EVERY=10 NAME="Sockeye's IWSLT17 tutorial" ;;
  *) echo "SETTING is same or own, not $SETTING" >&2; exit 2 ;;
esac
[ "$SETTING" = same ] || CHECKPOINTS=last  # setting 2 decodes its last checkpoint
# SMOKE=1: 50 updates, as Sockeye logs its speed every 50
if [ "$SMOKE" = 1 ]; then EVERY=25; STOP=(--max-updates 50 --checkpoint-interval 25) MAXLEN=10; else
  STOP=(--max-seconds "$BUDGET" --checkpoint-interval "$EVERY") MAXLEN=250; fi
LIMIT=(--max-output-length "$MAXLEN")  # setting 2 (not SMOKE=1): Sockeye's own limit
if [ "$SETTING" = own ] && [ "$SMOKE" != 1 ]; then LIMIT=(); fi

version() { dist_version "$SOCKEYE/python" sockeye; }

prepare() {  # shared vocabulary, length buckets; 250 positions, for the decode's 250 tokens
  "$SOCKEYE/sockeye-prepare-data" -s text/train.bpe.en -t text/train.bpe.de --shared-vocab \
    --max-seq-len 250:250 --bucket-width 8 -o prepared > prepare.log 2>&1
}

train() {  # Sockeye keeps its own clock; the timeout is only a safety net
  train_timed "$((BUDGET + 900))" "$SOCKEYE/sockeye-train" -d prepared -vs text/val.bpe.en \
    -vt text/val.bpe.de -o model --use-cpu --decode-and-evaluate 0 "${FLAGS[@]}" "${STOP[@]}"
}

# the last checkpoint saved (training was stopped at the budget)
last_checkpoint() {
  local params
  params=$(ls model/params.[0-9]* | sort | tail -1)
  echo "${params##*.}"
}

average() {  # its own tool, sockeye-average, on the last 5 checkpoints an epoch apart (a
  # checkpoint every $EVERY updates), into a copy of the model directory that decodes it
  local chosen
  chosen=$(ls model/params.[0-9]* | "$AIAYN_PY" "$PEERS/checkpoints.py" pick --per "$EVERY" \
    --pattern 'params\.(\d+)$')
  rm -rf averaged; mkdir averaged
  find model -maxdepth 1 -type f ! -name 'params.*' -exec cp {} averaged/ \;
  # shellcheck disable=SC2086  # one path a word
  "$SOCKEYE/sockeye-average" -o averaged/params.00000 $chosen > average.log 2>&1
  echo "$chosen" > averaged_from.txt
}

decode() {  # beam 4, GNMT length penalty: ((5 + length) / 6)^alpha, Sockeye's with beta 5
  local model=model checkpoint
  checkpoint=$(last_checkpoint)
  [ "$CHECKPOINT" = averaged ] && model=averaged checkpoint=00000
  "$SOCKEYE/sockeye-translate" -m "$model" -c "$checkpoint" -i "text/$1.bpe.en" -o "$3" \
    --use-cpu --beam-size 4 --batch-size 64 --length-penalty-alpha "$2" --length-penalty-beta 5 \
    "${LIMIT[@]}" > "translate.$1.$2.log" 2>&1
}

run_peer sockeye "$NAME"
