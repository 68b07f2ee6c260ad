#!/usr/bin/env bash
# GPU speed, run 5 (issue 48), prepared on the CPU for the next session lent a GPU: what runs
# 3-4 left untested. Three calls that each stand alone (PART=a, c, b in that order of worth;
# a and b about 5 minutes, c about 7: give each call a timeout of its part plus a minute):
#   PART=a: the GPU tests of the whole-step CUDA graph search (c8ca8d6, now the default GPU
#           decoding path) and of decode_speed's CUDA columns; the decode table at batch 128.
#   PART=b: the base update at 25k tokens eager with memory-efficient attention and with
#           cuDNN's pinned (run 4's eager row let torch pick; flash takes no mask, and aiayn
#           passes its padding masks on a GPU), and compiled with the batch dimension symbolic
#           (`batch`, one graph for train.py's varying batch sizes).
#   PART=c: the real command after fa50a17 (gradients read from the optimizer, normalised in
#           one call) beside run 4's 10.4%, then the same with compile=true: whether compile
#           wins for train.py's varying shapes once its compilations are done.
# Needs (carried, git-ignored; made by `bash experiments/gpu_carry.sh`): .whl (hydra-core,
# omegaconf, antlr4, sacremoses), .gpu/multi30k.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MULTI30K_ROOT=$PWD/.gpu/multi30k
step() { echo "=== $(date +%T) $*"; }
quiet() { grep -v "^[WI][0-9]\{4\} \|^ *$"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__)"
SHAPE25="--batch-size 520 --src-len 48 --tgt-len 48 --vocab 37000"
case ${PART:?PART=a, b or c} in
a)
  {
  step GPU tests
  timeout -k 5 ${T_TESTS:-200} python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA -n 3 \
    -k "cuda_graph_decoding or beam_search_evaluate or decode_speed_on_cuda" \
    --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -n 40
  } 2>&1 | tee $OUT/gpu_tests.txt
  {
  step decode, base shape, 512 sentences in batches of 128
  timeout -k 5 ${T_DECODE:-120} python3 benchmarks/decode_speed.py --device cuda --shape base --sentences 512 --batch-size 128 --repeats 2
  } 2>&1 | quiet | tee $OUT/decode.txt
  ;;
b)
  {
  for backend in efficient cudnn; do
    step harness base at 25k, eager, SDPA $backend
    timeout -k 5 ${T_SDPA:-45} python3 benchmarks/train_speed.py --device cuda --shapes base $SHAPE25 --aiayn eager --sdpa $backend --repeats 3
  done
  step harness base at 25k: compiled with a symbolic batch dimension
  timeout -k 5 ${T_BATCH:-110} python3 benchmarks/train_speed.py --device cuda --shapes base $SHAPE25 --aiayn batch --repeats 3
  } 2>&1 | quiet | tee $OUT/harness25k.txt | grep -E "^===|^\| |Error|error"
  ;;
c)
  real() {  # real <name> <updates> <timeout> [overrides]: train.py experiment=paper_base
    local name=$1 updates=$2 limit=$3; shift 3
    step "real command ($name): train.py experiment=paper_base data=multi30k $*, $updates updates"
    SECONDS=0
    timeout -k 5 "$limit" python3 train.py experiment=paper_base data=multi30k trainer.max_steps=$updates \
       test=false logger=csv trainer.log_every_n_steps=10 paths.log_dir=/tmp/real_$name \
       trainer.enable_progress_bar=false trainer.num_sanity_val_steps=0 "$@"
    echo "rc=$? wall=${SECONDS}s"
    local run; run=$(ls -d /tmp/real_$name/train/runs/* | head -1)
    cp $run/metrics.json $OUT/real_${name}_metrics.json
    cp $(find $run -name metrics.csv | head -1) $OUT/real_${name}_metrics.csv
    python3 - $OUT/real_${name}_metrics.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/mfu")]
for start in (30, 100):
    late = [r for r in rows if float(r["step"]) >= start]
    for key in ("train/mfu", "train/tokens_per_sec"):
        values = [float(r[key]) for r in late] or [float("nan")]
        print(key, f"from update {start}: median", statistics.median(values), "max", max(values), "n", len(late))
PY
  }
  {
  real eager 120 80
  real compiled 200 ${T_COMPILED:-300} compile=true
  } 2>&1 | quiet | tee $OUT/real.txt | grep -E "^===|^\| |rc=|median|Error|error"
  ;;
esac
step done
