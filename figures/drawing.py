"""What the figure scripts share: a labelled rounded box. Imported, it changes no backend."""

from matplotlib.patches import FancyBboxPatch


def box(ax, x, y, w, h, text, color, size=9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black", lw=1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def save_diagram(fig, ax, xlim, ylim, path, title=None):
    """A diagram's last steps: its extent, no axes, an optional title, saved at 110 dpi."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
