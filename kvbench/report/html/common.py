"""Sections every run kind shares: the diagnosis, the plots, the memory waterfall and the provenance."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from kvbench import units
from kvbench.report.columns import Col, Row, TableSpec
from kvbench.report.diagnose.findings import Diagnosis, grouped
from kvbench.report.figure_capture import CapturedFigure, capture
from kvbench.report.html.page import (
    Cell,
    Column,
    Fact,
    Facts,
    Figure,
    Figures,
    FindingItem,
    Findings,
    Section,
    Table,
    Text,
)
from kvbench.results.environment import GpuFacts, HostFacts
from kvbench.results.matmul_plan_record import MatmulPlanRecord
from kvbench.results.model_shape_facts import ModelShapeFacts
from kvbench.results.provenance import Provenance
from kvbench.results.run_meta import RunMeta

SEVERITY_WORDS = {"critical": "critical", "warning": "warning", "info": "note"}


# -- plots ------------------------------------------------------------------------------------------------


def draw(plotter: Callable[[], Any]) -> list[CapturedFigure]:
    """The figures ``plotter`` draws with the run's own plot functions, kept in memory (no file is written)."""
    with capture() as figures:
        plotter()
    return figures


def figures_block(figures: Iterable[CapturedFigure], captions: Mapping[str, str] | None = None) -> Figures:
    captions = captions or {}
    return Figures([Figure(f, captions.get(f.name, "")) for f in figures])


# -- diagnosis --------------------------------------------------------------------------------------------


