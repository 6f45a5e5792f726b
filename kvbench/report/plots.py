"""PNG plots with titles, units and a 'higher/lower is better' hint. Matplotlib, headless (Agg)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # names from run files are text: "$x$" is not math to typeset
import matplotlib.pyplot as plt  # noqa: E402

# What matplotlib says of data from outside (an empty legend, a layout it cannot fit, ticks of a range near the
# float limit) is not the user's to read: the figure is drawn regardless, and the run's checks judge the data.
for _said in ("No artists with labels found", "Tight layout not applied", "Attempting to set identical"):
    warnings.filterwarnings("ignore", message=_said, category=UserWarning)
warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning, module=r"matplotlib\.")

from kvbench.fileio import write_atomic  # noqa: E402
from kvbench.report import figure_capture  # noqa: E402
from kvbench.results.length_histogram import LengthHistogram  # noqa: E402
from kvbench.results.point import Point  # noqa: E402
from kvbench.results.waste_shares import ShareOf, WasteShares  # noqa: E402

WASTE_PARTS: tuple[tuple[ShareOf, str, str], ...] = (  # bottom to top: the share, its name, its colour
    (lambda s: s.token_state_pct, "token states (used)", "#2e7d32"),
    (lambda s: s.reservation_pct, "reservation", "#f9a825"),
    (lambda s: s.internal_pct, "internal fragmentation", "#ef6c00"),
    (lambda s: s.external_pct, "external fragmentation", "#c62828"),
    (lambda s: s.free_pct, "free", "#b0bec5"),
)


def _open_flat_range(ax, axis: str, values: Iterable[float], log: bool = False) -> None:
    """Give an axis whose values all (nearly) coincide a range of its own: a single point in time, or equal
    TTFTs a rounding error apart, would leave matplotlib a view one float wide, and it warns dividing by it."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    if high - low > 1e-9 * max(abs(low), abs(high)):
        return  # a real range: matplotlib's own margins
    if log:
        limits = (low / 2, high * 2)
    else:
        pad = 0.05 * abs(low) or 1.0
        limits = (low - pad, high + pad)
    (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)


def _open_flat_ranges(
    ax, series: Iterable[tuple[Sequence[float], Sequence[float]]], logx: bool = False, y: bool = True
) -> None:
    series = list(series)
    _open_flat_range(ax, "x", (v for xs, _ in series for v in xs), logx)
    if y:
        _open_flat_range(ax, "y", (v for _, ys in series for v in ys))


MARK_COLOUR = "#c62828"


def mark_points(ax, marks: Sequence[tuple[float, str]], colour: str, label: str) -> None:
    """Points that have no figure to draw (an OOM point): an X on the x axis at each x, its text beside it,
    and one legend entry; never a point on the series' line."""
    if not marks:
        return
    transform = ax.get_xaxis_transform()  # x in data, y in axes coordinates: on the axis whatever the y range
    xs = [x for x, _ in marks]
    ax.update_datalim([(x, 0.0) for x in xs], updatey=False)  # the x axis reaches every mark
    ax.autoscale_view()
    ax.scatter(
        xs,
        [0.0] * len(xs),
        marker="X",
        s=90,
        color=colour,
        edgecolors=MARK_COLOUR,
        linewidths=1.2,
        transform=transform,
        clip_on=False,
        zorder=5,
        label=label,
    )
    for x, text in marks:
        ax.annotate(
            text,
            (x, 0.0),
            xycoords=transform,
            xytext=(0, 9),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            color=MARK_COLOUR,
        )


def _no_values(ax, series: Iterable[tuple[Sequence[float], Sequence[float]]]) -> None:
    """An axis with no value to show gets no made-up scale (matplotlib's default of -0.05..0.05)."""
    if not any(len(ys) for _, ys in series):
        ax.set_ylim(0, 1)
        ax.set_yticks([])


def _mark_series(marks: dict[str, Sequence[tuple[float, str]]] | None) -> list[tuple[list[float], list[float]]]:
    """The marks' x positions as series without y values, for the axis ranges."""
    return [([x for x, _ in points], []) for points in (marks or {}).values()]


