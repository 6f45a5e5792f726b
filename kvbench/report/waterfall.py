"""The device-level memory waterfall of a sweep point, outermost level first.

CUDA: NVML device used -> NVML process used -> torch reserved -> torch allocated -> KV pool -> KV allocated
-> token states. CPU: process RSS -> KV pool -> KV allocated -> token states. Each gap between two levels has
a name. Every level is the *peak* during the run (the probes' peaks, the pool, the accountant's peak
allocation and peak token states), so the levels are comparable; peaks of different levels may fall at
different instants, which a negative gap then says. A level that could not be measured has ``bytes: null``
and a ``reason``; it never breaks the table or the plot.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.results.fields import value_at
from kvbench.results.point import oom_text
from kvbench.results.waterfall_level import WaterfallLevel
from kvbench.units import human_bytes

GAP_FREE = "free KV blocks (external fragmentation included)"
GAP_RESERVATION = "reservation + internal"

CPU_LEVELS = (
    ("process RSS", "memory.rss_peak_bytes", "rest of the process: weights, activations, Python"),
    ("KV pool", "kv_pool_bytes", GAP_FREE),
    ("KV allocated", "kv_peak_allocated_bytes", GAP_RESERVATION),
    ("token states", "kv_peak_used_bytes", None),
)
CUDA_LEVELS = (
    ("NVML device used", "memory.nvml_used_peak_bytes", "other processes on the GPU"),
    ("NVML process used", "memory.nvml_process_peak_bytes", "CUDA context and other libraries"),
    ("torch reserved", "memory.torch_reserved_peak_bytes", "caching-allocator slack"),
    ("torch allocated", "memory.torch_allocated_peak_bytes", "weights and activations"),
    *CPU_LEVELS[1:],
)
_CUDA_FIELDS = (
    "torch_reserved_peak_bytes",
    "torch_allocated_peak_bytes",
    "nvml_used_peak_bytes",
    "nvml_process_peak_bytes",
)
_REASONS = {
    "memory.rss_peak_bytes": "process RSS not readable (/proc unavailable)",
    "memory.nvml_used_peak_bytes": "NVML unavailable (no NVIDIA driver or nvidia-ml-py)",
    "memory.nvml_process_peak_bytes": "NVML per-process memory unavailable (no driver, or not reported here)",
    "memory.torch_reserved_peak_bytes": "torch.cuda unavailable (not a CUDA device)",
    "memory.torch_allocated_peak_bytes": "torch.cuda unavailable (not a CUDA device)",
    "kv_peak_used_bytes": "peak token states not recorded in this point (older kvbench)",
}
TITLE_BASIS = "peaks during the run"


def device_kind(point: Mapping[str, Any]) -> str:
    """'cuda' when the point carries any torch.cuda or NVML figure, else 'cpu'."""
    memory = point.get("memory") or {}
    return "cuda" if any(memory.get(name) is not None for name in _CUDA_FIELDS) else "cpu"


def waterfall_levels(point: Mapping[str, Any], device: str | None = None) -> list[WaterfallLevel]:
    """The point's levels, outermost first.

    ``device``: 'cpu', 'cuda' or 'simulated' (CUDA levels, device ones unmeasured); default: from the point.
    """
    kind = device or device_kind(point)
    spec = CPU_LEVELS if kind == "cpu" else CUDA_LEVELS
    levels: list[WaterfallLevel] = []
    for name, source, gap in spec:
        value = value_at(point, source)
        measured = isinstance(value, (int, float)) and not isinstance(value, bool)
        reason = None
        if not measured:
            value = None
            reason = (
                "simulated run: no device or process memory is measured"
                if kind == "simulated" and source.startswith("memory.")
                else _REASONS.get(source, f"{source} not in the point")
            )
        levels.append(WaterfallLevel(name, int(value) if measured else None, source, reason, gap))
    for outer, inner in zip(levels, levels[1:], strict=False):
        if outer.bytes is None or inner.bytes is None:
            continue
        outer.gap_bytes = outer.bytes - inner.bytes
        if outer.gap_bytes < 0:
            outer.gap_note = "inner level above outer: their peaks fell at different instants"
    slack = next((lv for lv in levels if lv.level == "torch reserved"), None)
    inactive = value_at(point, "memory.torch_inactive_split_peak_bytes")
    if slack is not None and inactive is not None:
        slack.gap_note = f"of which non-reusable (inactive_split): {human_bytes(inactive)}"
        slack.inactive_split_bytes = int(inactive)
    return levels


def levels_of(point: Mapping[str, Any]) -> list[WaterfallLevel]:
    """The levels the point recorded (``waterfall``), else computed from its figures."""
    recorded = point.get("waterfall")
    if recorded:
        return [WaterfallLevel.from_json(level) for level in recorded]
    return waterfall_levels(point)


def point_label(point: Mapping[str, Any]) -> str:
    """``engine C=c``, marked when the point ran out of KV memory (what it held then is not a full load)."""
    label = f"{point.get('engine')} C={point.get('concurrency')}"
    return label if point.get("status") != "oom" else f"{label} ({oom_text(point)})"


def waterfall_table(point: Mapping[str, Any], levels: list[WaterfallLevel] | None = None) -> Table:
    """A rich table of one point's waterfall."""
    levels = levels if levels is not None else levels_of(point)
    table = Table(title=f"Memory waterfall, {point_label(point)} ({TITLE_BASIS}, outermost first)")
    for column in ("level", "bytes", "gap to the next level", "gap bytes"):
        table.add_column(column, justify="right" if "bytes" in column else "left")
    for level in levels:
        size = human_bytes(level.bytes) if level.bytes is not None else f"unavailable: {level.reason}"
        gap = level.gap_name or "—"
        if level.gap_note:
            gap += f" ({level.gap_note})"
        table.add_row(level.level, size, gap, human_bytes(level.gap_bytes))
    return table


