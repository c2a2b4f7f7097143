"""The layer-by-layer pipeline: a safetensors model directory read one decoder layer at a time (gac.checkpoint.lazy),
analyzed in forward and reverse sweeps (analyze.py: one layer through the model's own code, layers.py), every variant
cut from the analysis' factor cache as the layers go by (materialize.py), perplexity and latency measured on the way,
and the saved variant's weights streamed to shards; the model is never whole in memory. The pipeline itself
(gac.pipelines.base.Pipeline): pipeline.py."""
