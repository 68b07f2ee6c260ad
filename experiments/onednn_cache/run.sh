#!/usr/bin/env bash
# The CPU recipe for STEPS updates (default 300) under each cache setting, one run at a time on
# a quiet machine: peak resident memory and speed from each run's own metrics.csv
# (experiments/onednn_cache.md).
#   MULTI30K_ROOT=<dir> VARIANTS="shipped both128 both256" STEPS=300 bash experiments/onednn_cache/run.sh
# Runs go to $OUT_DIR/run_<variant> and run_<variant>.log (default /tmp/onednn_cache); an
# existing one is refused, not overwritten.
set -u
cd "$(dirname "$0")/../.."
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
export WANDB_MODE=offline
OUT_DIR=${OUT_DIR:-/tmp/onednn_cache}
mkdir -p "$OUT_DIR"
for v in ${VARIANTS:-shipped both128 both256}; do
  case $v in
    shipped) E=() ;;
    both128) E=(ONEDNN_PRIMITIVE_CACHE_CAPACITY=128 LRU_CACHE_CAPACITY=128) ;;
    both256) E=(ONEDNN_PRIMITIVE_CACHE_CAPACITY=256 LRU_CACHE_CAPACITY=256) ;;
    *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
  if [ -e "$OUT_DIR/run_$v" ] || [ -e "$OUT_DIR/run_$v.log" ]; then
    echo "$OUT_DIR/run_$v or its .log exists: move it away or choose another OUT_DIR" >&2; exit 2
  fi
  env "${E[@]}" python train.py experiment=multi30k_cpu trainer.max_time=null \
    trainer.max_steps="${STEPS:-300}" test=false "hydra.run.dir=$OUT_DIR/run_$v" \
    trainer.enable_progress_bar=false > "$OUT_DIR/run_$v.log" 2>&1
  echo "$v rc=$?"
done
