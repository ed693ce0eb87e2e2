# `make chapters` opens the handbook in Jupyter; `make test` runs the whole suite.
.PHONY: setup chapters test

setup:
	bash scripts/setup.sh

# Serves chapters/ on 127.0.0.1 and prints its URL with the token. As root (containers) it adds
# --allow-root; without a display (a server over ssh) it opens no browser: open the printed URL.
chapters: setup
	.venv/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=chapters \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  $$([ "$$(uname -s)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && echo --no-browser)

test: setup
	.venv/bin/python -m pytest -q tests
