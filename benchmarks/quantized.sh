#!/usr/bin/env bash
# The quantized-deployment figures on the embedded model, end to end as a user runs them: the models
# (the main job's asvd, asvd and prune made for vllm:w4a16, the same prune without the target, the healed ones),
# then what quantization costs each (quantized_quality.py), then vLLM serving each checkpoint against transformers
# (gac serve-check), then vLLM's throughput side by side (vllm_bench.py). A step whose output exists is skipped.
#
# Run: bash benchmarks/quantized.sh bench/quantized [STEP...]   (steps: models heal quality refusal serve speed)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: bash benchmarks/quantized.sh OUT_DIR [STEP...]}
shift
STEPS=${*:-models heal quality refusal serve speed}
GAC=.venv/bin/gac
PY=.venv/bin/python
mkdir -p "$B"
step() { [[ " $STEPS " == *" $1 "* ]]; }
timed() { local t=$SECONDS; "$@"; echo "[$(( SECONDS - t )) s] $*" | tee -a "$B/steps.log"; }
compress() { [ -d "$B/$1" ] || timed $GAC compress "${@:2}" --out "$B/$1" --quiet; }

if step models; then
  [ -d "$B/smollm2" ] || timed $GAC export smollm2-135m --format hf --out "$B/smollm2" --quiet
  compress asvd --compressor asvd --ratio 0.15                            # the main job: ranks % 8
  # the quality step measures the others' perplexities
  compress asvd-w4a16t --compressor asvd --ratio 0.15 --target vllm:w4a16 --no-eval
  compress prune-w4a16t --compressor prune --ratio 0.15 --target vllm:w4a16 --no-eval
  compress prune --compressor prune --ratio 0.15 --no-eval                # widths % 8, not all % 32
fi
if step heal; then
  for m in asvd-w4a16t prune-w4a16t; do
    [ -d "$B/$m-healed" ] || timed $GAC heal "$B/$m" --out "$B/$m-healed" --quiet
  done
fi
if step quality; then
  timed $PY benchmarks/quantized_quality.py "$B/smollm2" "$B/asvd" "$B/asvd-w4a16t" "$B/asvd-w4a16t-healed" \
    "$B/prune-w4a16t" "$B/prune-w4a16t-healed" "$B/prune" \
    --runs w8a8:rtn w8a8:gptq w4a16:rtn w4a16:gptq --out "$B/quality"
fi
if step refusal; then  # the unaligned prune at W4A16: one line, nothing written; --skip-unfit writes what vLLM loads
  { $GAC quantize "$B/prune" --scheme w4a16 --out "$B/prune-w4a16-refused" 2>&1 || echo "exit $?"; } \
    | tee "$B/refusal.txt"
  [ ! -e "$B/prune-w4a16-refused" ]
  [ -d "$B/prune-w4a16-skip" ] || timed $GAC quantize "$B/prune" --scheme w4a16 --skip-unfit \
    --out "$B/prune-w4a16-skip" --quiet
fi
if step serve; then  # every served checkpoint against transformers' forward of the same checkpoint, kernels named
  Q=$B/quality
  timed $GAC serve-check "$Q/asvd-w8a8-gptq" "$Q/asvd-w4a16t-w8a8-gptq" "$Q/asvd-w4a16t-w4a16-g32-gptq" \
    "$Q/prune-w4a16t-w8a8-gptq" "$Q/prune-w4a16t-w4a16-g32-gptq" "$B/prune-w4a16-skip" \
    "$Q/smollm2-w8a8-gptq" "$Q/smollm2-w4a16-g32-gptq" --out "$B/serve_check.json"
fi
if step speed; then  # the checkpoints as served: unquantized tensors in bfloat16, GPTQ's scales
  for m in smollm2 prune-w4a16t; do
    for s in w4a16 w8a8; do
      [ -d "$B/serve/$m-$s" ] || timed $GAC quantize "$B/$m" --scheme $s --dtype bfloat16 \
        --out "$B/serve/$m-$s" --quiet
    done
  done
  # two runs, each against the unquantized original and its A/A twin: an engine holds about 3 GiB here
  timed $PY benchmarks/vllm_bench.py "$B/smollm2" "$B/prune-w4a16t" "$B/serve/prune-w4a16t-w4a16" \
    "$B/serve/prune-w4a16t-w8a8" --dtype bfloat16 --prefill 1x512,8x512 --decode-batches 1,8 --out "$B/vllm-prune"
  timed $PY benchmarks/vllm_bench.py "$B/smollm2" "$B/serve/smollm2-w4a16" "$B/serve/smollm2-w8a8" \
    --dtype bfloat16 --prefill 1x512,8x512 --decode-batches 1,8 --out "$B/vllm-original"
fi
