"""Models on disk: a model spec resolved and loaded (loading.py), a gac output saved with its plan and loaded back
(gac_dir.py), weights read one layer at a time (lazy.py) or written one shard per layer (sharded.py), checked before
and after loading (verify.py), placed on devices (placement.py), and gac's model types registered with transformers
(auto_classes.py). The geometry these read and write is gac.models'."""
