"""Entry points: the offline `LLM` class now, the HTTP server in the capstone chapter."""