def findings_section(diagnosis: Diagnosis, what: str = "point(s)") -> Section:
    """``kvbench diagnose``'s findings on this run, grouped by rule and worst first: the evidence of each point it
    fired on, and its suggestion once."""
    items = [FindingItem(g.severity, g.rule, list(g.cases), g.suggestion) for g in grouped(diagnosis.findings)]
    counts = {
        severity: sum(f.severity == severity for f in diagnosis.findings)
        for severity in ("critical", "warning", "info")
    }
    if not items:
        summary = f"No finding in {diagnosis.checked} {what}: every rule passed."
    else:
        found = ", ".join(f"{n} {SEVERITY_WORDS[s]}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
        summary = f"{found} in {diagnosis.checked} {what}."
    t = diagnosis.thresholds
    notes = [
        *diagnosis.notes,
        f"Thresholds: fragmentation > {t.fragmentation:g}, free blocks < {units.share(t.free_blocks, 0)} of "
        f"the pool, block allocation p99 > {t.alloc_latency_p99_ms:g} ms, more than "
        f"{t.preemptions_per_request:g} preemptions per completed request, reservation + internal > "
        f"{units.share(t.reservation_waste, 0)} of the pool (the defaults of kvbench diagnose).",
    ]
    block = Findings(
        summary,
        items,
        not_evaluated=[f"{n.rule} ({n.source}): {n.reason}" for n in diagnosis.not_evaluated],
        notes=notes,
        measurements=[
            ("estimate, " if m.estimate and not m.text.startswith("estimate") else "") + f"{m.source}: {m.text}"
            for m in diagnosis.measurements
        ],
    )
    return Section("findings", "Findings", [block])


# -- memory waterfall -------------------------------------------------------------------------------------


def waterfall_section(points: list[dict[str, Any]], figures: Mapping[str, CapturedFigure]) -> Section | None:
    """Every measured point's memory waterfall: the levels from the process (or device) down to token states,
    each gap named, as a table beside its plot."""
    from kvbench.report.waterfall import TITLE_BASIS, levels_of, point_label, waterfall_plot_name

    subsections = []
    for point in points:
        if not point.get("waterfall"):
            continue
        rows = []
        for level in levels_of(point):
            measured = level.bytes is not None
            gap = level.gap_name or "—"
            if level.gap_note:
                gap += f" ({level.gap_note})"
            rows.append(
                [
                    Cell(level.level),
                    Cell(
                        units.human_bytes(level.bytes) if measured else "not measured",
                        level.bytes,
                        "" if measured else "muted",
                    ),
                    Cell(gap if measured else (level.reason or gap)),
                    Cell(units.human_bytes(level.gap_bytes, missing=units.MISSING), level.gap_bytes),
                ]
            )
        table = Table(
            f"Memory waterfall, {point_label(point)} ({TITLE_BASIS}, outermost level first)",
            [
                Column("level", False),
                Column("peak size"),
                Column("gap to the next level", False),
                Column("gap size"),
            ],
            rows,
            sortable=False,
        )
        blocks: list[Any] = [table]
        figure = figures.get(waterfall_plot_name(point))
        if figure is not None:
            blocks.append(Figure(figure))
        label = point_label(point)
        subsections.append(Section(f"waterfall-{_slug(label)}", label, blocks, layout="pair"))
    if not subsections:
        return None
    intro = Text(
        [
            "Each level is the peak during the point's run; the gap below a level is what it holds beyond the "
            "next one (hatched in the plots). Levels that could not be measured say why."
        ]
    )
    return Section("waterfall", "Memory waterfall", [intro], subsections)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


# -- provenance -------------------------------------------------------------------------------------------

# Meta fields drawn elsewhere in provenance (or not meant for readers); the rest are listed as settings.
_SHOWN = {
    "command",
    "created_utc",
    "kvbench_version",
    "git_revision",
    "python_version",
    "torch_version",
    "transformers_version",
    "triton_version",
    "platform",
    "host",
    "packages",
    "model",
    "model_name",
    "model_shape",
    "device",
    "gpu",
    "threads",
    "simulated",
    "scenario_source",
    "bytes_per_token",
    "cpu_matmuls",  # a table of its own below the facts
}


def shape_text(shape: ModelShapeFacts) -> str:
    """ "40 layers, hidden 5,120, 40 heads (40 KV heads) x 128, fp16: 800.00 KiB of KV per token"."""
    parts = []
    if shape.architecture:
        parts.append(shape.architecture)
    if shape.num_layers:
        parts.append(f"{shape.num_layers} layers")
    if shape.hidden_size:
        parts.append(f"hidden {shape.hidden_size:,}")
    if shape.num_heads:
        kv_heads = shape.num_heads if shape.num_kv_heads is None else shape.num_kv_heads
        heads = f"{shape.num_heads} heads ({kv_heads} KV heads)"
        if shape.head_dim:
            heads += f" × {shape.head_dim}"
        parts.append(heads)
    if shape.num_parameters:
        parts.append(f"{shape.num_parameters / 1e9:,.2f} B parameters")
    text = ", ".join(parts)
    if shape.dtype:
        text += f", {shape.dtype}"
    if shape.bytes_per_token:
        text += f": {units.human_bytes(shape.bytes_per_token)} of KV per token"
    return text


def _host_text(host: HostFacts) -> str:
    parts = [host.cpu] if host.cpu else []
    if host.cores:
        parts.append(f"{host.cores} usable cores")
    if host.memory_bytes:
        parts.append(f"{units.human_bytes(host.memory_bytes)} memory")
    if host.machine:
        parts.append(host.machine)
    return ", ".join(parts)


def _gpu_text(gpu: GpuFacts) -> str:
    text = f"{gpu.name}"
    if gpu.count > 1:
        text += f" (×{gpu.count})"
    if gpu.memory_bytes:
        text += f", {units.human_bytes(gpu.memory_bytes)}"
    text += f"; NVIDIA driver {gpu.driver or 'unknown'}"
    if gpu.cuda:
        text += f", CUDA {gpu.cuda} (torch build)"
    return text


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_value_text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_value_text(v)}" for k, v in value.items() if v is not None)
    return str(value)


