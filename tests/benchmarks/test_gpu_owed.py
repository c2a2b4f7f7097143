"""The owed-items GPU driver's steps at toy sizes on CPU: each writes its JSON with the figures the GPU run reports
(time against bytes for decode, the three models in every mode for compile), so it does not rot between GPU loans."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_owed  # noqa: E402

pytestmark = pytest.mark.slow  # about 10 s on two cores


def test_decode_bytes_and_compile_write_their_figures(tmp_path):
    gpu_owed.main(["decode-bytes", "--tiny", "--out", str(tmp_path), "--dtype", "float32", "--batches", "1"])
    decode = json.loads((tmp_path / "decode_bytes.json").read_text())
    assert set(decode["projections"]) == {f"{n} b1" for n in gpu_owed.TINY_PROJECTIONS}
    layer = decode["layer b1"]
    for name, (out_f, in_f, unaligned, aligned) in gpu_owed.TINY_PROJECTIONS.items():
        row = decode["projections"][f"{name} b1"]
        assert row["dense"]["bytes"] == out_f * in_f * 4 and row["pair gac"]["bytes"] == aligned * (out_f + in_f) * 4
        assert row["pair unaligned"]["bytes_vs_dense"] == pytest.approx(unaligned * (out_f + in_f) / (out_f * in_f))
    assert layer["dense"]["time_vs_dense"] == 1.0 and 0 < layer["pair gac"]["bytes_vs_dense"] < 1

    gpu_owed.main(["compile", "--tiny", "--out", str(tmp_path), "--dtype", "float32", "--modes", "eager",
                   "--compressors", "asvd", "prune"])
    modes = json.loads((tmp_path / "compile.json").read_text())["modes"]
    assert set(modes) == {"asvd eager", "prune eager"}
    for row in modes.values():
        assert {"baseline", "unaligned", "gac", "baseline (A/A)"} <= set(row)
        assert row["unaligned_over_gac"] == pytest.approx(row["unaligned"]["median_ms"] / row["gac"]["median_ms"])