def _save(fig, path: Path) -> Path:
    """Write the PNG, or hand the figure to the HTML report when it is capturing (``figure_capture``)."""
    fig.tight_layout()
    if not figure_capture.take(fig, path):
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def waste_breakdown(
    labels: Sequence[str],
    wastes: Sequence[WasteShares],
    path: Path,
    title: str,
    subtitle: str = "",
    marks: Sequence[str | None] | None = None,
) -> Path:
    """Stacked bars: how each strategy's KV pool divides, time-averaged, in % of the pool. ``marks`` (one per
    bar, None for none) hatches a bar and writes its mark under its label (an OOM point: what it held while it
    ran, not a load it carried)."""
    marks = list(marks) if marks is not None else [None] * len(labels)
    labels = [label if mark is None else f"{label}\n{mark}" for label, mark in zip(labels, marks, strict=True)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(labels) + 3), 4.8))
    bottoms = [0.0] * len(labels)
    hatches = ["//" if mark is not None else None for mark in marks]
    for share, name, colour in WASTE_PARTS:
        values = [float(share(w) or 0.0) for w in wastes]
        ax.bar(
            labels, values, bottom=bottoms, label=name, color=colour, edgecolor="white", linewidth=0.5, hatch=hatches
        )
        for i, (value, bottom) in enumerate(zip(values, bottoms, strict=True)):
            if value >= 6:
                ax.text(i, bottom + value / 2, f"{value:.0f}%", ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_ylabel("share of KV pool, time-averaged (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title + ("\n" + subtitle if subtitle else ""), fontsize=10)
    ax.set_xlabel("token states (green): higher is better; every other share is waste: lower is better", fontsize=8)
    handles, _ = ax.get_legend_handles_labels()
    if any(mark is not None for mark in marks):  # the hatching explained once, beside the shares
        from matplotlib.patches import Patch

        handles.append(
            Patch(
                facecolor="white",
                edgecolor="#616161",
                hatch="//",
                label="hatched: OOM, what it held while\nit rejected requests (no full load)",
            )
        )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    for tick, mark in zip(ax.get_xticklabels(), marks, strict=True):
        if mark is not None:
            tick.set_color(MARK_COLOUR)
    return _save(fig, path)


def lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    better: str,
    markers: bool = True,
    hline: float | None = None,
    logx: bool = False,
    steps: bool = False,
    marks: dict[str, Sequence[tuple[float, str]]] | None = None,
    errors: Mapping[str, Sequence[float]] | None = None,
    from_zero: bool = False,
) -> Path:
    """One line per series: {label: (x values, y values)}; ``better`` is 'higher' or 'lower'. ``marks``:
    {label: [(x, text)]} points of a series that have no figure (OOM), marked on the x axis, never drawn.
    ``errors``: {label: half-widths, one per point} drawn as error bars (a spread over repeated runs). An axis of
    whole numbers only (concurrency levels) ticks whole numbers. ``from_zero``: the y axis starts at 0, for values
    read against each other as ratios (throughputs), which a cut axis would exaggerate."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {}
    for index, (label, (xs, ys)) in enumerate(series.items()):
        style = "--" if "p99" in label else "-"
        colours[label] = f"C{index}"
        if not len(xs):  # nothing to draw (every point of it marked): no empty legend entry
            continue
        if steps:
            ax.step(list(xs), list(ys), style, where="post", label=label, color=colours[label])
        else:
            ax.plot(list(xs), list(ys), style, marker="o" if markers else None, label=label, color=colours[label])
        if errors and label in errors:
            ax.errorbar(list(xs), list(ys), yerr=list(errors[label]), fmt="none", ecolor=colours[label], capsize=4)
    for index, (label, points) in enumerate((marks or {}).items()):
        mark_points(ax, points, colours.get(label, f"C{len(series) + index}"), f"{label}: OOM, no figure")
    if logx:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    else:
        _whole_ticks(ax, series.values())
    _open_flat_ranges(ax, [*series.values(), *_mark_series(marks)], logx, y=hline is None)
    _no_values(ax, series.values())
    if from_zero:
        ax.set_ylim(bottom=0)
    if hline is not None:
        ax.axhline(hline, color="#c62828", linewidth=1, linestyle=":", label="pool size")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(
        f"{title}\n({better} is better)" if better in ("higher", "lower") else f"{title}\n({better})", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _whole_ticks(ax, series: Iterable[tuple[Sequence[float], Sequence[float]]]) -> None:
    """An x axis of whole numbers only (concurrency levels) ticks whole numbers: no C=1.5 between 1 and 2."""
    from matplotlib.ticker import MaxNLocator

    xs = [x for values, _ in series for x in values]
    if xs and all(float(x).is_integer() for x in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (20, 50, 200), not powers of ten ("2×10¹")."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(FuncFormatter(lambda value, _: plain(value) if _minor_labelled(axis, value) else ""))


def _minor_labelled(axis, value: float) -> bool:
    """Minor ticks get labels only where the axis spans under two decades (else they crowd), and only 2 and 5."""
    low, high = sorted(axis.get_view_interval())
    if low <= 0 or high / low > 100:
        return False
    leading = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return round(leading) in (2, 5) and abs(leading - round(leading)) < 1e-6


def bars(
    labels: Sequence[str], series: dict[str, Sequence[float]], path: Path, title: str, ylabel: str, better: str
) -> Path:
    """Grouped bars: one group per label, one bar per series."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(labels) + 2), 4.5))
    width = 0.8 / max(1, len(series))
    for offset, (name, values) in enumerate(series.items()):
        xs = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, list(values), width=width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n({better} is better)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def line_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    better: str,
    marks: dict[str, Sequence[tuple[float, str]]] | None = None,
) -> Path:
    """Side-by-side line panels sharing the x axis: {panel title: {label: (xs, ys)}}; p99 lines dashed.
    ``marks``: {group (a label's first word, the engine): [(x, text)]} points without figures (OOM), marked on
    every panel's x axis, never drawn."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    groups = sorted({label.split()[0] for series in panels.values() for label in series} | set(marks or {}))
    colours = {group: f"C{index}" for index, group in enumerate(groups)}  # one colour per engine
    for ax, (panel, series) in zip(axes[0], panels.items(), strict=True):
        for label, (xs, ys) in series.items():
            if len(xs):
                ax.plot(
                    list(xs),
                    list(ys),
                    "--" if "p99" in label else "-",
                    marker="o",
                    label=label,
                    color=colours[label.split()[0]],
                )
        for group, points in (marks or {}).items():
            mark_points(ax, points, colours[group], f"{group}: OOM, no figure")
        _open_flat_ranges(ax, [*series.values(), *_mark_series(marks)])
        _whole_ticks(ax, [*series.values(), *_mark_series(marks)])
        _no_values(ax, series.values())
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n({better} is better)", fontsize=10)
    return _save(fig, path)


def usage_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    threshold: float,
    hint: str,
) -> Path:
    """One panel per policy, one line per instance, a dotted line at ``threshold`` (the scale-up usage)."""
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows), squeeze=False, sharey=True)
    many = max((len(series) for series in panels.values()), default=0) > 10
    for ax, (panel, series) in zip(axes.flat, panels.items(), strict=False):
        for label, (xs, ys) in series.items():
            ax.plot(list(xs), list(ys), linewidth=0.8 if many else 1.2, alpha=0.7 if many else 1.0, label=label)
        _open_flat_ranges(ax, series.values(), y=False)  # y: 0-105 %
        ax.axhline(threshold, color="#c62828", linewidth=1, linestyle=":", label=f"{threshold:.0f}% (scale-up)")
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        if not many:
            ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{title}\n({hint})", fontsize=10)
    return _save(fig, path)


def stacked_panels(
    panels: Sequence[tuple[str, str, Mapping[str, tuple[Sequence[float], Sequence[float]]], tuple[float, str] | None]],
    path: Path,
    title: str,
    xlabel: str,
    y_ranges: Sequence[tuple[float, float | None] | None] | None = None,
) -> Path:
    """Panels stacked over one shared x axis, each with its own unit and hint:
    [(panel title with its 'better' hint, y label, {label: (xs, ys)}, optional (y, label) of a threshold line)].

    ``y_ranges`` (one per panel, None: matplotlib's) fixes a panel's y axis: ``(0, 100)`` for a percentage;
    ``(0, None)`` for a count, from 0 to its largest value (at least 1) with whole-number ticks, so a run of
    zeros lies on the axis's floor instead of in the middle of a made-up range."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels) + 0.8), sharex=True, squeeze=False)
    ranges = list(y_ranges) if y_ranges is not None else [None] * len(panels)
    for ax, (panel, ylabel, series, hline), y_range in zip(axes[:, 0], panels, ranges, strict=True):
        for label, (xs, ys) in series.items():
            ax.plot(
                list(xs),
                list(ys),
                "--" if "waiting" in label else "-",
                marker="." if len(xs) < 60 else None,
                label=label,
            )
        if hline is not None:
            ax.axhline(hline[0], color="#c62828", linewidth=1, linestyle=":", label=hline[1])
        if y_range is not None:
            low, high = y_range
            if high is None:  # a count
                top = max([1.0, *(float(y) for _, ys in series.values() for y in ys if y is not None)])
                high = top * 1.1
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(low, high)
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if series or hline is not None:
            ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def output_lengths_and_waste(
    points: Mapping[str, Point], path: Path, title: str, stop: str, max_len: int | None, simulated: bool = False
) -> Path:
    """Left: the output lengths that occurred (histogram); right: each engine's KV pool shares at that point
    (``points`` by engine).

    The two panels tell the article's story in the reader's own data: answers mostly end far below the
    length a contiguous engine reserves, and that gap is the internal waste on the right.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.4, 1]})
    source = points.get("paged") or next(iter(points.values()))
    hist = source.output_histogram or LengthHistogram([0, 1], [0])
    edges, counts = hist.edges, hist.counts
    widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
    left.bar(edges[:-1], counts, width=widths, align="edge", color="#1565c0", edgecolor="white")
    mean = source.output_len_mean
    if mean is not None:
        left.axvline(mean, color="#2e7d32", linestyle="--", linewidth=1.2, label=f"mean {mean:,.0f}")
    if max_len and stop == "eos":
        left.axvline(
            max_len,
            color="#c62828",
            linestyle=":",
            linewidth=1.2,
            label=f"max-len {max_len:,}: what a contiguous slab must plan for",
        )
    if stop == "eos":
        how = "EOS at each reference length (simulated)" if simulated else "decided by the model (EOS)"
    else:
        how = "drawn or reference (EOS ignored)"
    left.set_title(f"output lengths that occurred, {how}", fontsize=9)
    left.set_xlabel("output tokens per request")
    left.set_ylabel("requests")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8)
    engines = sorted(points)
    bottoms = [0.0] * len(engines)
    for share, name, colour in WASTE_PARTS:
        values = [float(share(points[e].shares) or 0.0) for e in engines]
        right.bar(engines, values, bottom=bottoms, label=name, color=colour, edgecolor="white", linewidth=0.5)
        for i, (value, bottom) in enumerate(zip(values, bottoms, strict=True)):
            if value >= 6:
                right.text(i, bottom + value / 2, f"{value:.0f}%", ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    right.set_ylim(0, 100)
    right.set_ylabel("share of KV pool, time-averaged (%)")
    right.set_title("KV pool shares: token states higher is better, waste lower is better", fontsize=9)
    right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def length_histograms(
    histograms: Mapping[str, LengthHistogram], path: Path, title: str, max_len: int | None = None
) -> Path:
    """One histogram panel per length kind (by its name); max-len marked on the total's."""
    fig, axes = plt.subplots(1, len(histograms), figsize=(5 * len(histograms), 4.2), squeeze=False)
    for ax, (name, hist) in zip(axes[0], histograms.items(), strict=True):
        edges, counts = hist.edges, hist.counts
        widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
        ax.bar(edges[:-1], counts, width=widths, align="edge", color="#1565c0", edgecolor="white")
        if name == "total" and max_len:
            ax.axvline(max_len, color="#c62828", linestyle=":", label=f"max-len {max_len:,} (a contiguous slab)")
            ax.legend(fontsize=8)
        ax.set_title(f"{name} length", fontsize=9)
        ax.set_xlabel("tokens")
        ax.set_ylabel("requests")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}\n(the gap between the bars and max-len is what a max-len reservation wastes)", fontsize=10)
    return _save(fig, path)


