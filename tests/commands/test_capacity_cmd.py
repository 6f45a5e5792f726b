"""`kvbench capacity` through the CLI: weights, KV budget, concurrency per strategy, 'does not fit'."""

import json

import pytest

from kvbench.cli import main
from kvbench.models.gpus import GIB


def _run(capsys, *argv):
    code = main(["capacity", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_llama_2_13b_fp16_does_not_fit_on_an_a10g(capsys):
    code, out, err = _run(capsys, "--model", "llama-2-13b", "--gpu", "a10g-24g")
    assert code == 1
    assert "does not fit" in out and err == ""


def test_does_not_fit_json(capsys):
    code, out, _ = _run(capsys, "--model", "llama-2-13b", "--gpu", "a10g-24g", "--json")
    assert code == 1
    result = json.loads(out)
    assert result["fits"] is False and "does not fit" in result["verdict"]
    assert result["kv_budget_bytes"] == 0 and result["strategies"] == []


def test_capacity_json(capsys):
    code, out, err = _run(capsys, "--json", "--block-size", "16,32")
    assert code == 0, err
    result = json.loads(out)
    assert result["gpu"] == "a100-80g" and result["fits"] is True
    assert result["bytes_per_token"] == 819_200 and result["model"]["name"] == "llama-2-13b"
    assert result["usable_bytes"] == int(0.9 * 80 * GIB)
    assert result["kv_budget_bytes"] == (
        result["usable_bytes"] - result["weight_bytes"] - result["activation_reserve_bytes"]
    )
    assert result["kv_token_slots"] == result["kv_budget_bytes"] // 819_200
    rows = {row["strategy"]: row for row in result["strategies"]}
    assert set(rows) == {"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16", "paged-32"}
    assert rows["contiguous-max"]["max_concurrency"] == result["kv_token_slots"] // 2048
    assert rows["paged-16"]["max_concurrency"] == result["kv_token_slots"] // 512
    assert rows["contiguous-max"]["max_concurrency"] < rows["paged-16"]["max_concurrency"]
    assert result["fits_one_max_len_request"] is True


def test_capacity_table_on_the_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = _run(capsys, "--model", "llama-2-7b", "--gpu", "a10g-24g")
    assert code == 0, err
    assert "llama-2-7b" in out and "KV budget" in out and "paged-16" in out and "contiguous-max" in out
    assert "(vLLM)" in out and 'vLLM\'s "maximum concurrency" figure' in " ".join(out.split())  # the x says what it is


def test_capacity_with_a_config_dir(capsys, tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = _run(capsys, "--model", str(tmp_path), "--gpu", "l4-24g", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["bytes_per_token"] == 2 * 4 * 2 * 32 * 2 and result["fits"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mean-len", "0"], "'--mean-len': Input should be greater than or equal to 1"),
        (["--max-len", "-5"], "'--max-len' / '--max-model-len': Input should be greater than or equal to 2"),
        (["--max-model-len", "0"], "'--max-len' / '--max-model-len': Input should be greater than or equal to 2"),
        (["--tensor-parallel-size", "0"], "Input should be greater than or equal to 1"),
        (
            ["--tensor-parallel-size", "3"],
            "tensor parallel size 3 does not divide the 40 attention heads of llama-2-13b: "
            "choose one of 1, 2, 4, 5, 8, 10, 20, 40",
        ),
        (["--pipeline-parallel-size", "41"], "pipeline parallel size 41 exceeds the 40 layers"),
        (
            ["--kv-cache-dtype", "fp4"],
            "unknown --kv-cache-dtype 'fp4'; choose one of auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, int8",
        ),
        (["--gpu-memory", "lots"], "--gpu-memory: cannot read 'lots'"),
        (["--gpu-memory", "0GiB"], "--gpu-memory must be positive"),
        (["--kv-memory", "-1GiB"], "--kv-memory: cannot read"),
        (["--max-num-seqs", "0"], "Input should be greater than or equal to 1"),
        (["--concurrency", "0"], "Input should be greater than or equal to 1"),
        (["--model", "./no/such/dir"], "no such path"),
        (["--model", "x.gguf"], "no such path"),
        (["--mean-len", "3000"], "exceeds --max-len"),
        (["--block-size", "0"], "--block-size"),
        (["--block-size", "abc"], "--block-size"),
        (["--model", "gpt-5"], "tiny, llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3.1-8b, opt-13b"),
        (["--gpu", "rtx-9090"], "unknown GPU"),
        (["--gpu-memory-utilization", "1.5"], "gpu-memory-utilization"),
        (["--dtype", "fp8"], "unknown --dtype 'fp8'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


def test_malformed_config_file(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 64,')
    code, _, err = _run(capsys, "--model", str(config))
    assert code == 2 and err.startswith("error: malformed config") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--max-len", "abc"], ["--mean-len", "1.5"], ["--json", "extra"]])
def test_click_usage_errors_exit_2(capsys, argv):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_kv_heads_that_tensor_parallelism_can_neither_split_nor_replicate(capsys, tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = _run(capsys, "--model", str(tmp_path), "--tensor-parallel-size", "6")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "tensor parallel size 6 and the 4 KV heads" in err


def test_capacity_and_waste_run_without_torch(tmp_path):
    """Neither command needs a model's weights: their modules and what they run import no torch (a fresh
    interpreter, with only these two commands registered)."""
    import subprocess
    import sys

    script = (
        "import sys, typer\n"
        "from typer.testing import CliRunner\n"
        "from kvbench.commands import capacity_cmd, waste_cmd\n"
        "app = typer.Typer()\n"
        "capacity_cmd.register(app)\n"
        "waste_cmd.register(app)\n"
        "runner = CliRunner()\n"
        "assert runner.invoke(app, ['capacity', '--model', 'llama-2-70b', '-tp', '4', '--json']).exit_code == 0\n"
        f"assert runner.invoke(app, ['waste', '--requests', '40', '--out', {str(tmp_path / 'w')!r}]).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_deployment_in_json(capsys):
    code, out, err = _run(
        capsys,
        "--model",
        "llama-2-70b",
        "--gpu",
        "h100-80g",
        "-tp",
        "16",
        "-pp",
        "2",
        "--kv-cache-dtype",
        "fp8",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "64",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert (result["tensor_parallel_size"], result["pipeline_parallel_size"], result["gpus"]) == (16, 2, 32)
    assert result["kv_heads_per_gpu"] == 1 and result["kv_head_replication"] == 2
    assert result["kv_bytes_per_token_per_gpu"] == 40 * 2 * 1 * 128 * 1  # 40 layers per stage, 1 head, fp8
    assert [s["layers"] for s in result["stages"]] == [[0, 40], [40, 80]]
    assert all(row["max_concurrency"] <= 64 for row in result["strategies"])


def test_the_terminal_says_when_kv_heads_are_replicated_and_what_to_try(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = _run(capsys, "--model", "llama-2-70b", "--gpu", "h100-80g", "-tp", "16")
    assert code == 0 and "every KV head is stored 2 times" in out
    code, out, _ = _run(capsys, "--model", "llama-2-70b", "--gpu", "h100-80g")
    assert code == 1
    assert "does not fit: weights 128.48 GiB" in out and "try --tensor-parallel-size 2" in out


def test_gpu_memory_alone_is_a_gpu_of_that_memory(capsys):
    code, out, err = _run(capsys, "--model", "llama-2-70b", "--gpu-memory", "192GiB", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["gpu"] == "GPU of 192 GiB" and result["gpu_memory_bytes"] == 192 * GIB
    assert result["usable_bytes"] == int(0.9 * 192 * GIB)
    code, out, _ = _run(capsys, "--model", "llama-2-7b", "--gpu", "h100-80g", "--gpu-memory", "79.6GiB", "--json")
    assert json.loads(out)["gpu_memory_bytes"] == int(79.6 * GIB)


def test_a_max_len_past_the_kv_budget_suggests_a_shorter_one(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = _run(
        capsys, "--model", "llama-3-8b", "--gpu", "l4-24g", "--max-len", "8192", "--gpu-memory-utilization", "0.66"
    )
    assert code == 1 and "cannot hold one request of max-len 8,192 tokens" in out
    assert "try --max-model-len" in out and "try --kv-cache-dtype fp8" in out
