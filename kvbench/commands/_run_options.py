"""The options every run command shares (the requests, the model and where it runs, the KV pool), declared once.

``@RUN_OPTIONS.add()`` (:mod:`kvbench.commands._option_group`) adds them to a command's signature, after its own
options, and hands the command one parsed :class:`~kvbench.studies.run_options.RunOptions` as its ``run``
argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kvbench.commands._option_group import OptionGroup, SharedOption
from kvbench.commands._options import (
    choice,
    compute_dtype_choice,
    device_option,
    gpu_memory_utilization_option,
    gpu_option,
    parse_size,
    seed_option,
)
from kvbench.kv.policies import ADMISSION_MODES, RESERVATION_POLICIES, check_choice
from kvbench.studies.run_options import RunOptions

REQUESTS_PANEL, MODEL_PANEL, POOL_PANEL = "Requests", "Model and device", "KV pool"

SHARED_OPTIONS: tuple[SharedOption, ...] = (
    SharedOption(
        "scenario",
        str,
        "article",
        typer.Option(
            "--scenario",
            rich_help_panel=REQUESTS_PANEL,
            help="Built-in scenario name (see `kvbench scenarios`) or a TOML file.",
        ),
    ),
    SharedOption(
        "requests",
        int | None,
        None,
        typer.Option("--requests", min=1, rich_help_panel=REQUESTS_PANEL, help="Requests (default: the scenario's)."),
    ),
    SharedOption(
        "requests_file",
        Path | None,
        None,
        typer.Option(
            "--requests-file",
            rich_help_panel=REQUESTS_PANEL,
            help="JSONL of {prompt_token_ids, output_len} to replay exactly instead of the scenario's lengths.",
        ),
    ),
    SharedOption(
        "dataset",
        str | None,
        None,
        typer.Option(
            "--dataset",
            rich_help_panel=REQUESTS_PANEL,
            help="Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file (or 'real-chat', shipped; default: "
            "the scenario's dataset, if any), tokenized with the model's tokenizer.",
        ),
    ),
    SharedOption(
        "seed",
        int | None,
        None,
        seed_option(
            "Seed of lengths, prompts and weights (default: the scenario's, else 0).",
            annotated=True,
            rich_help_panel=REQUESTS_PANEL,
        ),
    ),
    SharedOption(
        "model",
        str,
        "tiny",
        typer.Option(
            "--model",
            rich_help_panel=MODEL_PANEL,
            help="Preset or local checkpoint dir (tensor engine); with --simulate the shape to simulate.",
        ),
    ),
    SharedOption(
        "device",
        str,
        "auto",
        device_option(annotated=True, rich_help_panel=MODEL_PANEL),
    ),
    SharedOption(
        "dtype",
        str | None,
        None,
        typer.Option(
            "--dtype",
            rich_help_panel=MODEL_PANEL,
            help="Compute dtype (default: fp32 on CPU, fp16 on CUDA).",
            **compute_dtype_choice(),
        ),
    ),
    SharedOption(
        "simulate",
        bool,
        False,
        typer.Option(
            "--simulate",
            rich_help_panel=MODEL_PANEL,
            help="Tensor-free simulator with a GPU preset and roofline step times.",
        ),
    ),
    SharedOption(
        "gpu",
        str,
        "a100-80g",
        gpu_option(None, "GPU preset for --simulate.", annotated=True, rich_help_panel=MODEL_PANEL),
    ),
    SharedOption(
        "kv_memory",
        str | None,
        None,
        typer.Option(
            "--kv-memory", rich_help_panel=POOL_PANEL, help="KV pool size, e.g. 64MiB (default: the scenario's budget)."
        ),
    ),
    SharedOption(
        "utilization",
        float | None,
        None,
        gpu_memory_utilization_option(
            None, "On CUDA: size the pools like vLLM from real free memory.", annotated=True, rich_help_panel=POOL_PANEL
        ),
    ),
    SharedOption(
        "block_size",
        int | None,
        None,
        typer.Option(
            "--block-size", min=1, rich_help_panel=POOL_PANEL, help="Tokens per KV block (default: the scenario's)."
        ),
    ),
    SharedOption(
        "reserve",
        str | None,
        None,
        typer.Option(
            "--reserve",
            rich_help_panel=POOL_PANEL,
            help="What a contiguous request reserves (default: the scenario's).",
            **choice(RESERVATION_POLICIES),
        ),
    ),
    SharedOption(
        "admission",
        str | None,
        None,
        typer.Option(
            "--admission",
            rich_help_panel=POOL_PANEL,
            help="Contiguous when memory is short: requests wait (queue) or are refused as OOM (reject).",
            **choice(ADMISSION_MODES),
        ),
    ),
)


def parse_run_options(values: dict[str, Any]) -> RunOptions:
    """The shared options as typed, checked and parsed (one-line errors naming the flag)."""
    values = dict(values)
    kv_memory = values.pop("kv_memory")
    reserve, admission = values.pop("reserve"), values.pop("admission")
    return RunOptions(
        **values,
        kv_memory_bytes=parse_size(kv_memory, "--kv-memory") if kv_memory else None,
        kv_memory_text=kv_memory,
        reserve=check_choice(reserve, RESERVATION_POLICIES, "--reserve") if reserve else None,
        admission=check_choice(admission, ADMISSION_MODES, "--admission") if admission else None,
    )


RUN_OPTIONS = OptionGroup(SHARED_OPTIONS, "run", lambda values, _: parse_run_options(values))
