"""Checks on a drawn figure and its caption, each returning what it found wrong (empty: the figure passes):

- style_problems: every artist tagged with a configuration and β looks as the one style table says;
- ink_problems: every number of the caption is read from a drawn artist (its coordinate recomputed here) or is a
  number the image itself shows in its titles, labels and legend, or one of the design the caption declares;
- identifier_problems: no snake_case, file name, configuration id or config key in the image or the caption;
- panel_problems: no panel of constant data or of one point, and a figure has a claim or a reference drawn;
- size_problems: the print size, and rendered.problems (overlaps, legends over data, fonts below 7 pt).
"""

import re

import matplotlib.colors as mcolors
import numpy as np
from matplotlib.collections import Collection, PathCollection
from matplotlib.lines import Line2D, _get_dash_pattern
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from rendered import _texts, problems

from klstudy.report.figures import encoding
from klstudy.report.figures.captions import GREEK, numbers_in

MATH_SUBSCRIPT = re.compile(r"\$_(?:\{\\mathregular\{(\w+)\}\}|\\(theta|beta|pi))\$")  # captions.as_math's


def image_texts(fig) -> list[str]:
    """Every visible text of a figure, its subscripts written back as the code writes them (π_ref)."""
    names = {v.lstrip("\\"): k for k, v in GREEK.items()}
    return [" ".join(MATH_SUBSCRIPT.sub(lambda m: "_" + (m[1] or names[m[2]]), t.get_text()).split())
            for t in fig.findobj(Text) if t.get_visible() and t.get_text()]  # fmt: skip


def _hex(colour) -> str:
    return mcolors.to_hex(colour, keep_alpha=False)


def _dashes(style) -> tuple:
    offset, pattern = _get_dash_pattern(style)
    return (float(offset), tuple(float(x) for x in pattern) if pattern else None)


def expected_style(gid: str) -> dict | None:
    """What the style table says an artist tagged ``gid`` looks like (None: not tagged)."""
    match = encoding.GID.match(gid or "")
    if not match:
        return None
    kl_config, part = match["kl"], match["part"] or "line"
    beta = float(match["beta"]) if match["beta"] else None
    beta = 0 if kl_config == encoding.NO_KL and part != "key" else beta
    expected = {"color": mcolors.to_hex(encoding.config_colour(kl_config)), "part": part}
    if part in ("line", "marker"):
        marker = encoding.marker_of(kl_config)
        expected.update(marker=marker["marker"], fillstyle=marker["fillstyle"],
                        hollow=marker.get("markerfacecolor") == "white")  # fmt: skip
    if part in ("line", "key"):
        expected["linestyle"] = encoding.beta_linestyle(beta)
    if part.startswith("bar"):
        expected["hatch"] = encoding.NO_TEMPLATE_HATCH if part == "bar_no_template" else encoding.beta_hatch(beta)
    return expected


def tagged(fig) -> list:
    """Every artist of the figure (legends' included) that carries a style gid."""
    found = []
    for artist in fig.findobj(lambda a: bool(getattr(a, "get_gid", lambda: None)())):
        if expected_style(artist.get_gid()):
            found.append(artist)
    for legend in fig.legends:
        found += [h for h in legend.legend_handles if h is not None and expected_style(h.get_gid() or "")]
    return list(dict.fromkeys(found))


