#!/usr/bin/env bash
# Recreate the peer-NMT-framework venvs recorded in INSTALL.md (2026-11-26).
# Each framework gets its own venv under ${PEERS_DIR:-/work/peers}/<name>/venv.
# torch==2.13.0 (CPU wheel from the local index) is always installed first.
# Framework versions are pinned to what the bare `pip install <name>` resolved to
# on 2026-11-26. Failures are reported and the script continues.
# Usage: bash install.sh [eole|opennmt_py|fairseq|fairseq_fixed|joeynmt|sockeye ...]
set -u

PEERS_DIR=${PEERS_DIR:-/work/peers}
PY=${PY:-python3.11}
TORCH_CONSTRAINT="$PEERS_DIR/constraints-torch.txt"

fresh_venv() {  # $1 = name; recreates $PEERS_DIR/$1/venv from scratch and installs torch 2.13.0
  local d="$PEERS_DIR/$1/venv"
  rm -rf "$d"
  mkdir -p "$PEERS_DIR/$1"
  "$PY" -m venv "$d" || return 1
  "$d/bin/pip" install torch==2.13.0 || return 1
}

report() {  # $1 = name, $2 = status
  echo "=== $1: $2"
}

plain_venv() {  # $1 = name, $2 = pip requirement, $3 = a dependency it does not declare but
  # its CLI imports, $4 = its module, $5... = its CLI (run with --help)
  local name=$1 requirement=$2 undeclared=$3 module=$4; shift 4
  local V="$PEERS_DIR/$name/venv/bin"
  fresh_venv "$name" || { report "$name" "venv/torch FAILED"; return 0; }
  "$V/pip" install "$requirement" "$undeclared" || { report "$name" "install FAILED"; return 0; }
  "$V/python" -c "import $module, torch; print($module.__version__, torch.__version__)" \
      || { report "$name" "import FAILED"; return 0; }
  "$V/$1" "${@:2}" --help >/dev/null || { report "$name" "CLI FAILED"; return 0; }
  report "$name" OK
}

eole() {
  # eole 0.6.4 does not declare aiohttp, but `eole <anything>` imports it
  # (eole/bin/tools/load_test.py); without it the CLI dies with ModuleNotFoundError.
  plain_venv eole eole==0.6.4 aiohttp eole eole train
}

opennmt_py() {
  # A plain `pip install OpenNMT-py` (3.5.1) pins torch<2.3,>=2.1 and silently replaces
  # torch 2.13.0+cpu with the CUDA build of torch 2.2.2 (+~3 GB of nvidia-* wheels).
  # Instead: --no-deps, then every other requirement of OpenNMT-py 3.5.1.
  local V="$PEERS_DIR/opennmt-py/venv/bin"
  fresh_venv opennmt-py || { report opennmt-py "venv/torch FAILED"; return 0; }
  "$V/pip" install --no-deps OpenNMT-py==3.5.1 || { report opennmt-py "install FAILED"; return 0; }
  "$V/pip" install configargparse "ctranslate2>=4,<5" "tensorboard>=2.3" flask waitress \
      "pyonmttok>=1.37,<2" pyyaml sacrebleu rapidfuzz pyahocorasick fasttext-wheel spacy six \
      || { report opennmt-py "deps install FAILED"; return 0; }
  "$V/python" -c "import onmt, torch; print(onmt.__version__, torch.__version__)" || { report opennmt-py "import FAILED"; return 0; }
  "$V/onmt_train" --help >/dev/null || { report opennmt-py "CLI FAILED"; return 0; }
  report opennmt-py OK
}

fairseq_venv() {  # $1 = venv name, $2 = pip requirement: a fairseq built from its sdist
  # PIP_CONSTRAINT keeps the isolated build env (pyproject requires bare `torch`) on 2.13.0+cpu.
  local V="$PEERS_DIR/$1/venv/bin"
  fresh_venv "$1" || { report "$1" "venv/torch FAILED"; return 0; }
  printf 'torch==2.13.0\n' > "$TORCH_CONSTRAINT"
  PIP_CONSTRAINT="$TORCH_CONSTRAINT" MAX_JOBS=1 "$V/pip" install "$2" \
      || { report "$1" "install FAILED"; return 0; }
  "$V/python" -c "import fairseq; print(fairseq.__version__)" || { report "$1" "import FAILED"; return 0; }
  "$V/fairseq-train" --help >/dev/null || { report "$1" "CLI FAILED"; return 0; }
  report "$1" OK
}

fairseq() {
  # fairseq 0.12.2 (sdist only) builds on Python 3.11, but `import fairseq` fails (expected):
  # ValueError: mutable default <class 'fairseq.dataclass.configs.CommonConfig'> for field common ...
  fairseq_venv fairseq fairseq==0.12.2
}

fairseq_fixed() {
  # Third-party PyPI fork "fairseq-fixed" 0.12.3.1 ("Now Supporting Python 3.11+"): builds
  # (~4.5 min), imports, fairseq-train --help works with torch 2.13.0+cpu.
  fairseq_venv fairseq-fixed fairseq-fixed==0.12.3.1
}

joeynmt() {
  # joeynmt 2.3.0 does not declare importlib_metadata, but joeynmt/helpers.py imports it;
  # `import joeynmt` works without it, `python -m joeynmt` does not.
  plain_venv joeynmt joeynmt==2.3.0 importlib_metadata joeynmt python -m joeynmt
}

sockeye() {
  # A plain `pip install sockeye` (3.1.34) pins torch<1.14.0,>=1.10.0 and silently replaces
  # torch 2.13.0+cpu with the CUDA build of torch 1.13.1 (+ nvidia-*-cu11 wheels).
  # Instead: --no-deps, then its other requirements (numpy<2, pyyaml, sacrebleu>=2.3.0).
  local V="$PEERS_DIR/sockeye/venv/bin"
  fresh_venv sockeye || { report sockeye "venv/torch FAILED"; return 0; }
  "$V/pip" install --no-deps sockeye==3.1.34 || { report sockeye "install FAILED"; return 0; }
  "$V/pip" install "numpy<2" pyyaml "sacrebleu>=2.3.0" portalocker regex tabulate \
      || { report sockeye "deps install FAILED"; return 0; }
  "$V/python" -c "import sockeye, torch; print(sockeye.__version__, torch.__version__)" || { report sockeye "import FAILED"; return 0; }
  "$V/sockeye-train" --help >/dev/null || { report sockeye "CLI FAILED"; return 0; }
  report sockeye OK
}

main() {
  mkdir -p "$PEERS_DIR"
  local targets=("$@")
  [ ${#targets[@]} -eq 0 ] && targets=(eole opennmt_py fairseq fairseq_fixed joeynmt sockeye)
  local t
  for t in "${targets[@]}"; do
    "$t"
  done
}

main "$@"
