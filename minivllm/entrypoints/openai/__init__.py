"""The OpenAI-compatible API server (`minivllm serve`): protocol, serving, app, metrics."""
