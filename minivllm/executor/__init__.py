"""Executors: how the engine core reaches its workers (in process now, over shm later)."""
