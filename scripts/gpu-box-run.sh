#!/usr/bin/env bash
# The GPU-side proof in one command, on the GPU test machine (../shared/gpu-box/README.md):
#   bash scripts/gpu-box-run.sh OUTDIR tests [PYTEST ARGS]  # tests marked gpu (default: tests/gpu)
#   bash scripts/gpu-box-run.sh OUTDIR bench   # every benchmark in benchmarks/
# IPython/Jupyter come from wheels in .whl/ when the machine lacks them (wheelhouse.sh).
set -uo pipefail
out=${1:?usage: gpu-box-run.sh OUTDIR tests|bench [pytest args...]}
part=${2:-tests}
shift 2 || true
mkdir -p "$out/results"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUNB_RESULTS=$out/results
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi > "$out/results/nvidia-smi-$part.txt" 2>&1
case "$part" in
  tests) python3 -m pytest -m gpu -v -rA -p no:cacheprovider "${@:-tests/gpu}" 2>&1 | tee "$out/gpu-tests.log" ;;
  bench) for b in benchmarks/*.py; do
           echo "== $b"; timeout 900 python3 "$b" --out "$out/results" 2>&1
         done | tee "$out/benchmarks.log" ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
tar czf "$out/results-$part.tgz" -C "$out" results && rm -rf "$out/results"
