"""Math rendered at build time: each formula becomes MathML (latex2mathml), which browsers draw
natively. Sphinx's default, MathJax, is a script fetched from a CDN by the reader's browser; an
offline book cannot count on that."""

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.application import Sphinx


def _inline(self, node: nodes.math) -> None:
    self.body.append(convert(node.astext()))
    raise nodes.SkipNode


def _block(self, node: nodes.math_block) -> None:
    self.body.append(f'<div class="math">{convert(node.astext(), display="block")}</div>')
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict:
    app.add_html_math_renderer("mathml", inline_renderers=(_inline, None),
                               block_renderers=(_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
