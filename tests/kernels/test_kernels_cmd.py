"""``kvbench kernels`` on CPU with tiny shapes: JSON, table, --out, one-line errors."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main
from kvbench.kernels import cpu_native
from kvbench.studies.kernel_bench import DecodeShape

TINY = [
    "kernels",
    "--device",
    "cpu",
    "--model",
    "tiny",
    "--batch",
    "1,3",
    "--context",
    "16,33",
    "--warmup",
    "0",
    "--repeat",
    "2",
]


@pytest.mark.parametrize(
    "option",
    [
        ["kernels", *TINY[1:], "--out"],
        ["compare", "/x", "/y", "--output"],
        ["sweep", "--device", "cpu", "--metrics-file"],
        ["diagnose", "--emit-prometheus-rules"],
    ],
)
def test_a_file_option_in_a_missing_folder_is_refused_and_no_folder_is_made(option, tmp_path, capfd) -> None:
    """A single file goes into a folder that exists (kvbench makes only its own run directories)."""
    target = tmp_path / "missing" / "dir" / "x.json"
    assert main([*option, str(target)]) == 2
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        f"error: {option[-1]} {target}: the folder {target.parent} does not exist; create it first or choose another "
        "path"
    )
    assert not (tmp_path / "missing").exists()


def test_json_output_and_out_file(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    target = tmp_path / "kernels.json"
    assert main([*TINY, "--json", "--out", str(target)]) == 0
    result = json.loads(capsys.readouterr().out)
    expected_backend = "native" if cpu_native.available() else "torch"  # auto on a CPU: the C kernel where it builds
    assert (result["backend"], result["dtype"], result["num_heads"], result["num_kv_heads"]) == (
        expected_backend,
        "fp32",
        4,
        2,
    )
    assert [(p["batch"], p["context"]) for p in result["points"]] == [(1, 16), (1, 33), (3, 16), (3, 33)]
    for point in result["points"]:
        assert point["status"] == "ok"
        assert point["paged_ms"] > 0 and point["contiguous_ms"] > 0 and point["paged_gbps"] > 0
        assert point["paged_over_contiguous"] == pytest.approx(point["paged_ms"] / point["contiguous_ms"])
        # on a CPU each point is put beside torch reading its own bytes, not beside one large copy
        assert point["reference_gbps"] > 0 and point["pct_of_copy_bandwidth"] is None
        assert point["pct_of_read_bandwidth"] == pytest.approx(100 * point["paged_gbps"] / point["reference_gbps"])
    assert result["copy_bandwidth_gbps"] is None
    if expected_backend == "native":  # which instruction-set build ran
        assert result["native_build"].startswith("C kernels built for ")
    assert json.loads(target.read_text()) == result


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                *TINY[:5],
                "--heads",
                "4",
                "--kv-heads",
                "1",
                "--head-dim",
                "8",
                "--batch",
                "2",
                "--context",
                "9",
                "--repeat",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ratio = paged time / contiguous SDPA time" in out and "4 q / 1 kv heads" in out
    assert "% read = paged GB/s / GB/s of torch reading the same bytes" in out and "% copy" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch"),
        (["--batch", "1,x"], "not an integer"),
        (["--context", ""], "--context"),
        (["--model", "gpt-5"], "unknown model"),
        (["--heads", "6", "--kv-heads", "4"], "not a multiple"),
        (["--dtype", "fp64"], "unknown --dtype"),
        (["--splits", "0"], "--splits"),
        (["--block-size", "0"], "--block-size"),
        (["--backend", "triton"], "needs --device cuda"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main([*TINY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_each_cpu_backend_can_be_chosen(capsys: pytest.CaptureFixture[str], backend: str) -> None:
    if backend == "native" and not cpu_native.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_native.unavailable_reason()}")
    assert main([*TINY, "--backend", backend, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == backend


def test_native_backend_refused_where_the_kernels_cannot_build(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_native, "_state", {"reason": "no C compiler found (cc, gcc, clang or $CC)"})
    assert main([*TINY, "--backend", "native"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--backend native is not available: no C compiler" in err and len(err.splitlines()) == 1


def test_bytes_moved_counts_kv_once_plus_query_and_output() -> None:
    shape = DecodeShape(batch=2, context=10, num_heads=8, num_kv_heads=2, head_dim=4, block_size=16)
    assert shape.bytes_moved(2) == (2 * 2 * 10 * 2 * 4 + 2 * 2 * 8 * 4) * 2


def test_a_run_that_measured_nothing_is_not_a_success(capfd):
    # a context no machine here can hold: every point skipped, said so, exit 1
    args = ["kernels", "--device", "cpu", "--batch", "64", "--context", "100000000", "--json"]
    assert main(args) == 1
    captured = capfd.readouterr()
    assert '"status": "skipped' in captured.out and "every point was skipped" in captured.err


def test_a_negative_seed_is_refused(capfd):
    assert main(["kernels", "--device", "cpu", "--seed", "-1"]) == 2
    assert "--seed" in capfd.readouterr().err
