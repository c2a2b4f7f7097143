"""Quantized deployment: a gac output (or the original beside it) written as a compressed-tensors checkpoint for
vLLM's quantized kernels, every linear first checked against the kernel's shape rules (gac.quantize.kernels)."""
