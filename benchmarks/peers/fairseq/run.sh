#!/usr/bin/env bash
# fairseq (the fairseq-fixed 0.12.3.1 fork: upstream 0.12.2 does not import on Python 3.11)
# against aiayn's multi30k_cpu. SETTING=same (default), setting 1: post-norm Transformer
# 3+3, d_model 256, 4 heads, d_ff 1024, dropout 0.1, all embeddings shared, label smoothing
# 0.1, Adam (0.9, 0.98) with fairseq's inverse_sqrt (the schedule aiayn's recipe copies):
# peak 1.5e-3 after 500 warmup updates, <= 2 000 tokens a batch; stopped by its own clock
# (--stop-time-hours) after the budget. SETTING=own, setting 2: fairseq's documented
# small-data recipe, IWSLT'14 de-en in examples/translation/README.md (transformer_iwslt_de_en:
# 6+6 layers, d_model 512, 4 heads, d_ff 1024; dropout 0.3, weight decay 1e-4, lr 5e-4, batches
# of 4 096 tokens, beam 5 there), the decoder's input and output embeddings shared as there.
# Its 4 000 warmup updates are scaled to 100: an update of this model takes about 8 s here
# (experiments/peers/smoke/fairseq_own/), so the budget holds about 400, and 100 puts the peak
# a quarter of the way in, as multi30k_tiny's published 2 000 of 8 000 do.
# Whole command timed by stage, alone:
#   bash benchmarks/peers/install.sh fairseq_fixed      # its venv, once
#   MULTI30K_ROOT=<dir> bash benchmarks/peers/fairseq/run.sh
# Result: $PEER_WORK/result.json (default /tmp/peer_fairseq), fairseq's logs beside it.
PEER_WORK=${PEER_WORK:-/tmp/peer_fairseq}
source "$(dirname "$0")/../common.sh"
FS=$PEERS_DIR/fairseq-fixed/venv/bin
if [ "$SMOKE" = 1 ]; then STOP=(--max-update 20) MAXLEN=10 SAVE=10; else
  STOP=(--stop-time-hours "$("$AIAYN_PY" -c "print($BUDGET / 3600)")") MAXLEN=200 SAVE=50; fi

version() { dist_version "$FS/python" fairseq-fixed; }

prepare() {
  "$FS/fairseq-preprocess" --source-lang en --target-lang de --trainpref text/train.bpe \
    --validpref text/val.bpe --testpref text/test2016.bpe --destdir bin --joined-dictionary \
    --workers 2 > preprocess.log 2>&1
}

SETTING=${SETTING:-same}
if [ "$SETTING" = same ]; then
  RECIPE=(--arch transformer --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256
    --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
    --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings
    --dropout 0.1 --lr 1.5e-3 --warmup-updates 500 --max-tokens 2000)
  NAME="same model and recipe"
else
  RECIPE=(--arch transformer_iwslt_de_en --share-decoder-input-output-embed --dropout 0.3
    --weight-decay 0.0001 --lr 5e-4 --warmup-updates 100 --max-tokens 4096)
  NAME="fairseq's IWSLT'14 recipe"
fi
[ "$SETTING" = same ] || CHECKPOINTS=last  # setting 2 decodes its last checkpoint

train() {  # fairseq keeps its own clock; the timeout is only a safety net. A checkpoint
  # every 50 updates, as eole's and OpenNMT-py's (average() takes 5 an epoch apart); no
  # validation: the harness chooses alpha on val itself
  train_timed "$((BUDGET + 900))" "$FS/fairseq-train" bin "${RECIPE[@]}" \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer adam \
    --adam-betas "(0.9, 0.98)" --lr-scheduler inverse_sqrt --warmup-init-lr 1e-7 \
    --seed 1234 --cpu --num-workers 0 --save-dir ckpt --no-epoch-checkpoints \
    --save-interval-updates "$SAVE" --keep-interval-updates 20 --disable-validation \
    --log-format simple --log-interval 50 "${STOP[@]}"
}

average() {  # the last 5 checkpoints an epoch apart; fairseq's scripts/average_checkpoints.py
  # is in its repository, not in fairseq-fixed's sdist or wheel: checkpoints.py means the
  # `model` weights and keeps the rest of the last checkpoint, as that script does
  local chosen
  chosen=$(ls ckpt/checkpoint_*_*.pt | "$AIAYN_PY" "$PEERS/checkpoints.py" pick \
    --pattern 'checkpoint_\d+_(\d+)\.pt$')
  # shellcheck disable=SC2086  # one path a word
  "$FS/python" "$PEERS/checkpoints.py" average-torch --key model --out ckpt/averaged.pt \
    $chosen > average.log 2>&1
  echo "$chosen" > averaged_from.txt
}

decode() {  # beam 4, fairseq's length penalty (score / length^lenpen); batches of any size
  # (the default multiple of 8 drops the last, odd-sized batch: fairseq issue 5351)
  local subset=valid
  [ "$1" = test2016 ] && subset=test
  local weights=ckpt/checkpoint_last.pt
  [ "$CHECKPOINT" = averaged ] && weights=ckpt/averaged.pt
  "$FS/fairseq-generate" bin --path "$weights" --gen-subset "$subset" --beam 4 \
    --lenpen "$2" --max-len-b "$MAXLEN" --max-tokens 4000 --required-batch-size-multiple 1 \
    --cpu > "generate.$1.$2.log" 2>&1
  # one line per source sentence, by id: a sentence fairseq skipped stays empty (and counts)
  awk -F'\t' -v n="$(wc -l < "text/$1.bpe.en")" '/^H-/ {h[substr($1, 3)] = $3}
    END {for (i = 0; i < n; i++) print h[i]}' "generate.$1.$2.log" > "$3"
}

run_peer fairseq "$NAME"
