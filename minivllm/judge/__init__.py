"""The judge: grades practice/ exercises in child processes with time limits and leak checks.

`judge.py` at the top of the repository is its command line.
"""