def style_problems(fig) -> list[str]:
    """Each tagged artist against the style table: colour, marker shape and fill, line style, hatch."""
    found = []
    for artist in tagged(fig):
        expected = expected_style(artist.get_gid())
        name = f"{artist.get_gid()} ({type(artist).__name__})"
        part = expected["part"]
        if isinstance(artist, Line2D):
            if part != "key" and _hex(artist.get_color()) != expected["color"]:
                found.append(f"{name}: colour {_hex(artist.get_color())}, the table says {expected['color']}")
            if "marker" in expected and artist.get_marker() not in ("", "None", None):
                if artist.get_marker() != expected["marker"]:
                    found.append(f"{name}: marker {artist.get_marker()}, the table says {expected['marker']}")
                hollow = _hex(artist.get_markerfacecolor()) == "#ffffff" and artist.get_fillstyle() == "full"
                if hollow != expected["hollow"] or (not hollow and artist.get_fillstyle() != expected["fillstyle"]):
                    found.append(f"{name}: fill {artist.get_fillstyle()} (hollow {hollow}), the table says "
                                 f"{expected['fillstyle']} (hollow {expected['hollow']})")  # fmt: skip
            if "linestyle" in expected and artist.get_linestyle() not in ("None", ""):
                if _dashes(artist._unscaled_dash_pattern) != _dashes(expected["linestyle"]):
                    found.append(f"{name}: dashes {artist._unscaled_dash_pattern}, the table says "
                                 f"{expected['linestyle']}")  # fmt: skip
        elif isinstance(artist, Rectangle):
            if _hex(artist.get_facecolor()) != expected["color"]:
                found.append(f"{name}: bar colour {_hex(artist.get_facecolor())}, the table says {expected['color']}")
            if "hatch" in expected and (artist.get_hatch() or "") != expected["hatch"]:
                found.append(f"{name}: hatch {artist.get_hatch()!r}, the table says {expected['hatch']!r}")
        elif isinstance(artist, Collection):
            # a fill's colour is its face; a collection of lines (error bars) has none, its colour is its edge
            faces = artist.get_facecolor()
            colours = {_hex(c) for c in (faces if len(faces) else artist.get_edgecolor())}
            if colours and colours != {expected["color"]}:
                found.append(f"{name}: colour {colours}, the table says {expected['color']}")
    return found


def _tick_texts(fig) -> set:
    ticks = set()
    for ax in fig.axes:
        ticks.update(id(t) for t in [*ax.get_xticklabels(), *ax.get_yticklabels()])
    return ticks


def shown_numbers(fig) -> list[str]:
    """The numbers of the image's own words: titles, labels, legends, notes (tick labels left out: a scale's
    numbers would let any caption number through)."""
    ticks = _tick_texts(fig)
    words = " ".join(t.get_text() for t in fig.findobj(Text) if t.get_visible() and id(t) not in ticks)
    return numbers_in(words)


def caption_body(caption: str) -> str:
    """The caption without its Markdown image line and its abbreviations (fixed definitions, not data)."""
    paragraphs = [p for p in str(caption).split("\n\n") if not p.startswith("![") and not p.startswith("Abbreviations")]
    return "\n\n".join(paragraphs)


def _recomputed(artist, index: int, axis: str) -> float:
    """An artist's coordinate, read here from the artist itself."""
    if isinstance(artist, Line2D):
        return float(np.asarray(artist.get_ydata() if axis == "y" else artist.get_xdata(), dtype=float)[index])
    if isinstance(artist, Rectangle):
        return float(artist.get_height())
    raise TypeError(type(artist).__name__)


def _agrees(text: str, value: float) -> bool:
    """Whether a printed number is the value rounded as printed (its last digit's half unit)."""
    text = text.replace("−", "-")
    if text.endswith("%"):
        return abs(float(text[:-1]) / 100 - value) <= 0.005 + 1e-12
    number = float(text)
    decimals = len(text.split(".")[1].split("e")[0]) if "." in text else 0
    exponent = int(text.split("e")[1]) if "e" in text else 0
    return abs(number - value) <= 0.5 * 10 ** (exponent - decimals) + 1e-12 * max(1.0, abs(value))


