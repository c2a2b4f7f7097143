"""benchmarks/ceiling.py: the copy whose shrinkable linears cost nothing, and the FLOP share it reports."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gac.compressors import make_compressor
from gac.evaluate.latency import decode_call, prefill_call
from gac.models.groups import linears_of
from tests.helpers_tiny import tiny_model

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ceiling_bench", ROOT / "benchmarks/ceiling.py")
ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ceiling)


def test_palu_ceiling_frees_the_kv_projections_only():
    model = tiny_model()
    linears = linears_of(make_compressor("palu").groups(model))
    assert linears and all(n.endswith(("k_proj", "v_proj")) for n in linears)
    free = ceiling.ceiling_copy(model, linears)
    for name, m in free.named_modules():
        assert isinstance(m, ceiling.Free) == (name in linears)
    assert all(isinstance(model.get_submodule(n), torch.nn.Linear) for n in linears)  # the original is untouched
    with torch.inference_mode():  # the copy runs both timed calls with the original's output shapes
        for make in (lambda m: prefill_call(m, 2, 8), lambda m: decode_call(m, 2, 8)):
            assert make(free)().logits.shape == make(model)().logits.shape

    c = model.config
    kv = 2 * c.hidden_size * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = 2 * c.hidden_size * c.hidden_size + kv + 3 * c.hidden_size * c.intermediate_size
    assert abs(ceiling.flop_share(model, linears) - kv / layer) < 1e-12
    assert ceiling.flop_share(model, linears_of(make_compressor("asvd").groups(model))) == 1.0


@pytest.mark.subprocess
def test_ceiling_runs_as_a_user_would(tiny_model_dir):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/ceiling.py"), "--model", str(tiny_model_dir),
                        "--compressors", "palu", "asvd", "--rounds", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| palu") or line.startswith("| asvd")]
    assert len(rows) == 4  # two compressors, prefill and decode
    assert all(float(r.split("|")[6].strip().rstrip("x")) > 0 for r in rows)
