"""Export for serving engines: GGUF for llama.cpp (`llama` or `deci` architecture), quantized by llama.cpp."""