def reuse_curve(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    marks: Sequence[tuple[float, float, str]],
    ceiling: float,
    path: Path,
    title: str,
) -> Path:
    """Prefix hit rate (%) against KV memory (GiB, log axis): one line per series, the deployments marked as
    points with their names, the hit rate of a cache that never evicts as a dotted line."""
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    for index, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(list(xs), list(ys), "-", marker="o", markersize=3, label=label, color=f"C{index}")
    for x, y, text in marks:
        ax.plot([x], [y], "D", color="#c62828", markersize=6, zorder=3)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8, color="#c62828")
    if marks:
        ax.plot([], [], "D", color="#c62828", label="deployments (GPUs x model)")
    ax.axhline(ceiling, color="#555555", linewidth=1, linestyle=":", label=f"cache that never evicts ({ceiling:.1f}%)")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_ylim(0, max(ceiling, *(max(ys, default=0) for _, ys in series.values())) * 1.1 + 1)
    ax.set_xlabel("KV memory (GiB)")
    ax.set_ylabel("prompt tokens served from the prefix cache (%)")
    ax.set_title(f"{title}\n(higher is better)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def reuse_distance(panels: Sequence[tuple[Sequence[float], Sequence[float], str]], path: Path, title: str) -> Path:
    """Share of reused blocks (%) coming back within a distance, one log-x panel per kind of distance:
    ``(bin edges, weights, x label)``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 3.8), squeeze=False)
    for ax, (edges, weights, xlabel) in zip(axes[0], panels, strict=True):
        total = float(sum(weights)) or 1.0
        cumulative, running = [0.0], 0.0
        for weight in weights:
            running += weight
            cumulative.append(100.0 * running / total)
        ax.step(list(edges), cumulative, where="post", color="C0")
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_ylim(0, 100)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("reused blocks back within it (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}\n(further left: less memory keeps the reuse)", fontsize=9)
    return _save(fig, path)
