"""The report of a share run: KV blocks with and without block sharing (parallel sampling, beam search)."""

from __future__ import annotations

from kvbench import units
from kvbench.report.html.common import draw, figures_block, provenance_section, spec_table
from kvbench.report.html.page import Page, Section, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.share_report import cost_explanation, share_plot, share_spec
from kvbench.results.share_result import ShareResult, ShareSavings

WORDS = {"parallel": "parallel sampling", "beam": "beam search"}


def _words(kind: str | None) -> str:
    return WORDS.get(kind or "", str(kind))


def build(run: RunFiles) -> Page:
    result = ShareResult.from_json(run.document)
    meta = result.meta
    title = f"kvbench share: KV blocks with and without sharing — {_words(meta.kind)}, width {meta.width}"
    subtitle = (
        f"{_or_unknown(meta.model_name)} on {_or_unknown(meta.device)}; {meta.prompts} prompts of about "
        f"{meta.prompt_len} tokens, {meta.output_len} output tokens each; blocks of {meta.block_size} tokens"
    )
    figures = draw(lambda: share_plot(result, run.directory / "share.png"))
    sections = [headline_section(result)]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(provenance_section(meta.to_json(), run.files()))
    return Page("share", title, subtitle, [], sections)


def _or_unknown(value: str | None) -> str:
    return "?" if value is None else value


def _mean_cost(savings: ShareSavings, mode: str) -> float | None:
    cost = savings.cost(mode)
    return cost.mean if cost else None


def verdict(result: ShareResult) -> Verdict:
    meta, savings = result.meta, result.savings
    mean, peak = savings.saved_pct_mean, savings.saved_pct_peak
    headline = (
        f"Block sharing saved {units.pct(mean)} of KV memory (step-averaged; {units.pct(peak)} at peak) for "
        f"{_words(meta.kind)} of width {meta.width}"
    )
    sentences = []
    shared = _mean_cost(savings, "paged-shared")
    if shared is not None:
        sentences.append(
            f"Width {meta.width} cost {units.times(shared)} the blocks of width 1 with sharing, "
            f"against {units.times(_mean_cost(savings, 'paged-unshared'))} with private "
            f"copies and {units.times(_mean_cost(savings, 'contiguous'))} for contiguous "
            "copies (step-averaged)."
        )
    identical = meta.outputs_identical
    if identical is not None:
        sentences.append(
            "The samples were identical with and without sharing."
            if identical
            else "The samples differed with and without sharing: the comparison is not like for like."
        )
    if (why := cost_explanation(result)) is not None:
        sentences.append(why[len("why: ") :].capitalize() + ".")
    if meta.anchors:
        sentences.append(f"For comparison — {meta.anchors}.")
    tone = "good" if (mean or 0) > 0 and identical is not False else "warn"
    return Verdict(headline, tone, sentences)


def headline_section(result: ShareResult) -> Section:
    meta = result.meta
    spec = share_spec(result)
    table = spec_table(spec, result.points, "headline-table", spec.caption)
    blocks = [verdict(result), table]
    if meta.stop == "eos":
        blocks.append(
            Text(
                [
                    f"Samples ended at the model's EOS (mean {units.num(meta.output_len_mean, 0)} of at "
                    f"most {meta.output_len} tokens), the same samples in every mode."
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)
