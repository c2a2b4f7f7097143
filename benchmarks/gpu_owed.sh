#!/usr/bin/env bash
# The GPU items the CPU sessions owe (figures: docs/results/), in one run on the GPU machine, within BUDGET seconds:
#   1. decode at batch 1 against the bytes read (a dense weight against its low-rank pair);
#   2. the layer-wise Llama-3-8B-shaped run on CUDA at the default allocation: wall and peak GPU memory;
#   3. torch.compile (default, max-autotune-no-cudagraphs) against eager for baseline, unaligned and gac;
#   4. the CUDA-only tests;
#   5. benchmarks/pareto.py on a random SmolLM2-shaped model, prefill 1x1024 then decode 1x512 (prune, asvd);
#   6. `gac compress` then `gac heal` on the device, a random SmolLM2-shaped model: wall, peak memory, held-out loss;
#   and first, int8 and fp8 GEMM sweeps (gac profile's quantized ops): the dims each kernel refuses, and cliffs.
# Each step runs under `timeout` with what is left of the budget; results land in WORK as they finish, and OUT gets
# the log, the main JSON files and one archive of everything at the end (the device tool returns 8 files at most).
#   BUDGET=520 bash benchmarks/gpu_owed.sh OUT            (no install, no network: src/ goes on PYTHONPATH)
#   BUDGET=300 bash benchmarks/gpu_owed.sh OUT --tiny     (the CPU check: toy sizes)
#   STEPS="env write-8b layerwise-8b" BUDGET=300 bash benchmarks/gpu_owed.sh OUT   (only these steps)
#   COMPILE="--compressors prune --modes eager default" ...     (the compile step's own arguments)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?results folder}; shift
tiny=0; [ "${1:-}" = --tiny ] && tiny=1
shm=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ')  # the 8B model and its output in memory
work=${WORK:-$([ "${shm:-0}" -gt 40 ] && echo /dev/shm/gac-owed || echo /tmp/gac-owed)}
rm -rf "$work"; mkdir -p "$work" "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GAC_CACHE_DIR=${GAC_CACHE_DIR:-/tmp/gac-cache}
py=${PYTHON:-python3}
deadline=$(( $(date +%s) + ${BUDGET:-520} ))
log="$work/log.txt"

