"""What a model does on calibration text: the texts and their windows (texts.py), each linear's input statistics
collected by forward hooks (stats.py, the inputs' Gram matrix in gram.py) and the importance proxies' gradient passes
(importance.py)."""
