"""Serving gac outputs in engines: the layout an engine builds (layout.py, pure) and vLLM's plugin and model."""