def provenance_facts(meta: Mapping[str, Any]) -> list[Fact]:
    """How the run was made: command line, date, kvbench version and commit, model and shape, device, host,
    threads, packages; then every other setting the run recorded."""
    made = Provenance.from_meta(meta)
    facts: list[Fact] = []
    if made.command:
        facts.append(Fact("command line", made.command, code=True))
    if made.created_utc:
        facts.append(Fact("date (UTC)", made.created_utc))
    facts.append(Fact("kvbench version", made.kvbench_version or "unknown"))
    facts.append(Fact("git commit", made.git_revision or "not recorded (not a git checkout)", code=True))
    if made.model_name:
        facts.append(Fact("model", str(made.model_name)))
    if made.shape:
        facts.append(Fact("model shape", shape_text(made.shape)))
    elif made.bytes_per_token:
        facts.append(Fact("model shape", f"{units.human_bytes(made.bytes_per_token)} of KV per token"))
    if made.device:
        simulated = made.simulated and "simulated" not in str(made.device)
        facts.append(Fact("device", f"{made.device}{' (simulated)' if simulated else ''}"))
    if made.host and made.host.gpu:
        facts.append(Fact("GPU and driver", _gpu_text(made.host.gpu)))
    elif made.host:
        facts.append(Fact("GPU and driver", "none used by this run"))
    if made.host:
        facts.append(Fact("host", _host_text(made.host)))
    if made.threads:
        facts.append(Fact("CPU threads", f"{made.threads} ({made.threads_reason})"))
    if made.platform:
        facts.append(Fact("platform", made.platform))
    listed = ", ".join(f"{name} {version}" for name, version in made.versions.items())
    if listed:
        facts.append(Fact("packages", listed))
    for key, value in meta.items():
        if key in _SHOWN or value is None or value == "" or value == [] or value == {}:
            continue
        facts.append(Fact(key.replace("_", " "), _value_text(value)))
    return facts


def provenance_section(meta: Mapping[str, Any], run_files: Iterable[Path], extra: Iterable[Fact] = ()) -> Section:
    from kvbench import __version__

    facts = provenance_facts(meta)
    facts.extend(extra)
    listed = []
    for path in run_files:
        with suppress(OSError):
            listed.append(f"{path.name} ({units.human_bytes(path.stat().st_size)})")
    if listed:
        facts.append(Fact("built from", ", ".join(listed)))
    facts.append(Fact("report", f"written by kvbench {__version__}; rebuild it with: kvbench report RUN_DIR"))
    blocks: list[Any] = [Facts(facts)]
    if (plan := RunMeta.from_json(meta).cpu_matmuls) is not None:
        blocks.append(cpu_matmul_table(plan))
    return Section("provenance", "Provenance", blocks)


def cpu_matmul_table(plan: MatmulPlanRecord) -> Table:
    """The CPU's measured matmul paths, one row per weight (they read as a 20-line paragraph among the facts)."""
    rows = []
    for role, choice in plan.weights.items():
        shape = "x".join(str(n) for n in choice.shape)
        spans: list[str] = []
        for rows_at, path in zip(choice.rows, choice.paths, strict=False):
            if spans and spans[-1].startswith(f"{path} "):
                spans[-1] = f"{path} {spans[-1].split(' ', 1)[1].split('-')[0]}-{rows_at}"
            else:
                spans.append(f"{path} {rows_at}")
        timed = "; ".join(
            f"{rows_at}: " + ", ".join(f"{name} {us:,.0f}" for name, us in by_path.items())
            for rows_at, by_path in choice.timings_us.items()
        )
        rows.append([Cell(role), Cell(shape), Cell(", ".join(spans)), Cell(timed)])
    caption = (
        f"CPU matmul paths, {plan.threads} thread(s), {plan.dtype} ({plan.source}): the path "
        "each weight takes by row count, and the timings that chose it"
    )
    columns = [Column("weight", False), Column("shape", False), Column("path by rows", False)]
    return Table(caption, [*columns, Column("µs per call by rows", False)], rows, sortable=False, id="cpu-matmuls")


def _tone(column: Col[Row], row: Row, hidden: bool) -> str:
    return column.tone(row) if column.tone is not None and not hidden else ""


def spec_table(spec: TableSpec[Row], points: Sequence[Row], id: str, note: str = "") -> Table:
    """A table described once (:mod:`kvbench.report.columns`) as report.html draws it: every column, sortable by
    each field's value, a failed point's mark in red and its hidden figures ordered last."""
    shown = spec.on_page()
    columns = [Column(c.heading, c.numeric) for c in shown]
    rows = []
    for point in points:
        cells = spec.marked_row(point, shown)
        failed = spec.failed(point)
        rows.append(
            [
                Cell(
                    text,
                    None if hidden else column.sort_value(point),
                    "bad" if failed or (hidden and text not in ("", "-")) else _tone(column, point, hidden),
                    column.field,
                )
                for column, (text, hidden) in zip(shown, cells, strict=True)
            ]
        )
    return Table(spec.title, columns, rows, note=note, id=id)
