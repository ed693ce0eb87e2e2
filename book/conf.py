"""Sphinx settings of the handbook's website (`make book`, book/build.py). The source folder is
_build/book_src/, which book/build.py lays out from the repository: nothing here downloads, and
every asset (theme, search, math) is served from the site itself."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # book/mathml.py

project = "How LLM serving engines move data between processes"
author = "the minivllm handbook"
extensions = ["myst_nb", "mathml"]
root_doc = "index"
exclude_patterns = ["**/.ipynb_checkpoints"]

# Chapters arrive executed (book/executed.py): the book shows those outputs and runs nothing.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = "LLM serving: moving data between processes"
html_theme_options = {
    "use_download_button": True,  # the executed .ipynb of a chapter
    "use_fullscreen_button": False,
    "show_toc_level": 2,
}
html_math_renderer = "mathml"  # formulas become MathML at build time: no MathJax from a CDN
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
