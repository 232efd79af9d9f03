"""Checks on a figure as it is saved (matplotlib's renderer extents): what a reader of the printed PNG would meet.

- no two texts overlap (titles, labels, tick labels, legend entries, annotations);
- no legend covers a data point (of a line, a scatter or a bar's top);
- no font below MIN_POINTS at the saved size.
"""

import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle
from matplotlib.text import Text

MIN_POINTS = 7


def _render(fig):
    """Lay the figure out as encoding.save does (its size; the tight box only crops); returns the renderer."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig) -> list[Text]:
    """Every visible, non-empty text in the figure, legends' included; of the tick labels, those drawn (a tick
    outside its axis' view keeps a label that is never drawn)."""
    undrawn = set()
    for ax in fig.axes:
        for axis, (low, high) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                    undrawn.update({id(tick.label1), id(tick.label2)})
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in undrawn]


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of texts whose drawn boxes overlap (a line's own wrapped lines are one box)."""
    renderer = _render(fig)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    pairs = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1 :]:
            if box_a.width and box_b.width and box_a.shrunk(0.98, 0.9).overlaps(box_b.shrunk(0.98, 0.9)):
                pairs.append((a, b))
    return pairs


def _data_points(fig) -> np.ndarray:
    """Display coordinates of every drawn data point: line vertices, scatter offsets, bar tops."""
    points = []
    for ax in fig.axes:
        for line in ax.get_lines():
            xy = np.column_stack([np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)])
            if len(xy):
                points.append(line.get_transform().transform(xy))
        for collection in ax.collections:
            if isinstance(collection, PathCollection) and len(collection.get_offsets()):
                points.append(collection.get_offset_transform().transform(np.asarray(collection.get_offsets())))
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_height():
                top = (patch.get_x() + patch.get_width() / 2, patch.get_y() + patch.get_height())
                points.append(ax.transData.transform([top]))
    points = np.concatenate(points) if points else np.zeros((0, 2))
    return points[np.isfinite(points).all(axis=1)]


def legends_over_data(fig) -> list[str]:
    """Legends whose box holds a data point."""
    renderer = _render(fig)
    points = _data_points(fig)
    covering = []
    for legend in [*fig.legends, *[ax.get_legend() for ax in fig.axes if ax.get_legend()]]:
        box = legend.get_window_extent(renderer)
        inside = (points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0) & (points[:, 1] < box.y1)
        if inside.any():
            covering.append(" / ".join(t.get_text() for t in legend.get_texts())[:80])
    return covering


def small_fonts(fig) -> list[str]:
    """Texts drawn below MIN_POINTS at the saved size."""
    return [f"{t.get_text()[:40]!r}: {t.get_fontsize():.1f} pt" for t in _texts(fig) if t.get_fontsize() < MIN_POINTS]


def problems(fig) -> list[str]:
    """Every failure of the three checks, as readable lines (empty: the figure passes)."""
    return (
        [f"texts overlap: {a[:50]!r} and {b[:50]!r}" for a, b in overlapping_texts(fig)]
        + [f"legend over data: {name}" for name in legends_over_data(fig)]
        + [f"font too small: {line}" for line in small_fonts(fig)]
    )
