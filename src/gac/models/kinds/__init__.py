"""Dimension group kinds, one file each, every one a handler of the interface in base.py (read off a model,
geometry, target widths, cut, pad, latency terms, candidates); gac.models.groups registers them and reads models.

KINDS: the kinds' names, importable without torch (the deployment targets' table, which the CLI reads when it
starts, names them); gac.models.groups.KIND_TYPES maps each to its class, in this order (a test holds them equal)."""

KINDS = ("rank", "head_rank", "mlp", "heads", "experts")
