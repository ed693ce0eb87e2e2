"""The model: GGUF / Hugging Face loading, the Llama architecture in torch, and sampling."""