step() {  # step NAME LIMIT_S COMMAND...: run it under what is left of the budget (at most LIMIT_S)
  local name=$1 want=$2 left secs; shift 2
  case " ${STEPS:-$name} " in *" $name "*) ;; *) echo "== $name: not in STEPS" | tee -a "$log"; return ;; esac
  left=$(( deadline - $(date +%s) - 20 )); secs=$(( want < left ? want : left ))
  if [ "$secs" -lt 15 ]; then echo "== $name: skipped, ${left}s left" | tee -a "$log"; return; fi
  echo "== $(date -u +%T) $name (limit ${secs}s)" | tee -a "$log"
  timeout --kill-after=5 "$secs" "$@" 2>&1 | tee -a "$log"
  echo "== $(date -u +%T) $name: exit ${PIPESTATUS[0]}" | tee -a "$log"
  cp "$log" "$work"/*.json "$out"/ 2>/dev/null
}

config=docs/configs/llama-3-8b
if [ $tiny = 1 ]; then  # a config of width 256 beside the 8B one
  config=$work/tiny-config; "$py" -c "import sys; from transformers import AutoConfig
c = AutoConfig.from_pretrained('docs/configs/llama-3-8b'); c.update(dict(hidden_size=256, intermediate_size=896,
num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512)); c.save_pretrained(sys.argv[1])" "$config"
  model_args=(--layers 2 --dtype float32); dev=(); compress_extra=(--seq-len 32 --calib-windows 4)
  small=(--tiny --dtype float32)
else
  model_args=(--device cuda); dev=(--device cuda); compress_extra=(); small=()
fi
"$py" -c "import pydoc_data.topics" 2>/dev/null || {  # a Python without it: the same text, carried
  echo "no pydoc_data here: calibrating on .gpu/calib.txt" | tee -a "$log"; compress_extra+=(--calib-file .gpu/calib.txt); }

step env 30 "$py" benchmarks/gpu_evidence.py env --out "$work" --phase before
# int8 and fp8 GEMMs (torch._int_mm, torch._scaled_mm) around N and K = 4096 at Llama-3-8B's hidden size, prefill
# and decode M: which dims each kernel refuses (profile entries' "refused"), which fall off a cliff
qdims=4064:4129; [ $tiny = 1 ] && qdims=248:265
step quantized-gemm 150 "$py" -m gac profile --device "$([ $tiny = 1 ] && echo cpu || echo cuda)" --dtype bfloat16 \
  --ops int8_n,int8_k,fp8_n,fp8_k --dims "$qdims" --hidden "$([ $tiny = 1 ] && echo 256 || echo 4096)" --m 1024 \
  --no-plot --force --out "$work/quantized_gemm.json"
step decode-bytes 60 "$py" benchmarks/gpu_owed.py decode-bytes --out "$work" "${small[@]}"
step write-8b 120 "$py" benchmarks/big_model.py --config "$config" --dtype bfloat16 "${model_args[@]}" \
  --out "$work/llama-3-8b"
echo "work folder: $work ($(df -h --output=fstype,avail "$work" | tail -1))" | tee -a "$log"
step layerwise-8b 330 "$py" benchmarks/gpu_owed.py peak --out "$work" --name layerwise_8b.json -- compress \
  --model "$work/llama-3-8b" --compressor asvd --ratio 0.15 --dtype bfloat16 "${dev[@]}" --layerwise --no-eval \
  "${compress_extra[@]}" --out "$work/l8" --force
cp "$work/l8/report.md" "$out/layerwise_8b_report.md" 2>/dev/null; cp "$work/l8/report.md" "$work/" 2>/dev/null
rm -rf "$work/llama-3-8b" "$work/l8"/*.safetensors
left=$(( deadline - $(date +%s) - 80 ))
step compile 400 "$py" benchmarks/gpu_owed.py compile --out "$work" --budget-s $(( left > 30 ? left - 30 : 1 )) \
  "${small[@]}" ${COMPILE:-}
if [ $tiny = 0 ]; then
  step gpu-tests 90 "$py" -m pytest -q -p no:cacheprovider -m gpu -o addopts="" tests/pipelines/test_device.py tests/hw \
    tests/calibration/test_importance.py tests/cli/test_profile_cli.py
  pareto=(--model random-smollm2 --device cuda --dtype bfloat16 --timing-rounds 20 --calib-windows 8)
else
  pareto=(--model random-tiny --timing-rounds 3 --calib-windows 2)
fi
for phase_shape in prefill:1x1024 decode:1x512; do
  phase=${phase_shape%%:*}; shape=${phase_shape#*:}
  [ $tiny = 1 ] && shape=1x64
  step "pareto-$phase" 200 "$py" benchmarks/pareto.py "${pareto[@]}" --phase "$phase" --shape "$shape" \
    --compressors prune asvd --targets 1.05 1.1 1.2 --ratios 0.15 0.3 --out "$work/pareto-$phase"
  cp "$work/pareto-$phase/pareto.md" "$out/pareto-$phase.md" 2>/dev/null
done
if [ $tiny = 1 ]; then heal_shape=""; heal_extra=(--seq-len 32 --heal-tokens 2048 --eval-windows 4)
else heal_shape="hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
  num_key_value_heads=3, head_dim=64, vocab_size=49152"; heal_extra=(); fi
"$py" -c "import sys; from transformers import AutoConfig
c = AutoConfig.from_pretrained(sys.argv[1]); c.update(dict($heal_shape)); c.save_pretrained(sys.argv[2])" \
  "$config" "$work/heal-config"
step heal-model 60 "$py" benchmarks/big_model.py --config "$work/heal-config" --dtype bfloat16 "${model_args[@]}" \
  --out "$work/heal-original"
step heal-compress 120 "$py" benchmarks/gpu_owed.py peak --out "$work" --name heal_compress.json -- compress \
  --model "$work/heal-original" --compressor asvd --ratio 0.15 --dtype bfloat16 "${dev[@]}" "${compress_extra[@]}" \
  --out "$work/heal-asvd" --force
step heal 200 "$py" benchmarks/gpu_owed.py peak --out "$work" --name heal.json -- heal "$work/heal-asvd" \
  --out "$work/heal-healed" "${dev[@]}" "${heal_extra[@]}" --force
cp "$work/heal-asvd/report.md" "$work/heal-asvd-report.md" 2>/dev/null
cp "$work/heal-healed/heal.json" "$work/heal-report.json" 2>/dev/null
rm -rf "$work"/heal-*/*.safetensors
step env-after 20 "$py" benchmarks/gpu_evidence.py env --out "$work" --phase after
rm -f "$out"/*  # the device tool returns 8 files at most: the archive, the log and the main tables
tar czf "$out/results.tgz" --exclude='*.safetensors' -C "$(dirname "$work")" "$(basename "$work")"
cp "$log" "$work/heal-report.json" "$out"/ 2>/dev/null
for p in prefill decode; do cp "$work/pareto-$p/pareto.md" "$out/pareto-$p.md" 2>/dev/null; done
ls -la "$out"
