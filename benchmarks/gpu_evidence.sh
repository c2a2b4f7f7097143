#!/usr/bin/env bash
# GPU evidence in two runs, each step under its own time limit, each writing into OUT as soon as it ends.
#   bash benchmarks/gpu_evidence.sh part1 OUT [--tiny]   env, the CUDA tests, kernel sweeps, SmolLM2-shaped models
#   bash benchmarks/gpu_evidence.sh part2 OUT [--tiny]   Llama-3-8B-shaped models (asvd and prune at 0.15)
#   bash benchmarks/gpu_evidence.sh all   OUT [--tiny]   both (the --tiny CPU check; on a GPU, two runs fit better)
# No install, no network: the checkout's src/ is put on PYTHONPATH. Then, here:
#   python benchmarks/gpu_evidence.py summary OUT1 OUT2 --docs docs/gpu
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?part1, part2 or all}; out=${2:?results folder}; shift 2
extra=("$@")
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GAC_CACHE_DIR=${GAC_CACHE_DIR:-/tmp/gac-cache}
py=${PYTHON:-python3}
tiny=0; for a in "${extra[@]}"; do [ "$a" = --tiny ] && tiny=1; done
limit() { if [ $tiny = 1 ]; then echo 120; else echo "$1"; fi; }   # seconds

step() {  # step NAME LIMIT_S COMMAND...: run it under `timeout`, its output to the log, its status noted
  local name=$1 secs; secs=$(limit "$2"); shift 2
  echo "== $(date -u +%T) $name (limit ${secs}s)" | tee -a "$out/log.txt"
  timeout --kill-after=10 "$secs" "$@" 2>&1 | tee -a "$out/log.txt"
  echo "== $(date -u +%T) $name: exit ${PIPESTATUS[0]}" | tee -a "$out/log.txt"
}

run_part1() {
  step env 30 "$py" benchmarks/gpu_evidence.py env --out "$out" --phase before "${extra[@]}"
  if [ $tiny = 0 ]; then
    step gpu-tests 150 "$py" -m pytest -q -p no:cacheprovider -m gpu -o addopts="" tests/hw tests/cli/test_profile_cli.py
  fi
  step sweeps 200 "$py" benchmarks/gpu_evidence.py sweeps --out "$out" "${extra[@]}"
  step smollm2 170 "$py" benchmarks/gpu_evidence.py model --preset smollm2 --out "$out" "${extra[@]}"
  step env-after 30 "$py" benchmarks/gpu_evidence.py env --out "$out" --phase after "${extra[@]}"
}

run_part2() {
  step env 30 "$py" benchmarks/gpu_evidence.py env --out "$out" --phase before "${extra[@]}"
  step llama8b 480 "$py" benchmarks/gpu_evidence.py model --preset llama8b --out "$out" "${extra[@]}"
  step env-after 30 "$py" benchmarks/gpu_evidence.py env --out "$out" --phase after "${extra[@]}"
}

case $part in
  part1) run_part1 ;;
  part2) run_part2 ;;
  all) run_part1; run_part2 ;;
  *) echo "unknown part $part: use part1, part2 or all" >&2; exit 2 ;;
esac
ls -la "$out"
