# `make chapters` opens the handbook in Jupyter; `make test` runs the whole suite.
.PHONY: setup chapters test

setup:
	bash scripts/setup.sh

chapters: setup
	.venv/bin/jupyter lab chapters/

test: setup
	.venv/bin/python -m pytest -q tests
