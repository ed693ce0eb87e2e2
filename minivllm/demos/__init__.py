"""Code that only the chapters run: the children and stand-ins of their experiments, kept out
of the engine's modules and the benchmarks (a spawned child must import its target from a
module, never from a notebook)."""
