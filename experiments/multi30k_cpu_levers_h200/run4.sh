#!/usr/bin/env bash
# GPU run 4, 2026-11-26 session 2: levers for experiment=multi30k_cpu (issue 34), each at the
# 2 450 updates the recipe gets in its CPU hour, chosen on val; the winner is then run on the CPU.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT; LOGS=/tmp/lev; rm -rf $LOGS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])"); echo "$PWD/src" > "$SITE/aiayn-src.pth"
COMMON="experiment=multi30k_cpu trainer.max_time=null trainer.max_steps=2450 hydra/launcher=submitit_local
 hydra.launcher.timeout_min=30 trainer=gpu trainer.precision=32-true hydra.launcher.gpus_per_node=1 logger=csv
 trainer.enable_progress_bar=false"
i=0
for grid in "ablation=base,norm_pre,C_N2,D_ls0" "ablation=norm_pre optim.lr=2.5e-3" \
            "data.tokenizer.vocab_size=6000,10000" "ablation=C_N2 model.norm_first=true"; do
  timeout -k 5 ${T:-285} python3 train.py -m $COMMON $grid hydra.sweep.dir=$LOGS/m$i > $OUT/m$i.log 2>&1 &
  i=$((i+1))
done
wait; pkill -9 -f "$LOGS/"
for f in $LOGS/m*/*/metrics.json; do python3 - "$f" <<'PY'
import json, sys, yaml, pathlib
f = pathlib.Path(sys.argv[1]); m = json.loads(f.read_text())
o = [x for x in yaml.safe_load((f.parent / ".hydra/overrides.yaml").read_text()) if "max_" not in x and "=" in x]
print(f.parent.parent.name, f.parent.name, " ".join(o[:1] + o[-3:]), "val_bleu %.2f test %.2f" % (m["fit"].get("val/bleu", 0), (m.get("test") or {}).get("test/bleu", 0)))
PY
done
tar --exclude='*.ckpt' --exclude='checkpoints' -czf $OUT/lev.tgz -C $LOGS .
