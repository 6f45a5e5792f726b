"""`kvbench waste` through the CLI: the analytic estimate, measured shares, files, and one-line errors."""

import csv
import io
import json
import sys

import pytest

from kvbench.cli import main

SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "torch_dtype": "float16",
}


def _run(capsys, *argv):
    code = main(["waste", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def waste_run(tmp_path_factory):
    """One small end-to-end run with --json, shared by the checks below."""
    out = tmp_path_factory.mktemp("waste") / "run"
    capture = pytest.MonkeyPatch()
    stdout, stderr = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", stdout)
    capture.setattr(sys, "stderr", stderr)
    try:
        code = main(["waste", "--requests", "200", "--out", str(out), "--json", "--block-size", "16,32"])
    finally:
        capture.undo()
    return code, stdout.getvalue(), out


def test_waste_end_to_end_writes_files(waste_run):
    code, _, out = waste_run
    assert code == 0
    for name in ("summary.json", "summary.csv", "summary.md", "waste.png"):
        assert (out / name).is_file(), name
    png = (out / "waste.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rows = list(csv.DictReader((out / "summary.csv").read_text().splitlines()))
    assert [r["engine"] for r in rows] == [
        "contiguous-max",
        "contiguous-pow2",
        "contiguous-oracle",
        "paged-16",
        "paged-32",
    ]
    assert "waste.token_state_pct" in rows[0]
    markdown = (out / "summary.md").read_text()
    assert "75.6%" in markdown and "paged-16" in markdown


def test_waste_json_and_shares(waste_run):
    _, stdout, out = waste_run
    document = json.loads(stdout)
    assert document == json.loads((out / "summary.json").read_text())
    assert document["kind"] == "waste" and document["schema_version"] >= 1
    assert round(document["analytic"]["at_mean_len_pct"], 1) == 75.6
    assert document["meta"]["requests"] == 200 and document["meta"]["model"]["bytes_per_token"] == 819_200
    points = {p["engine"]: p for p in document["points"]}
    for point in points.values():
        assert sum(point["waste"].values()) == pytest.approx(100.0, abs=1e-6)
        assert point["completed"] + point["rejected"] == 200
        assert point["status"] == "ok" and point["bytes_per_token"] == 819_200
        assert 0.0 <= point["fragmentation_mean"] <= 1.0
    token = {name: p["waste"]["token_state_pct"] for name, p in points.items()}
    assert token["contiguous-max"] < token["contiguous-pow2"] < token["contiguous-oracle"] < token["paged-16"]
    assert points["paged-16"]["waste"]["external_pct"] == 0.0
    assert points["contiguous-max"]["waste"]["internal_pct"] > points["paged-16"]["waste"]["internal_pct"]
    assert points["contiguous-oracle"]["waste"]["internal_pct"] == 0.0
    assert points["paged-16"]["waste"]["internal_pct"] <= points["paged-32"]["waste"]["internal_pct"]


def test_waste_table_on_the_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table needs ~120 columns; under 80 rich truncates every cell
    code, out, err = _run(
        capsys,
        "--requests",
        "30",
        "--out",
        str(tmp_path / "r"),
        "--strategies",
        "contiguous-max,paged",
        "--distribution",
        "fixed",
    )
    assert code == 0, err
    assert "75.6%" in out and "contiguous-max" in out and "paged-16" in out
    assert "contiguous-oracle" not in out


def test_waste_from_a_trace_and_a_config_dir(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMALL_LLAMA))
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n100,50\n300,200\n1000,1000\n")  # the last exceeds --max-len 1024
    # a small model leaves a huge KV pool on a big GPU; 1% of an A10G keeps it to ~230k token slots
    code, out, err = _run(
        capsys,
        "--model",
        str(model),
        "--gpu",
        "a10g-24g",
        "--gpu-memory-utilization",
        "0.01",
        "--max-len",
        "1024",
        "--trace",
        str(trace),
        "--out",
        str(tmp_path / "r"),
        "--json",
    )
    assert code == 0, err
    assert "1 of 3 trace requests skipped: prompt + output exceeds max-len 1024" in err
    document = json.loads(out)
    assert document["meta"]["requests"] == 2
    assert document["meta"]["skipped_requests"] == {
        "count": 1,
        "total": 3,
        "reason": "prompt + output exceeds max-len 1024",
    }
    assert document["meta"]["model"]["bytes_per_token"] == 2 * 4 * 2 * 32 * 2
    for point in document["points"]:
        assert (point["completed"], point["rejected"]) == (2, 0)
    # the analytic estimate is that of the runnable requests: (1024 - 325) / 1024, never negative
    assert document["analytic"]["mean_len"] == 325
    assert document["analytic"]["at_mean_len_pct"] == pytest.approx(100 * (1024 - 325) / 1024)


def test_an_empty_out_is_refused(capsys):
    code, out, err = _run(capsys, "--out", "")
    assert code == 2 and "--out is empty" in err


def test_a_trace_with_nothing_runnable_is_refused(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n2000,1000\n")
    code, out, err = _run(capsys, "--max-len", "2048", "--trace", str(trace), "--out", str(tmp_path / "r"))
    assert code == 2
    assert "longer than max-len 2048" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mean-len", "0"], "'--mean-len': Input should be greater than or equal to 1"),
        (["--mean-len", "-3"], "'--mean-len': Input should be greater than or equal to 1"),
        (["--mean-len", "5000"], "mean length"),
        (["--max-len", "-5"], "--max-len"),
        (["--max-len", "0"], "--max-len"),
        (["--block-size", "0"], "--block-size"),
        (["--block-size", "16,x"], "--block-size"),
        (["--block-size", ""], "--block-size"),
        (["--requests", "0"], "--requests"),
        (["--concurrency", "0"], "--concurrency"),
        (["--strategies", "paged,best"], "unknown strategy 'best'"),
        (["--strategies", ","], "strategies is empty"),
        (["--strategies", "paged,paged"], "strategies lists 'paged' twice"),
        (["--block-size", "16,16"], "--block-size lists 16 twice"),
        (["--model", "llama-9-1t"], "tiny, llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3.1-8b, opt-13b"),
        (["--gpu", "tpu"], "unknown GPU 'tpu'"),
        (["--dtype", "int4"], "unknown --dtype 'int4'"),
        (["--gpu-memory-utilization", "0"], "gpu-memory-utilization"),
        (["--distribution", "zipf"], "unknown length distribution"),
        (["--prompt-ratio", "1.5"], "prompt ratio"),
        (["--gpu", "a10g-24g"], "does not fit"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, out, err = _run(capsys, *argv, "--out", str(tmp_path / "r"))
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [["--max-len", "abc"], ["--mean-len", "1.5"], ["--requests", "many"], ["--nope"]])
def test_click_usage_errors_exit_2(capsys, argv):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.jsonl", None, "trace file not found"),
        ("bad.jsonl", '{"prompt_len": 3, "output_len": 2}\n{oops\n', "bad.jsonl:2: not valid JSON"),
        ("nolen.jsonl", '{"prompt_len": 3}\n', "output_len is missing"),
        ("bad.csv", "prompt_len,output_len\n5,abc\n", "positive integer"),
        ("empty.csv", "", "holds no requests"),
    ],
)
def test_bad_traces_are_one_line_errors(capsys, tmp_path, name, text, message):
    trace = tmp_path / name
    if text is not None:
        trace.write_text(text)
    code, _, err = _run(capsys, "--trace", str(trace), "--out", str(tmp_path / "r"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"hidden_size": 64})])
