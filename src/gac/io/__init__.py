"""Files at the edge, below every layer: signal-safe atomic writes (atomic.py) and the checks before any work:
bounded reads, output probes, option values (validate.py). Nothing here knows a model."""
