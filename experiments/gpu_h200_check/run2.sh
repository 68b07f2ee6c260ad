#!/usr/bin/env bash
# GPU check 2, 2026-11-26: CT2 test rerun, Multi30k recipe on the GPU, default layer with CUDA.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
echo "$PWD/src" > "$SITE/aiayn-src.pth"
step ct2 gpu test
timeout -k 5 60 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -k ctranslate2 -rA 2>&1 | tail -n 6
step multi30k_cpu recipe on the GPU, 2450 updates
SECONDS=0
timeout -k 5 250 python3 train.py experiment=multi30k_cpu trainer=gpu trainer.max_time=null trainer.max_steps=2450 \
   paths.log_dir=/tmp/m30k trainer.enable_progress_bar=false > $OUT/m30k.log 2>&1
echo "rc=$? wall=${SECONDS}s"; grep -E "test/|stopped|val/bleu" $OUT/m30k.log | tail -n 8
RUN=$(ls -d /tmp/m30k/train/runs/* | head -1)
cp $RUN/metrics.json $OUT/m30k_metrics.json; cp $(find $RUN -name metrics.csv | head -1) $OUT/m30k_metrics.csv
step default test layer with CUDA visible
timeout -k 5 ${T_DEF:-110} python3 -m pytest -n 14 -p no:cacheprovider -q -rf --timeout 100 2>&1 | tee $OUT/default_layer.log | tail -n 25
step done
