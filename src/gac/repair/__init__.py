"""repair: zero-pad the irregular dims of an already-compressed model; it computes the same function (exactly in
exact arithmetic, within floating-point reassociation in practice)."""

from gac.models.padding import next_multiple, pad_cols, pad_lowrank, pad_rows
from gac.repair.repair import RepairOutput, RepairResult, repair, repair_dir  # rebinds `repair` to the function

__all__ = [
    "RepairOutput",
    "RepairResult",
    "next_multiple",
    "pad_cols",
    "pad_lowrank",
    "pad_rows",
    "repair",
    "repair_dir",
]
