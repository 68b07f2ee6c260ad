#!/usr/bin/env bash
# GPU check, 2026-11-26: the GPU test layer, train_speed --device cuda, the first command.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo "=== $(date +%T) $*"; }
step env
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
echo "$PWD/src" > "$SITE/aiayn-src.pth"
python3 -c "import torch, lightning, hydra, aiayn, ctranslate2 as c; print('torch', torch.__version__, 'lightning', lightning.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(), 'ct2', c.__version__, c.get_cuda_device_count())"
lscpu | grep -E "Model name|^CPU\(s\)"
step gpu test layer
timeout -k 5 ${T_TESTS:-200} python3 -m pytest -m gpu tests/gpu -n 6 -p no:cacheprovider -k "${K:-not train_speed}" -rA --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -n ${TAIL:-60} 
step train_speed
timeout -k 5 ${T_BENCH:-110} python3 benchmarks/train_speed.py --device cuda --repeats 3 --shapes tiny,small,base,big --batch-size 256 2>&1 | tee $OUT/train_speed.txt | tail -n 40
step first command, one GPU
for devices in 4 1; do
  timeout -k 5 60 python3 train.py model=base trainer.devices=$devices trainer.max_steps=200 trainer.max_epochs=-1 \
     trainer.val_check_interval=200 trainer.check_val_every_n_epoch=null trainer.log_every_n_steps=20 \
     paths.log_dir=/tmp/first logger=csv > $OUT/first_devices$devices.log 2>&1
  echo "devices=$devices rc=$?"; tail -n 15 $OUT/first_devices$devices.log
done
cp /tmp/first/train/runs/*/metrics.json $OUT/first_metrics.json 2>/dev/null
cp /tmp/first/train/runs/*/csv/*/metrics.csv $OUT/first_metrics.csv 2>/dev/null || find /tmp/first -name "metrics.csv" | head -1 | xargs -I{} cp {} $OUT/first_metrics.csv
step done
