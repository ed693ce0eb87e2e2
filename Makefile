# `make chapters` opens the handbook in Jupyter; `make test` runs the whole suite; `make book`
# builds the handbook as a website in _build/book/.
.PHONY: setup chapters test book

setup:
	bash scripts/setup.sh

# Serves chapters/ on 127.0.0.1 and prints its URL with the token. As root (containers) it adds
# --allow-root; without a display (a server over ssh) it opens no browser: open the printed URL.
chapters: setup
	.venv/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=chapters \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  $$([ "$$(uname -s)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && echo --no-browser)

# In 2 pytest-xdist workers, each test file whole in one (tests/conftest.py says which first).
test: setup
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# Chapters with their outputs (reused from the test suite's runs where fresh), the figures and the
# exercises, built by Sphinx into _build/book/; it prints how to open it.
book: setup
	.venv/bin/python book/build.py
