# `make chapters` opens the handbook in Jupyter; `make test` runs the whole suite; `make book`
# builds the handbook as a website in _build/book/.
.PHONY: setup chapters test book book-deps

# Creates .venv and installs the Python packages (no system package); see README's "Setup".
setup:
	bash scripts/setup.sh

# A system package, announced before it is installed: Debian's chromium and chromium-driver
# (about 400 MB, apt-get, only as root and only when missing), for the book's browser test
# (tests/test_book.py). `make test` runs this step so that CI keeps that test;
# MINIVLLM_NO_SYSTEM_PACKAGES=1 skips it, and the test then skips too.
book-deps:
	bash scripts/install_chromium.sh

# Serves chapters/ on 127.0.0.1 and prints its URL with the token. As root (containers) it adds
# --allow-root; without a display (a server over ssh) it opens no browser: open the printed URL.
chapters: setup
	.venv/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=chapters \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  $$([ "$$(uname -s)" = Linux ] && [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && echo --no-browser)

# In 2 pytest-xdist workers, each test file whole in one (tests/conftest.py says which first).
test: setup book-deps
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# Chapters with their outputs (reused from the test suite's runs where fresh), the figures and the
# exercises, built by Sphinx into _build/book/; it prints how to open it.
book: setup
	.venv/bin/python book/build.py