def ink_problems(fig, caption) -> list[str]:
    """Every number of the caption accounted for: read from a drawn artist (recomputed from it, and the artist in
    this figure), shown in the image's own words, or declared a design number."""
    found = []
    read = getattr(caption, "read", [])
    for artist, index, axis, _, text in read:
        if artist.get_figure(root=True) is not fig:  # a subfigure's artist: its root
            found.append(f"{text}: read from an artist not drawn in this figure")
        elif not _agrees(text, _recomputed(artist, index, axis)):
            found.append(f"{text}: the artist draws {_recomputed(artist, index, axis)}")
    allowed = [t.replace("−", "-") for *_, t in read] + list(getattr(caption, "declared", [])) + shown_numbers(fig)
    pool = {}
    for number in allowed:
        pool[number] = pool.get(number, 0) + 1
    for number in numbers_in(caption_body(caption)):
        if pool.get(number, 0) <= 0 and not any(_same(number, a) for a in allowed):
            found.append(f"{number}: in the caption, neither drawn, shown nor declared")
    return found


def _same(a: str, b: str) -> bool:
    try:
        return float(a.rstrip("%")) == float(b.rstrip("%"))
    except ValueError:
        return False


SNAKE = re.compile(r"(?<![\w])[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9](?![\w])")
FILE = re.compile(r"\b[\w-]+\.(csv|md|png|pdf|yaml|json|jsonl|py|rst|gguf|safetensors|tsv|log)\b")
KL_ID = re.compile(r"\bk\d-(reward|loss|both)\b")
ENGLISH = {"unbiased", "bridge", "tiny", "none", "base", "optimum"}


def identifiers(config: dict) -> set[str]:
    """The config's own names a reader should never meet: studies, data sets, claims, models (but English words)."""
    names = set(config.get("studies", {})) | set(config.get("data", {})) | set(config.get("claims", {}))
    names |= set(config.get("models", {}))
    return {n for n in names if n not in ENGLISH}


def identifier_problems(fig, caption, config: dict) -> list[str]:
    ticks = set()
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible() and id(t) not in ticks]
    texts.append(caption_body(caption))
    found = []
    names = identifiers(config)
    for text in texts:
        for pattern, what in ((SNAKE, "snake_case"), (FILE, "file name"), (KL_ID, "configuration id")):
            found += [f"{what}: {m.group(0)!r} in {text[:60]!r}" for m in pattern.finditer(text)]
        found += [
            f"config name: {n!r} in {text[:60]!r}"
            for n in names
            if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)
        ]
    return found


REFERENCE_LABELS = ("no KL", "base model", "chance")


def has_reference(fig) -> bool:
    """A reference drawn: a no-KL line, the base model, chance, or a line the figure marks as one (gid reference)."""
    for artist in fig.findobj(lambda a: hasattr(a, "get_gid") and hasattr(a, "get_label")):
        gid, label = artist.get_gid() or "", str(artist.get_label())
        if (
            gid.startswith("reference")
            or gid.startswith("style kl=none")
            or label.startswith(REFERENCE_LABELS)
            or ("the claims' baseline" in label)
        ):
            return True
    return False


def panel_problems(fig, caption) -> list[str]:
    """No panel of constant data or of a single point; a figure with a claim about it or a reference drawn."""
    found = []
    for ax in fig.axes:
        if ax.get_gid() == DOTS:
            found += _dots_problems(ax)
            continue
        ys = []
        for line in ax.get_lines():
            if not str(line.get_gid() or "").startswith("reference"):
                ys += [y for y in np.asarray(line.get_ydata(), dtype=float).ravel() if np.isfinite(y)]
        ys += [p.get_height() for p in ax.patches if isinstance(p, Rectangle) and p.get_height()]
        for collection in ax.collections:
            if isinstance(collection, PathCollection):
                ys += [y for y in np.asarray(collection.get_offsets())[:, 1] if np.isfinite(y)]
        if not (ax.lines or ax.patches or ax.collections):
            continue
        if len(ys) < 2:
            found.append(f"{ax.get_title()[:50]!r}: {len(ys)} point")
        elif np.ptp(ys) == 0:
            found.append(f"{ax.get_title()[:50]!r}: constant data ({ys[0]:g})")
    if "The claims table:" not in str(caption) and "Claims on" not in str(caption) and not has_reference(fig):
        found.append("no claim about the figure and no reference drawn")
    return found


DOTS = "dots against a reference"  # a panel of rows (e.g. the atlas's presets), each point read against a line


