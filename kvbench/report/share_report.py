"""The share study's table, Markdown summary and plot."""

from __future__ import annotations

from pathlib import Path

from kvbench.fileio import json_text
from kvbench.report.columns import Col, TableSpec, print_whole
from kvbench.report.rundir import wrote_line
from kvbench.results.share_result import ShareResult, ShareRow
from kvbench.units import human_bytes, pct


def share_spec(result: ShareResult) -> TableSpec[ShareRow]:
    """KV blocks and memory per mode, and the cost of the run's width against width 1, as the console,
    summary.md and the page show them."""
    meta, savings = result.meta, result.savings
    width = meta.width

    def cost(p: ShareRow) -> float | None:
        found = savings.cost(p.mode) if p.width == width and width != 1 else None
        return found.mean if found else None

    columns: tuple[Col[ShareRow], ...] = (
        Col("mode", lambda p: p.mode, "engine", key=True, numeric=False, sort=lambda p: p.mode),
        Col("width", lambda p: str(p.width), "width", sort=lambda p: p.width),
        Col("mean blocks", lambda p: f"{p.mean_blocks:,.1f}", "mean_blocks", sort=lambda p: p.mean_blocks),
        Col("peak blocks", lambda p: f"{p.peak_blocks:,}", "peak_blocks", sort=lambda p: p.peak_blocks),
        Col("mean KV memory", lambda p: human_bytes(p.mean_bytes), "mean_bytes", sort=lambda p: p.mean_bytes),
        Col("peak KV memory", lambda p: human_bytes(p.peak_bytes), "peak_bytes", sort=lambda p: p.peak_bytes),
        Col("cost vs width 1 (mean)", lambda p: "-" if (c := cost(p)) is None else f"{c:.2f}x", "", sort=cost),
    )
    title = (
        f"KV blocks, {meta.kind} width {width} vs 1 ({meta.prompts} prompts, ~{meta.prompt_len} "
        f"prompt + {meta.output_len} output tokens, block {meta.block_size}, {meta.model_name})"
    )
    return TableSpec(title, columns, SHARE_NOTE)


SHARE_NOTE = (
    "Memory saved by sharing, as the PagedAttention paper defines it: 1 - shared / private blocks for the same samples."
)


def share_markdown(result: ShareResult) -> str:
    meta = result.meta
    return (
        f"# kvbench share ({meta.kind}, width {meta.width})\n\n"
        + share_spec(result).markdown(result.points)
        + f"\n{SHARE_NOTE}\n\n"
        + json_text(result.savings.to_json())
        + "\n"
    )


ARTICLE_WIDTH, ARTICLE_COST = 5, 1.4  # the article's parallel-sampling figure: n=5 at 1.4x one sample's memory


def cost_explanation(result: ShareResult) -> str | None:
    """Why parallel sampling's measured cost is what it is, beside the article's: sharing keeps one copy of a
    prompt, each sample writes its own answer, so prompt and answer lengths decide the cost."""
    meta, shared = result.meta, result.savings.cost("paged-shared")
    prompt, answer, width = meta.prompt_len_mean, meta.output_len_mean, meta.width
    if meta.kind != "parallel" or not prompt or not answer or not width or width == 1 or shared is None:
        return None
    cost, peak = shared.mean, shared.peak
    if peak is None:
        return None
    bound = (prompt + width * answer) / (prompt + answer)
    ratio = (ARTICLE_WIDTH - ARTICLE_COST) / (ARTICLE_COST - 1)  # prompt/answer that gives the article's figure
    return (
        f"why: sharing keeps one copy of each prompt and every sample writes its own answer, so {width} samples "
        f"cost about (prompt + {width} x answer) / (prompt + answer) = ({prompt:.0f} + {width} x {answer:.0f}) / "
        f"({prompt:.0f} + {answer:.0f}) = {bound:.2f}x one sample's tokens when the answers end here; measured "
        f"{peak:.2f}x at peak (each sample's last block partly empty) and {cost:.2f}x step-averaged (answers grow "
        "over the run while prompts are held whole); "
        f"the article's {ARTICLE_COST:g}x at n={ARTICLE_WIDTH} holds where prompts are about {ratio:.0f}x longer "
        "than answers"
    )


def print_share(console, result: ShareResult, run_dir: Path) -> None:
    meta, savings = result.meta, result.savings
    print_whole(console, share_spec(result).rich(result.points))
    console.print(
        f"memory saved by sharing (paper's definition): {pct(savings.saved_pct_mean, missing='-')} "
        f"step-averaged, {pct(savings.saved_pct_peak, missing='-')} at peak"
    )
    console.print(f"outputs identical with and without sharing: {meta.outputs_identical}")
    if meta.dataset:
        data = meta.dataset
        console.print(f"prompts: {data.requests} drawn from {Path(data.path).name} ({data.counted_by})")
    if meta.stop == "eos":
        console.print(
            f"stop eos: samples end at the model's EOS (mean {meta.output_len_mean or 0:.0f} of at most "
            f"{meta.output_len} tokens), the same samples in every mode"
        )
    if (why := cost_explanation(result)) is not None:
        console.print(why)
    console.print(f"anchors — {meta.anchors}")
    console.print(wrote_line(run_dir, "summary.json, summary.csv, summary.md, share.png"))


def share_plot(result: ShareResult, path: Path) -> None:
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    meta, points = result.meta, result.points
    labels = [f"{p.mode}\nwidth {p.width}" for p in points]
    plots.bars(
        labels,
        {"mean blocks": [p.mean_blocks for p in points], "peak blocks": [p.peak_blocks for p in points]},
        path,
        f"KV blocks with and without sharing: {meta.kind}, width {meta.width} ({meta.model_name})",
        "KV blocks in use",
        "lower",
    )
