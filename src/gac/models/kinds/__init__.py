"""Dimension group kinds, one file each, every one a handler of the interface in base.py (read off a model,
geometry, target widths, cut, pad, latency terms, candidates); gac.models.groups registers them and reads models."""
