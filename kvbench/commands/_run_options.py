"""The options every run command shares (the requests, the model and where it runs, the KV pool), declared once.

``@RUN_OPTIONS.add()`` (:mod:`kvbench.commands._option_group`) adds them to a command's signature, after its own
options, and hands the command one parsed :class:`~kvbench.studies.run_options.RunOptions` as its ``run``
argument.
"""

from __future__ import annotations

from typing import Any

import typer

from kvbench.commands._flags import (
    BLOCK_SIZE,
    DATASET,
    DEVICE,
    DTYPE,
    GPU,
    GPU_MEMORY_UTILIZATION,
    KV_MEMORY,
    MODEL,
    REQUESTS,
    REQUESTS_FILE,
    RESERVE,
    SEED,
)
from kvbench.commands._option_group import OptionGroup, SharedOption, from_settings
from kvbench.commands._options import choice, parse_size
from kvbench.kv.policies import ADMISSION_MODES, RESERVATION_POLICIES, check_choice
from kvbench.studies.run_options import RunOptions

REQUESTS_PANEL, MODEL_PANEL, POOL_PANEL = "Requests", "Model and device", "KV pool"

# each option's type and default are RunOptions' (declared there once); the pool's size is typed as text here
SHARED_OPTIONS: tuple[SharedOption, ...] = from_settings(
    RunOptions,
    {
        "scenario": typer.Option(
            "--scenario",
            rich_help_panel=REQUESTS_PANEL,
            help="Built-in scenario name (see `kvbench scenarios`) or a TOML file.",
        ),
        "requests": REQUESTS.annotated("Requests to run (default: the scenario's).", REQUESTS_PANEL),
        "requests_file": REQUESTS_FILE.annotated(panel=REQUESTS_PANEL),
        "dataset": DATASET.annotated(
            "Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file (or 'real-chat', shipped; default: "
            "the scenario's dataset, if any), tokenized with the model's tokenizer.",
            REQUESTS_PANEL,
        ),
        "seed": SEED.annotated(
            "Seed of lengths, prompts and weights (default: the scenario's, else 0).", REQUESTS_PANEL
        ),
        "model": MODEL.annotated(
            "Preset, local checkpoint dir / config.json / GGUF file (tensor engine); with --simulate the shape to "
            "simulate.",
            MODEL_PANEL,
        ),
        "device": DEVICE.annotated(panel=MODEL_PANEL),
        "dtype": DTYPE.annotated("The dtype the model computes in (auto: fp32 on CPU, fp16 on CUDA).", MODEL_PANEL),
        "simulate": typer.Option(
            "--simulate",
            rich_help_panel=MODEL_PANEL,
            help="Tensor-free simulator with a GPU preset and roofline step times.",
        ),
        "gpu": GPU.annotated("GPU preset for --simulate.", MODEL_PANEL),
        "kv_memory": SharedOption(
            "kv_memory",
            str | None,
            None,
            KV_MEMORY.annotated("KV pool size, e.g. 64MiB (default: the scenario's budget).", POOL_PANEL),
        ),
        "utilization": GPU_MEMORY_UTILIZATION.annotated(
            "On CUDA: size the pools like vLLM from real free memory.", POOL_PANEL
        ),
        "block_size": BLOCK_SIZE.annotated("Tokens per KV block (default: the scenario's).", POOL_PANEL),
        "reserve": RESERVE.annotated("What a contiguous request reserves (default: the scenario's).", POOL_PANEL),
        "admission": typer.Option(
            "--admission",
            rich_help_panel=POOL_PANEL,
            help="Contiguous when memory is short: requests wait (queue) or are refused as OOM (reject).",
            **choice(ADMISSION_MODES),
        ),
    },
)


def parse_run_options(values: dict[str, Any]) -> RunOptions:
    """The shared options as typed, checked and parsed (one-line errors naming the flag)."""
    values = dict(values)
    kv_memory = values.pop("kv_memory")
    reserve, admission = values.pop("reserve"), values.pop("admission")
    dtype = values.pop("dtype")
    return RunOptions(
        **values,
        dtype=None if dtype is None or dtype.lower() == "auto" else dtype,
        kv_memory_bytes=parse_size(kv_memory, "--kv-memory") if kv_memory else None,
        kv_memory_text=kv_memory,
        reserve=check_choice(reserve, RESERVATION_POLICIES, "--reserve") if reserve else None,
        admission=check_choice(admission, ADMISSION_MODES, "--admission") if admission else None,
    )


RUN_OPTIONS = OptionGroup(SHARED_OPTIONS, "run", lambda values, _: parse_run_options(values))
