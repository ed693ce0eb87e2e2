"""Workers: the objects that own the model and the KV cache and run each step."""