def _dots_problems(ax) -> list[str]:
    """A panel of rows, each row's value a point across (x) read against the reference line drawn in it (β_eff/β
    against 1): at least one point, and the reference; constant rows are a finding here (presets that agree)."""
    xs = [x for line in ax.get_lines() if not str(line.get_gid() or "").startswith("reference")
          for x in np.asarray(line.get_xdata(), dtype=float).ravel() if np.isfinite(x)]  # fmt: skip
    references = [line for line in ax.get_lines() if str(line.get_gid() or "").startswith("reference")]
    if not xs:
        return [f"{ax.get_title()[:50]!r}: no point"]
    return [] if references else [f"{ax.get_title()[:50]!r}: points with no reference to read them against"]


def outside(fig) -> list[str]:
    """Texts (legends' included) that run past the figure's edge: cut off in the saved image."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    cut = []
    for text in _texts(fig):  # drawn texts (a tick outside its axis' view is not drawn)
        box = text.get_window_extent(renderer)
        if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y0 < page.y0 - 1 or box.y1 > page.y1 + 1:
            cut.append(f"text past the figure's edge: {text.get_text()[:40]!r}")
    return cut


def size_problems(fig) -> list[str]:
    width, height = fig.get_size_inches()
    found = []
    if round(width, 3) not in (encoding.SINGLE_COLUMN, encoding.FULL_WIDTH) or height > encoding.MAX_HEIGHT + 1e-9:
        found.append(f"print size {width:.2f} × {height:.2f} in")
    return found + problems(fig) + outside(fig)


def _on_row(artists, y: float) -> list:
    return [a for a in artists if np.isclose(np.mean(np.asarray(a.get_ydata(), dtype=float)), y)]


def margin_z_problems(fig) -> list[str]:
    """A forest's "z inside margin" recomputed from its drawing: the effect's smaller distance to the grey band's
    ends, each in the se its side of the interval draws (half-width ÷ the printed critical). Rows clipped (|, arrow)
    are left out: their half-width is not critical·se."""
    found = []
    for twin in fig.axes:
        place = twin.get_position().bounds  # a twin axis shares its panel's place
        ax = next((a for a in fig.axes if a is not twin and a.get_position().bounds == place), None)
        for y, label in zip(twin.get_yticks(), twin.get_yticklabels(), strict=False):  # undrawn axes: no labels yet
            match = re.search(r"z inside margin (\S+), critical (\S+)", label.get_text())
            if ax is None or not match or _on_row([a for a in ax.lines if a.get_marker() in ("|", "<", ">")], y):
                continue
            bands = [c.get_paths()[0].vertices for c in ax.collections if len(c.get_paths())]
            bands = [v for v in bands if np.isclose((v[:, 1].min() + v[:, 1].max()) / 2, y)]
            interval = _on_row([a for a in ax.lines if a.get_gid() == "interval"], y)
            effect = _on_row([a for a in ax.lines if a.get_gid() == "effect"], y)
            if len(bands) != 1 or len(interval) != 1 or len(effect) != 1:
                found.append(f"z inside margin {match[1]}: no single band, interval and effect drawn on its row")
                continue
            margin, e, (low, high) = bands[0][:, 0].max(), float(effect[0].get_xdata()[0]), interval[0].get_xdata()
            critical = float(match[2])
            z = min((margin - e) * critical / (high - e), (e + margin) * critical / (e - low))
            printed = float(match[1].replace("−", "-"))
            if not (_agrees(match[1], z) or abs(printed - z) <= 0.01 * abs(z)):  # 1 %: the table's rounding
                found.append(f"z inside margin {match[1]}: the drawing gives {z:.3g}")
    return found


def every_problem(fig, caption, config: dict) -> list[str]:
    return (style_problems(fig) + ink_problems(fig, caption) + identifier_problems(fig, caption, config)
            + panel_problems(fig, caption) + size_problems(fig) + margin_z_problems(fig))  # fmt: skip
