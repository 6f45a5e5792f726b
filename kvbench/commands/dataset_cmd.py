"""``kvbench dataset FILE``: the prompt and answer lengths of a dataset and the waste they imply."""

from __future__ import annotations

import typer

from kvbench.commands._flags import BLOCK_SIZE, JSON, MAX_LEN, MODEL, OUT, REQUESTS, SEED
from kvbench.commands._options import int_list, make_console, run_directory
from kvbench.commands._run import write_study
from kvbench.errors import KvbenchError
from kvbench.report.dataset_report import dataset_markdown, dataset_plot, print_dataset
from kvbench.studies.dataset_profile import DatasetSettings, describe_dataset


def dataset(
    path: str = typer.Argument(..., help="ShareGPT JSON or {prompt, output_len} JSONL file, or 'real-chat' (shipped)."),
    model: str = MODEL(
        "tiny", "Whose tokenizer counts tokens: a GGUF file or a checkpoint dir (presets count words and punctuation)."
    ),
    max_len: int = MAX_LEN(2048, "Context limit: longer records are dropped, and contiguous-max reserves this."),
    requests: int | None = REQUESTS(None, "Draw this many requests with --seed (default: every usable record)."),
    seed: int = SEED(0, "Seed of the draw."),
    block_sizes: str = BLOCK_SIZE("16", "Tokens per KV block for the estimate; a list compares several, e.g. 8,16,32."),
    out: str | None = OUT(None, "Run directory (default reports/dataset-<time>)."),
    as_json: bool = JSON(False, "Print the summary as JSON on stdout."),
) -> None:
    """Prompt and answer lengths of a dataset and the waste estimate they imply.

    Prompt and answer length histograms (table and plot) and the analytic waste estimate for a max-len.

    Records that cannot be read, or are too short or too long, are counted and left out, as in a run.
    """
    from kvbench.models.resolve import resolve_model
    from kvbench.models.tokenizers import load_tokenizer  # transformers and torch load only when run

    resolve_model(model)  # a model that does not exist is refused, not read as a preset without a tokenizer
    sizes = tuple(int_list(block_sizes, "--block-size"))
    if any(size > max_len for size in sizes):
        raise KvbenchError(f"--block-size {max(sizes)} is above --max-len {max_len}: one block would outgrow a request")
    out_dir = run_directory(out)
    settings = DatasetSettings(
        path=path,
        model=model,
        max_len=max_len,
        requests=requests,
        seed=seed,
        block_sizes=sizes,
    )
    console = make_console(stderr=as_json)
    with console.status("reading the dataset..."):
        result = describe_dataset(settings, load_tokenizer(model))
    write_study(
        "dataset",
        out_dir,
        result,
        as_json,
        plot=dataset_plot,
        plot_file="lengths.png",
        markdown=dataset_markdown,
        tables=lambda run_dir: print_dataset(console, result, run_dir),
    )


def register(app: typer.Typer) -> None:
    app.command("dataset")(dataset)
