"""The atlas's figure: how strongly each setup practitioners run regularises, β_eff/β, from the atlas's tables
(analysis/atlas.py; figures/atlas.csv and figures/atlas_length.csv, whose columns it reads).

Per policy family: the frameworks' presets, a row each, in one panel per β asked for (β_eff/β across); then the grid
of normalisations × G for each KL configuration (normalisation and G on the x axis, the one encoding for the rest:
colour = KL configuration, marker = placement, fill = estimator, line style = β); the length sweep against T is
atlas_length.py's figure, drawn with this module's helpers (lines that overlap, bounds, the log scale). β_eff/β is on
one log scale in every panel, 1 (dashed) where a setup regularises as strongly as asked.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker

from klstudy.frameworks import presets_of  # not analysis.atlas, which imports torch
from klstudy.kl import NO_KL
from klstudy.report.figures.captions import Caption, finish
from klstudy.report.figures.encoding import (
    FULL_WIDTH,
    beta_linestyle,
    coinciding_groups,
    config_colour,
    dodge,
    key_handles,
    kl_label,
    marker_of,
    style_of,
    tag,
)

# A normalisation as a reader names it (kl.ADVANTAGES), short enough for an axis.
NORMALISATION_NAMES = {"rloo": "RLOO", "grpo": "− group mean (Dr. GRPO)", "group_std": "÷ group std (GRPO)",
                       "batch_std": "÷ batch std (TRL batch)", "loo_std": "RLOO ÷ the others' std (NeMo-RL)",
                       "none": "no baseline", "group_whiten": "− group mean, whitened (OpenRLHF REINFORCE++-baseline)",
                       "whiten": "whitened, no baseline (OpenRLHF REINFORCE++)"}  # fmt: skip
AXIS_NAMES = {"rloo": "RLOO", "grpo": "− mean", "group_std": "÷ group std", "batch_std": "÷ batch std",
              "loo_std": "LOO ÷ std", "none": "none", "group_whiten": "− mean, whitened",
              "whiten": "whitened"}  # fmt: skip
NBSP = "\u00a0"  # "G = 8" and "β = 1" are not broken across a wrapped line


def _short_version(version: str) -> str:
    """'0.7.0' → '0.7', '1.10.0–1.16.0' → '1.10–1.16', '0.3.0 + PR 1445' → '0.3 + PR 1445'; 'main' → '' (a version
    that is not a number is left to the table)."""
    if not version[:1].isdigit():
        return ""
    short = lambda part: ".".join(part.split(".")[:2]) if re.fullmatch(r"[\d.]+", part) else part  # noqa: E731
    return "".join(short(part) for part in re.split(r"(–| \+ )", version))


def preset_name(name: str, preset: dict | None = None) -> str:
    """A preset by its framework, version and variant: 'TRL 1.10–1.16', 'verl 0.7 KL loss', 'OpenRLHF 0.11 GRPO',
    'slime default' (the key's words after the framework and its version name the variant)."""
    if not preset:
        return name
    framework = preset["framework"].lower()  # the key's first words name the framework ('nemo-rl-0.7')
    kind = name[len(framework) + 1 :] if name.lower().startswith(framework + "-") else name.split("-", 1)[-1]
    kind = re.sub(r"^[\d.]+(-|$)", "", kind)  # the key's version ('0.7-kl-loss'): the preset's own is written
    spelt = {"reinforce": "REINFORCE++", **{w: w.upper() for w in ("grpo", "rloo", "ppo", "kl", "k1", "k2", "k3")}}
    words = [spelt.get(w, w) for w in kind.split("-") if w]
    return " ".join(part for part in (preset["framework"], _short_version(str(preset.get("version", ""))), *words)
                    if part)  # fmt: skip


def setting_name(setting: dict | pd.Series, presets: dict | None = None) -> str:
    """'K3 in loss, ÷ group std (GRPO), G = 8'; RLOO's expected update does not depend on G: 'K3 in loss, RLOO'; a
    preset: its framework's name (preset_name)."""
    preset = setting.get("preset")
    if isinstance(preset, str) and preset:
        return preset_name(preset, (presets or {}).get(preset))
    words = f"{kl_label(setting['config'])}, {NORMALISATION_NAMES.get(setting['normalisation'])}"
    return words if setting["normalisation"] == "rloo" else f"{words}, G{NBSP}={NBSP}{int(setting['group'])}"


def _is_preset(rows: pd.DataFrame) -> pd.Series:
    return rows.get("preset", pd.Series(np.nan, index=rows.index)).fillna("").astype(str) != ""


def _drawable(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a β_eff/β to draw: a stable fixed point whose KL lies among the optima's."""
    return rows[(rows.status == "stable") & rows.beta_eff_ratio.notna()]


LENGTH_FIGURE = "atlas_length"  # the length sweep's figure, beside the atlas's (its PNG and caption, .md)


def figure(points: pd.DataFrame, section: dict | None = None, *, beta_min: float):
    """Per policy family two rows, a column per β asked for: the presets (a row each), then the grid (normalisation ×
    G, a line per KL configuration); β_eff/β on log axes. ``section``: config toy.atlas (its presets name the
    frameworks). ``beta_min``: the smallest β at which the effective β is searched. Returns (figure, caption)."""
    presets = presets_of(section or {})  # config names the shipped ones (frameworks.py), plus extra_presets
    # The grid's β only (the presets' own β and the field's range are the summary table's, docs/atlas.md): a β axis
    # of ten categories does not print at this size.
    betas = (section or {}).get("betas") or sorted(points.beta.unique())
    points = points[points.beta.isin(betas)]
    families = list(dict.fromkeys(points.family))
    same_as = _same_everywhere(points[~_is_preset(points)])  # configurations drawn once, named together
    fig = plt.figure(figsize=(FULL_WIDTH, 9.0), layout="constrained")
    rows_of = fig.subfigures(2 * len(families), 1, height_ratios=[1.0, 1.0] * len(families))
    caption = Caption()
    quoted, missing, notes, preset_axes, curve_axes = [], [], [], [], []
    for row, family in enumerate(families):
        mine = points[points.family == family]
        top, bottom = rows_of[2 * row], rows_of[2 * row + 1]
        beta_axes = list(top.subplots(1, len(betas), sharey=True, squeeze=False)[0])
        quoted += _presets_panels(beta_axes, mine[_is_preset(mine)], presets, family, betas, caption)
        top.suptitle(f"{family} policy: framework presets", x=0.01, ha="left", fontsize=8)
        grid_axes = list(bottom.subplots(1, len(betas), sharey=True, squeeze=False)[0])
        notes += _grid_panels(grid_axes, mine[~_is_preset(mine)], betas, same_as, family)
        bottom.suptitle(f"{family} policy: each KL configuration × advantage normalisation × G", x=0.01, ha="left",
                        fontsize=8)  # fmt: skip
        grid_axes[0].set_ylabel("β_eff / β (log)")
        missing += _not_drawn(mine, presets, beta_min, family)
        # a family's own range (the tabular's 1.4 decades would be lost in 3), room for an arrow at its lowest bound
        _share_log_axis(grid_axes, "y", room_below=4.5)
        preset_axes += beta_axes
        curve_axes += grid_axes
    _share_log_axis(preset_axes, "x", room_below=2.4)  # room for an arrow left of its bar
    configs = _drawn_configs([*preset_axes, *curve_axes])
    handles = key_handles(configs, [])  # β heads each column: no key of its line styles
    for handle in handles:  # a configuration drawn for others that end where it does names them too
        handle.set_label(_joined_labels(_drawn_for(tag_config(handle), same_as)))
    handles.append(plt.Line2D([], [], color="0.5", linestyle=(0, (3, 2)), linewidth=0.8,
                              label="β_eff/β = 1"))  # fmt: skip
    bounds_drawn = any(line.get_gid() == "bound" for ax in [*preset_axes, *curve_axes] for line in ax.get_lines())
    if bounds_drawn:
        handles.append(plt.Line2D([], [], color="0.3", linestyle="", marker=BOUND_MARKER, markersize=7,
                                  label="no β_eff: below the bar (↓, ←)"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    fig.suptitle("How strongly each setup regularises: β_eff/β (toy model, exact)")
    length_t = caption.number(int(points["T"].iloc[0]))
    merged = [_joined_labels(_drawn_for(leader, same_as)) for leader in dict.fromkeys(same_as.values())
              if len(_drawn_for(leader, same_as)) > 1]  # fmt: skip
    caption.add(
        "**How strongly each setup practitioners run regularises (toy model of §3.3, exact, float64).** β_eff is the β "
        "whose optimum of J_β has the same KL to the reference as the setup's end point; β_eff/β below 1 (under the "
        "dashed line) means weaker regularisation than asked for, above it stronger. A column per β asked for; per "
        "policy family two rows. Top: each framework's preset (its KL term, normalisation and G, as its code ships "
        f"them), a row per preset, at T = {length_t} tokens, the row's name in its KL configuration's colour; presets "
        "that end at the same points at every β share a row, named together; a row without a point at a β has no "
        "β_eff there (listed below). Below it: the grid, each KL configuration (a line) with each advantage "
        "normalisation (RLOO, whose expected update does not depend on G; the group mean, Dr. GRPO; ÷ the group's "
        "standard deviation, GRPO; ÷ the batch's, TRL's batch option) and G on x, each line in its panel's β's line "
        "style (the conventions' table; a β not in it takes its nearest's), the legend's samples keying colour only"
        + (
            f"; configurations that end at the same point in every setting of the grid are drawn once and named "
            f"together ({'; '.join(merged)})"
            if merged
            else ""
        )
        + ". The same settings against the answer's length T: the length sweep's figure, beside this one.",
        (f"Lines on one another or within a marker's height ({NEAR_RATIO - 1:.0%}) in a panel, drawn in falling "
         "widths so that each "
         "shows: " + "; ".join(notes) + ".")
        if notes
        else "",
        ("Drawn values, " + "; ".join(quoted) + ".") if quoted else "",
        caption.design("Not drawn (no β_eff): " + "; ".join(missing) + ".") if missing else "",
        ("Why a point has no β_eff: still moving, its update had not settled when the followed flow stopped (no "
         "end point to read); drifts, no fixed point (a logit leaves for the boundary); not enumerated, too many "
         "groups of G completions to compute its expected update exactly; its KL outside the optima's, outside the "
         "KL the family's optima were followed over (and no bound known). Presets with no β_eff at any β have no row "
         "(they are listed there).")
        if missing else "",
        f"↓ (←, in the presets' rows): {BOUND_TEXT}" if bounds_drawn else "",
    )
    return fig, finish(fig, caption)


def _same_everywhere(rows: pd.DataFrame) -> dict[str, str]:
    """{configuration: the first configuration whose grid rows (every family, normalisation, G and β) end at the same
    β_eff/β}: configurations drawn as one line, named together (K1 in the reward and K1 in the reward and the loss,
    both unbiased, end at the optimum everywhere)."""
    index = ["family", "normalisation", "group", "beta"]
    ratios = {config: _drawable(group).set_index(index).beta_eff_ratio.sort_index()
              for config, group in rows.groupby("config", sort=False)}  # fmt: skip
    # where there is no β_eff, why (still moving, beyond the optima and its bound, ...) must agree too
    absent = {config: sorted((*key, _why(row, 0.0)) for key, row in zip(
                  group.set_index(index).index, group.itertuples(), strict=True)
                  if key not in ratios[config].index)
              for config, group in rows.groupby("config", sort=False)}  # fmt: skip
    leaders: dict[str, str] = {}
    for config, values in ratios.items():
        leaders[config] = next(
            (leader for leader in dict.fromkeys(leaders.values()) if ratios[leader].index.equals(values.index)
             and np.allclose(ratios[leader], values, rtol=1e-6, atol=1e-9) and absent[leader] == absent[config]),
            config,
        )  # fmt: skip
    return leaders


def _drawn_for(leader: str, same_as: dict) -> list[str]:
    """The configurations a line of ``leader`` is drawn for: itself, then those that end where it does everywhere."""
    return [leader, *[c for c, lead in same_as.items() if lead == leader != c]]


def _drawn_configs(axes: list) -> list[str]:
    """The configurations these panels draw, in drawing order (the legend's entries)."""
    return list(dict.fromkeys(tag_config(line) for ax in axes for line in ax.get_lines() if tag_config(line)))


def _reference_one(ax, vertical: bool = False) -> None:
    """β_eff/β = 1, dashed, under the data: where a setup regularises as strongly as asked."""
    draw = ax.axvline if vertical else ax.axhline
    draw(1, color="0.5", linestyle=(0, (3, 2)), linewidth=0.8, gid="reference one", zorder=1)


def _joined_labels(configs: list[str]) -> str:
    """'K3 in loss, ratio-weighted = weighted K2-gradient': the words the configurations share said once."""
    labels = [kl_label(c) for c in configs]
    head = labels[0].split(", ")[0]
    rest = [lab[len(head) + 2 :] if lab.startswith(head + ", ") else lab for lab in labels[1:]]
    return " = ".join([labels[0], *rest])


def _presets_panels(axes: list, rows: pd.DataFrame, presets: dict | None, family: str, betas: list,
                    caption: Caption) -> list[str]:  # fmt: skip
    """One panel per β asked for (``axes``), a row per group of coinciding presets (named on the left, in its KL
    configuration's colour; the largest β_eff/β at the largest β at the top), its β_eff/β a marker of its KL
    configuration; returns the caption's quotes of the values drawn at the largest β."""
    coinciding = coinciding_groups(rows, "setting", ["beta", "beta_eff_ratio"], equal_nan=True)
    groups = [(names, _drawable(group)) for names, group in coinciding]
    bounded = {tuple(names): _bounds(group) for names, group in coinciding}
    groups = [g for g in groups if len(g[1]) or len(bounded[tuple(g[0])])]
    groups = sorted(groups, key=lambda g: -(g[1].sort_values("beta").beta_eff_ratio.iloc[-1] if len(g[1]) else
                                            bounded[tuple(g[0])].bound.min()))  # fmt: skip
    labels = [" = ".join(setting_name(rows[rows.setting == n].iloc[0].to_dict(), presets) for n in names)
              for names, _ in groups]  # fmt: skip
    quotes = []
    for ax, beta in zip(axes, betas, strict=True):
        _draw_arrows(ax, [(y, row.bound, row.config) for y, (names, _) in enumerate(groups)
                          for row in bounded[tuple(names)][bounded[tuple(names)].beta == beta].itertuples()],
                     vertical=True)  # fmt: skip
        for y, ((_, group), label) in enumerate(zip(groups, labels, strict=True)):
            at = group[group.beta == beta]
            if at.empty:
                continue
            config = at.iloc[0].config
            line = ax.plot(at.beta_eff_ratio, [y], linestyle="", markersize=4.5, color=config_colour(config),
                           **marker_of(config))[0]  # fmt: skip
            tag(line, config, None, "marker")
            if beta == max(betas):
                name = caption.design(label)  # the preset's name and version, the config's
                quotes.append(f"{family}, {name} at β = {beta:g}: {caption.value(line, -1, '.2f', axis='x')}")
        _reference_one(ax, vertical=True)
        ax.set_gid("dots against a reference")  # each point read against 1, not against the others (the tests' rule)
        ax.set_title(f"β{NBSP}={NBSP}{beta:g}", fontsize=8)
        ax.grid(alpha=0.3)  # across: a guide along each preset's row
        ax.set_ylim(max(len(groups), 1) - 0.5, -0.5)
    axes[0].get_figure().supxlabel("β_eff / β", fontsize=8)
    axes[0].set_yticks(range(len(groups)), labels, fontsize=7)
    for tick, (names, group) in zip(axes[0].get_yticklabels(), groups, strict=True):
        tick.set_color(config_colour((group if len(group) else bounded[tuple(names)]).iloc[0].config))
    for ax in axes[1:]:
        ax.tick_params(axis="y", left=False)
    return quotes


GAP = 0.7  # the grid's extra space between two normalisations, in G's steps


def _grid_panels(axes: list, rows: pd.DataFrame, betas: list, same_as: dict, family: str) -> list[str]:
    """The grid, a panel per β: x the normalisations, each with its G (RLOO once: its expected update does not depend
    on G), a line per KL configuration over G (colour: configuration; line style: its β); a configuration that ends
    where another does everywhere is not drawn again (``same_as``). Lines that coincide within a panel are drawn in
    falling widths; returns their notes."""
    categories = []  # (normalisation, G or None)
    for normalisation in dict.fromkeys(rows.normalisation):
        mine = rows[rows.normalisation == normalisation]
        per_g = mine.pivot_table(index="group", columns=["config", "beta"], values="beta_eff_ratio", dropna=False)
        same = len(per_g) <= 1 or np.allclose(per_g.to_numpy(), per_g.to_numpy()[:1], equal_nan=True)
        groups = [None] if same else sorted(mine.group.unique())
        categories += [(normalisation, g) for g in groups]
    # a gap of GAP between normalisations: room for their names, which are wider than their few G
    x_of = dict(zip(categories, np.arange(len(categories)) + GAP * np.cumsum(
        [i > 0 and c[0] != categories[i - 1][0] for i, c in enumerate(categories)]), strict=True))  # fmt: skip
    leaders = [c for c in dict.fromkeys(rows.config) if same_as.get(c, c) == c]
    notes = []
    for ax, beta in zip(axes, betas, strict=True):
        segments, arrows = [], []  # (config, normalisation, xs, ys); (x, bound, config)
        for config in leaders:
            group = rows[(rows.config == config) & (rows.beta == beta)]
            for normalisation in dict.fromkeys(group.normalisation):
                part = _drawable(group[group.normalisation == normalisation]).sort_values("group")
                if (normalisation, None) in x_of:
                    part = part.head(1)
                    xs = [x_of[(normalisation, None)]] * len(part)
                else:
                    xs = [x_of[(normalisation, g)] for g in part.group]
                if len(part):
                    segments.append((config, normalisation, xs, list(part.beta_eff_ratio)))
                bounded = _bounds(group[group.normalisation == normalisation]).sort_values("group")
                if (normalisation, None) in x_of:
                    bounded = bounded.head(1)
                arrows += [(x_of[(normalisation, None if (normalisation, None) in x_of else g)], b, config)
                           for g, b in zip(bounded.group, bounded.bound, strict=True)]  # fmt: skip
        notes += _draw_segments(ax, segments, beta, family)
        _draw_arrows(ax, arrows)
        ax.set_xticks(list(x_of.values()), [f"{g}" if g else "any" for _, g in categories])
        ax.set_xlim(-0.6, max(x_of.values()) + 0.6)
        for normalisation in dict.fromkeys(n for n, _ in categories):
            xs = [x_of[c] for c in categories if c[0] == normalisation]
            ax.text(np.mean(xs), 1.01, _two_lines(AXIS_NAMES.get(normalisation, normalisation)),
                    transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7,
                    linespacing=0.9)  # fmt: skip
            if xs[0] > 0:
                ax.axvline(xs[0] - (1 + GAP) / 2, color="0.75", linewidth=0.6)
        _reference_one(ax)
        ax.set_xlabel("G, completions per prompt")
        ax.set_title(f"β{NBSP}={NBSP}{beta:g}", fontsize=8, pad=22)  # above the normalisations' names
        ax.grid(alpha=0.3, axis="y")
    return notes


def _two_lines(name: str) -> str:
    """'÷ group std' → '÷ group' over 'std', '− mean' → '− group' over 'mean': a normalisation's name over its few G
    (a panel per β leaves each G about 11 pt)."""
    name = "− group mean" if name == "− mean" else name
    return "\n".join(name.rsplit(" ", 1)) if len(name) > 6 else name


# β_eff/β within 15 % of another: within the largest marker's half-height (a group's widest, 6.5 pt) on these axes
NEAR_RATIO = 1.15


def _near_points(one: dict, other: dict) -> tuple[int, int]:
    """(points at an x of both series where both have a value, of those within NEAR_RATIO of each other)."""
    ys_of = dict(zip(other["xs"], other["ys"], strict=True))
    shared = [(ys_of[x], y) for x, y in zip(one["xs"], one["ys"], strict=True) if x in ys_of]
    if not shared:
        return 0, 0
    a, b = (np.asarray(v, dtype=float) for v in zip(*shared, strict=True))
    both = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return int(both.sum()), int(np.sum(np.abs(np.log(a[both] / b[both])) < np.log(NEAR_RATIO)))


def _overlapping(series: list[dict], at_least: int | None = None) -> list[list[dict]]:
    """``series`` (dicts with xs and ys) grouped where one lies on another or within NEAR_RATIO of it, at every point
    both have (``at_least`` None), or at ``at_least`` points or more (long lines that run together over part of
    their length), with whatever lies near a member of the group: drawn in falling widths, said in the caption."""
    parent = list(range(len(series)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, one in enumerate(series):
        for j in range(i):
            common, near = _near_points(one, series[j])
            if near and (near == common if at_least is None else near >= at_least):
                parent[root(i)] = root(j)
    groups: dict[int, list[dict]] = {}
    for i, one in enumerate(series):
        groups.setdefault(root(i), []).append(one)
    return list(groups.values())


HOLLOW_FIRST = {"k3": 2, "k2": 1, "k1": 0}  # a group's drawing order, beneath to on top: hollow, half, filled


def _draw_overlapping(ax, series: list[dict], markersize: float, label: str, growth: float = 5,
                      at_least: int | None = None) -> list[list[dict]]:  # fmt: skip
    """Each series (config, beta, xs, ys) as a line of its configuration and β; those that overlap (``_overlapping``)
    drawn widest first, beneath, so that each shows an edge. Returns the groups, each series with its line."""
    groups = _overlapping(series, at_least)
    for i, group in enumerate(groups):
        # hollow markers (white-faced, K3) widest and beneath, filled ones (K1) smallest on top: a white face drawn
        # over a smaller filled marker would hide it but for its tips
        groups[i] = group = sorted(group, key=lambda one: -HOLLOW_FIRST.get(one["config"][:2], 0))
        step = 1 / max(len(group) - 1, 2)  # the widest at most 2.4 points of line, 5 of marker, more than the narrowest
        for rank, one in enumerate(group):
            wider = (len(group) - 1 - rank) * step
            # across groups too: every hollow marker beneath every filled one (a filled point near but outside a
            # group was hidden under its enlarged white-faced squares)
            layer = 2 + 10 * (2 - HOLLOW_FIRST.get(one["config"][:2], 0))
            one["line"] = ax.plot(one["xs"], one["ys"], label=label, zorder=layer + 0.1 * rank,
                                  **{**style_of(one["config"], one["beta"]), "linewidth": 1 + 2.4 * wider,
                                     "markersize": markersize + growth * wider})[0]  # fmt: skip
            tag(one["line"], one["config"], one["beta"])
    return groups


def _draw_segments(ax, segments: list, beta: float, family: str) -> list[str]:
    """Each configuration's line over one normalisation's G; lines on one another or within a marker's height of
    one another drawn widest first, beneath; returns a note per group of them."""
    series = [{"config": config, "beta": beta, "where": normalisation, "xs": xs, "ys": ys}
              for config, normalisation, xs, ys in segments]  # fmt: skip
    notes = []
    for group in _draw_overlapping(ax, series, 3.5, "_grid", growth=3, at_least=1):  # a point on another hides it
        if len(group) > 1:
            where = AXIS_NAMES.get(group[0]["where"], group[0]["where"])
            notes.append(f"{family}, β = {beta:g}, {where}: " + " and ".join(kl_label(o["config"]) for o in group))
    return notes


BOUND_MARKER = r"$\downarrow$"  # β_eff/β below this: more KL than the family's optimum at the least β followed
LEFT_MARKER = r"$\leftarrow$"  # the same, where β_eff/β runs across (the presets' rows)
ARROW_POINTS = 11  # an arrow's length from its bound's bar
BOUND_TEXT = (  # what a bound's bar and arrow say, in both figures' captions
    "an end point with more KL than the family's optimum at the least β its optima were followed to (β_c, named "
    "above: the optima stop there, where their KL stops growing), so that its β_eff is below β_c; a bar at β_c/β, "
    "which its β_eff/β lies below, and an arrow from it."
)


def _bounds(rows: pd.DataFrame) -> pd.DataFrame:
    """The stable end points without a β_eff whose KL is beyond the family's optimum curve (it stops at
    curve_beta_min): β_eff < curve_beta_min, so β_eff/β < curve_beta_min/β (``bound``)."""
    if "beyond_curve" not in rows:
        return rows.iloc[:0].assign(bound=[])
    beyond = rows[(rows.status == "stable") & rows.beta_eff_ratio.isna() & rows.beyond_curve.fillna(False).astype(bool)]
    return beyond.assign(bound=beyond.curve_beta_min / beyond.beta)


def _draw_arrows(ax, arrows: list, vertical: bool = False) -> None:
    """(position, bound, configuration) as an arrow at the bound in the configuration's colour, pointing to lower
    β_eff/β (down; left where β_eff/β runs across, ``vertical``); arrows at one place side by side, over the lines."""
    places: dict[tuple, list] = {}
    for at, bound, config in arrows:
        places.setdefault((at, round(float(bound), 12)), []).append((config, float(bound)))
    for (at, _), drawn in places.items():
        configs, bound = [config for config, _ in drawn], drawn[0][1]
        for i, config in enumerate(dict.fromkeys(configs)):
            beside = at + dodge(i, len(set(configs)), 0.6)
            xy = ([bound], [beside]) if vertical else ([beside], [bound])
            colour = config_colour(config)
            # a bar at the bound, the arrow leaving it towards lower β_eff/β: the bound is the bar, not the head
            ax.plot(*xy, linestyle="", marker="|" if vertical else "_", markersize=7, markeredgewidth=1.4,
                    color=colour, zorder=6, label="_bound", gid="bound")  # fmt: skip
            # a shaft of fixed length in points (in data units it shrank to nothing on a panel of many decades, and
            # its head read as a ▼ data point); the head at the far end
            ax.annotate("", xy=(xy[0][0], xy[1][0]), xytext=(-ARROW_POINTS, 0) if vertical else (0, -ARROW_POINTS),
                        textcoords="offset points", zorder=6,
                        arrowprops={"arrowstyle": "<|-", "color": colour, "lw": 1.0, "mutation_scale": 6,
                                    "shrinkA": 0, "shrinkB": 0})  # fmt: skip


def _share_log_axis(axes: list, axis: str, room_below: float = 1.3) -> None:
    """β_eff/β on one log scale for these panels' ``axis``, from the smallest to the largest value drawn, 1 inside
    (``room_below``: the factor of room under the smallest, for names written there). Each row of panels has its own:
    the presets' narrow range keeps presets that differ by a tenth apart."""
    values = [v for ax in axes for line in ax.get_lines()
              for v in np.asarray(line.get_ydata() if axis == "y" else line.get_xdata(), dtype=float)]  # fmt: skip
    values = [v for v in values if np.isfinite(v) and v > 0]
    low, high = min([*values, 1.0]) / room_below, max([*values, 1.0]) * 1.3
    subs = (1, 2, 5) if np.log10(high / low) < 2 else (1,)  # a tick a decade on a long range: short panels keep each
    for ax in axes:
        getattr(ax, f"set_{axis}scale")("log")
        getattr(ax, f"set_{axis}lim")(low, high)
        scale = ax.yaxis if axis == "y" else ax.xaxis
        scale.set_major_locator(ticker.LogLocator(subs=subs, numticks=20))
        scale.set_major_formatter(ticker.FormatStrFormatter("%g"))
        scale.set_minor_formatter(ticker.NullFormatter())


def _not_drawn(rows: pd.DataFrame, presets: dict | None, beta_min: float, family: str) -> list[str]:
    """The caption's list of the presets and grid settings without a β_eff, by reason and β, the G of one setting
    named together ('K3 in loss, ÷ batch std (TRL batch), G = 2, 4, 8')."""
    missing = rows[~rows.index.isin(_drawable(rows).index)].copy()
    if missing.empty:
        return []
    missing["why"] = [_why(r, beta_min) for r in missing.itertuples()]
    out = []
    for (why, beta), group in missing.groupby(["why", "beta"], sort=False):
        names: dict[str, list[int]] = {}
        for _, r in group.iterrows():
            if _is_preset(group.loc[[r.name]]).iloc[0] or r.normalisation == "rloo":
                names.setdefault(setting_name(r.to_dict(), presets), [])
            else:
                base = setting_name(r.to_dict() | {"normalisation": r.normalisation}, presets).rsplit(", G", 1)[0]
                names.setdefault(base, []).append(int(r.group))
        words = [f"{n}, G = {', '.join(map(str, sorted(set(g))))}" if g else n for n, g in names.items()]
        out.append(f"{family} policy, β = {beta:g}, {why}: {'; '.join(words)}")
    return out


def tag_config(line) -> str | None:
    """The configuration a tagged line is drawn for (None: not tagged)."""
    gid = line.get_gid() or ""
    return gid.split("kl=")[1].split(";")[0] if gid.startswith("style kl=") else None


def _why(row, beta_min: float) -> str:
    if row.status != "stable":
        return str(row.status)
    if getattr(row, "beyond_curve", False):  # the family's own curve stops where its optimum's KL stops growing
        return f"more KL than the optimum at β = {getattr(row, 'curve_beta_min', beta_min):.2g}"
    return "its KL outside the optima's"


__all__ = [
    "figure",
    "LENGTH_FIGURE",
    "preset_name",
    "setting_name",
    "NORMALISATION_NAMES",
    "NO_KL",
    "beta_linestyle",
]
