"""The report of a share run: KV blocks with and without block sharing (parallel sampling, beam search)."""

from __future__ import annotations

from kvbench.report.html import units
from kvbench.report.html.common import draw, figures_block, provenance_section, spec_table
from kvbench.report.html.page import Page, Section, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.share_report import cost_explanation, share_plot, share_spec

WORDS = {"parallel": "parallel sampling", "beam": "beam search"}


def build(run: RunFiles) -> Page:
    document = run.document
    meta = document["meta"]
    kind = WORDS.get(meta.get("kind"), str(meta.get("kind")))
    title = f"kvbench share: KV blocks with and without sharing — {kind}, width {meta.get('width')}"
    subtitle = (
        f"{meta.get('model_name', '?')} on {meta.get('device', '?')}; {meta.get('prompts')} prompts of about "
        f"{meta.get('prompt_len')} tokens, {meta.get('output_len')} output tokens each; blocks of "
        f"{meta.get('block_size')} tokens"
    )
    figures = draw(lambda: share_plot(document, run.directory / "share.png"))
    sections = [headline_section(document)]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(provenance_section(meta, run.files()))
    return Page("share", title, subtitle, [], sections)


def verdict(document: dict) -> Verdict:
    meta, savings = document["meta"], document.get("savings") or {}
    mean, peak = savings.get("saved_by_sharing_pct_mean"), savings.get("saved_by_sharing_pct_peak")
    kind = WORDS.get(meta.get("kind"), str(meta.get("kind")))
    headline = (
        f"Block sharing saved {units.pct(mean)} of KV memory (step-averaged; {units.pct(peak)} at peak) for "
        f"{kind} of width {meta.get('width')}"
    )
    sentences = []
    shared = savings.get("paged-shared_cost_vs_width1_mean")
    if shared is not None:
        sentences.append(
            f"Width {meta.get('width')} cost {units.times(shared)} the blocks of width 1 with sharing, "
            f"against {units.times(savings.get('paged-unshared_cost_vs_width1_mean'))} with private "
            f"copies and {units.times(savings.get('contiguous_cost_vs_width1_mean'))} for contiguous "
            "copies (step-averaged)."
        )
    identical = meta.get("outputs_identical_with_and_without_sharing")
    if identical is not None:
        sentences.append(
            "The samples were identical with and without sharing."
            if identical
            else "The samples differed with and without sharing: the comparison is not like for like."
        )
    if (why := cost_explanation(document)) is not None:
        sentences.append(why[len("why: ") :].capitalize() + ".")
    if meta.get("anchors"):
        sentences.append(f"For comparison — {meta['anchors']}.")
    tone = "good" if (mean or 0) > 0 and identical is not False else "warn"
    return Verdict(headline, tone, sentences)


def headline_section(document: dict) -> Section:
    meta = document["meta"]
    spec = share_spec(document)
    table = spec_table(spec, document["points"], "headline-table", spec.caption)
    blocks = [verdict(document), table]
    if meta.get("stop") == "eos":
        blocks.append(
            Text(
                [
                    f"Samples ended at the model's EOS (mean {units.num(meta.get('output_len_mean'), 0)} of at "
                    f"most {meta.get('output_len')} tokens), the same samples in every mode."
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)
