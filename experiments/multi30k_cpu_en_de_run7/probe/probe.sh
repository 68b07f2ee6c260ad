#!/usr/bin/env bash
# The throughput probe before run 7 (experiments/multi30k_cpu_en_de.md): 120 updates of each
# shape, no validation, no test; train/tokens_per_sec and train/mfu from each metrics.csv
# (the median after the first two rows), peak RSS from each .time file. Alone, venv active:
#   MULTI30K_ROOT=../shared/data/multi30k bash experiments/multi30k_cpu_en_de_run7/probe/probe.sh [work dir]
set -uo pipefail
cd "$(dirname "$0")/../../.."
W=${1:-/tmp/probe}; mkdir -p "$W"
export WANDB_MODE=offline
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory}"
python benchmarks/machine.py > "$W/machine.txt" 2>&1
probe() {  # probe <name> <overrides...>
  local n=$1; shift
  /usr/bin/time -v -o "$W/$n.time" python train.py trainer.max_time=null trainer.max_steps=120 \
    test=false trainer.check_val_every_n_epoch=100 logger=csv trainer.enable_progress_bar=false \
    hydra.run.dir="$W/$n" "$@" > "$W/$n.log" 2>&1
  echo "$n rc=$?"
}
probe cpu experiment=multi30k_cpu
probe tiny experiment=multi30k_tiny
probe tiny8k experiment=multi30k_tiny data.tokenizer.vocab_size=8000
probe cpu_torch experiment=multi30k_cpu kernels=torch
