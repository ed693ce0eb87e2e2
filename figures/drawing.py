"""What the figure scripts share: a labelled rounded box. Imported, it changes no backend."""

from matplotlib.patches import FancyBboxPatch


def box(ax, x, y, w, h, text, color, size=9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black", lw=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)
