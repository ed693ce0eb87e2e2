#!/usr/bin/env bash
# `make book-deps` (and so `make test`): Debian's chromium and chromium-driver, system packages of
# about 400 MB, which tests/test_book.py uses to open the book's website in a headless browser.
# Installed with apt-get only when missing, only as root, and announced first; elsewhere this
# prints the command and the test skips. MINIVLLM_NO_SYSTEM_PACKAGES=1 skips the install.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
why="tests/test_book.py opens the book in Debian's headless chromium (system packages chromium and chromium-driver, about 400 MB)"
if [ -n "${MINIVLLM_NO_SYSTEM_PACKAGES:-}" ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: $why; they are not installed, so that test will skip." >&2
  echo "      to install them: sudo apt-get install chromium chromium-driver" >&2
  exit 0
fi
echo "installing system packages with apt-get: chromium chromium-driver." >&2
echo "  why: $why." >&2
echo "  to skip: MINIVLLM_NO_SYSTEM_PACKAGES=1 (the test then skips)." >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
  >/dev/null 2>&1 || echo "note: chromium did not install; tests/test_book.py will skip" >&2