def waterfall_plot(
    point: Mapping[str, Any], path: Path, subtitle: str = "", levels: list[WaterfallLevel] | None = None
) -> Path:
    """Horizontal bars, outermost level on top; each bar's tail up to the next level is its named gap."""
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    plt = plots.plt
    levels = levels if levels is not None else levels_of(point)
    measured = [lv.bytes for lv in levels if lv.bytes is not None and lv.bytes > 0]
    top = max(measured, default=1)
    unit, scale = ("GiB", 1024**3) if top >= 4 * 1024**3 else ("MiB", 1024**2)
    log = bool(measured) and top / min(measured) > 50
    fig, ax = plt.subplots(figsize=(10, 0.95 * len(levels) + 1.6))
    rows = list(range(len(levels)))[::-1]  # outermost on top
    floor = min(measured) / scale / 3 if log and measured else 0.0
    for row, level, inner in zip(rows, levels, [*levels[1:], None], strict=True):
        if level.bytes is None:
            ax.text(
                floor, row, f" unavailable: {level.reason}", va="center", fontsize=8, color="#616161", style="italic"
            )
            continue
        size = level.bytes / scale
        inner_size = inner.bytes / scale if inner is not None and inner.bytes is not None else None
        solid = min(size, inner_size) if inner_size is not None else size
        ax.barh(row, solid - floor, left=floor, color="#1565c0", height=0.5)
        if inner_size is not None and size > inner_size:
            ax.barh(row, size - inner_size, left=inner_size, color="#ffb74d", hatch="//", edgecolor="white", height=0.5)
        ax.text(size, row, f" {human_bytes(level.bytes)}", va="center", fontsize=8, fontweight="bold")
        if level.gap_name and level.gap_bytes is not None:
            gap = f"gap to next: {level.gap_name} = {human_bytes(level.gap_bytes)}"
            if level.gap_note:
                gap += f"; {level.gap_note}"
            ax.text(floor, row - 0.4, f" {gap}", va="center", fontsize=7.5, color="#e65100")
    ax.set_yticks(rows)
    ax.set_yticklabels([lv.level for lv in levels])
    if log:
        ax.set_xscale("log")
    ax.set_xlim(left=floor if log else 0, right=(top / scale) * (12 if log else 1.3))
    ax.set_ylim(-0.8, len(levels) - 0.5)
    ax.set_xlabel(f"{unit} ({TITLE_BASIS}{', log scale' if log else ''}); hatched: the gap to the next level")
    title = f"Memory waterfall, {point_label(point)}: {TITLE_BASIS}, outermost first"
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return plots._save(fig, path)


def waterfall_plot_name(point: Mapping[str, Any]) -> str:
    return f"waterfall-{point['engine']}-c{point['concurrency']}.png"