def test_malformed_config_is_a_one_line_error(capsys, tmp_path, text):
    config = tmp_path / "config.json"
    config.write_text(text)
    code, _, err = _run(capsys, "--model", str(config), "--out", str(tmp_path / "r"))
    assert code == 2 and err.startswith("error: malformed config") and err.count("\n") == 1, err


def test_a_pool_too_large_to_simulate_is_a_clear_error(capsys):
    """tiny on an 80 GB GPU holds ~300M token slots: a one-line error instead of hanging for minutes."""
    from kvbench.cli import main

    assert main(["waste", "--model", "tiny", "--requests", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "more than the simulator's" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [["waste", "--requests", "20"], ["capacity"], ["sweep", "--simulate", "--requests", "20", "--concurrency", "10"]],
)
def test_a_max_len_past_the_models_context_is_refused(command, tmp_path, capsys):
    args = [*command, "--model", "llama-2-13b", "--max-len", "100000"]
    if command[0] == "sweep":  # the sweep's max-len comes from its scenario
        scenario = tmp_path / "long.toml"
        scenario.write_text("max_len = 100000\nmean_len = 500\n[budget]\nslots = 200000\n")
        args = [*command, "--model", "llama-2-13b", "--scenario", str(scenario)]
    if command[0] != "capacity":
        args += ["--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "exceeds the context length of llama-2-13b (4,096 tokens" in err and len(err.splitlines()) == 1


def test_waste_on_a_tensor_parallel_deployment_with_an_fp8_cache(tmp_path, capsys):
    """The pool is one GPU's: 4-way tensor parallelism splits llama-2-70b's 8 KV heads 2 per GPU, fp8 halves them."""
    from kvbench.models.deployment import Parallelism, deployment_budget
    from kvbench.models.gpus import resolve_gpu
    from kvbench.models.resolve import resolve_model

    code, out, err = _run(
        capsys,
        "--model",
        "llama-2-70b",
        "--gpu",
        "h100-80g",
        "-tp",
        "4",
        "--kv-cache-dtype",
        "fp8",
        "--requests",
        "60",
        "--out",
        str(tmp_path / "run"),
        "--json",
    )
    assert code == 0, err
    meta = json.loads(out)["meta"]
    shape = resolve_model("llama-2-70b").with_kv_dtype("fp8")
    budget = deployment_budget(shape, resolve_gpu("h100-80g"), Parallelism(4), 0.9)
    assert meta["pool_slots"] == budget.token_slots == budget.stages[0].kv_bytes // (80 * 2 * 2 * 128 * 1)
    assert meta["gpu"] == "4 x h100-80g" and meta["tensor_parallel_size"] == 4 and meta["kv_cache_dtype"] == "fp8"


def test_waste_says_when_a_model_has_windowed_layers(tmp_path, capsys):
    config = dict(SMALL_LLAMA, model_type="mistral", sliding_window=512, max_position_embeddings=4096)
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = _run(
        capsys,
        "--model",
        str(tmp_path),
        "--gpu",
        "l4-24g",
        "--requests",
        "30",
        "--block-size",
        "64",
        "--max-len",
        "1024",
        "--mean-len",
        "300",
        "--out",
        str(tmp_path / "run"),
        "--json",
    )
    assert code == 0, err
    assert "4 of 4 layers keep a window of 512 tokens" in json.loads(out)["meta"]["sliding_window_note"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kv-cache-dtype", "fp4"], "unknown --kv-cache-dtype 'fp4'"),
        (["--tensor-parallel-size", "3"], "tensor parallel size 3 does not divide the 40 attention heads"),
        (["--gpu-memory", "12 apples"], "--gpu-memory: cannot read"),
    ],
)
def test_deployment_options_refuse_bad_values(capsys, argv, message):
    code, out, err = _run(capsys, *argv, "--requests", "10")
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("columns", [100, 120])
def test_the_table_fits_columns_with_every_strategy_named_whole(capsys, monkeypatch, tmp_path, columns):
    """COLUMNS is the width off a terminal too (a pipe took 160 whatever it said), and at 100 columns no
    strategy is cut to "contigu…": rows stay distinct, and no column is dropped."""
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = _run(capsys, "--requests", "100", "--out", str(tmp_path / "run"))
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns
    table = lines[lines.index(next(line for line in lines if "strategy" in line)) :]
    for name in ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"):
        (row,) = [line for line in table if line.lstrip().startswith(name + " ")]
        assert "…" not in row and len(row.split("│")) == 11  # the name and ten figures
