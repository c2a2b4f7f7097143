"""repair: zero-pad the irregular dims of an already-compressed model so that its outputs stay bit-exact."""

from gac.repair.padding import next_multiple, pad_cols, pad_lowrank, pad_mlp, pad_producer_consumer, pad_rows
from gac.repair.repair import RepairOutput, RepairResult, repair, repair_dir  # rebinds `repair` to the function

__all__ = ["RepairOutput", "RepairResult", "next_multiple", "pad_cols", "pad_lowrank", "pad_mlp",
           "pad_producer_consumer", "pad_rows", "repair", "repair_dir"]
