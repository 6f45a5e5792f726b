"""Every kind of bad input, across commands: one `error:` line on stderr, nothing on stdout, exit 2.

Nothing before the error either: no progress bar, no note, no table (the user reads only the one line).
Values a source reports outside their meaning are flagged and set aside, never reported as measured.
"""

from __future__ import annotations

import json
import time

import pytest
from bad_servers import RawServer, raw, redirects, respond, trickle

from kvbench.cli import main

CASES = [
    "sweep --model /nonexistent --device cpu",
    "sweep --kv-memory 1 --device cpu --concurrency 2",
    "sweep --kv-memory abc --device cpu",
    "sweep --requests-file /nonexistent --device cpu",
    "sweep --simulate --gpu tpu",
    "sweep --simulate --model llama-2-70b --gpu a10g-24g",
    "sweep --dtype int8 --device cpu",
    "sweep --reserve exact",
    "sweep --admission drop",
    "sweep --scenario /etc/hostname",
    "sweep --gpu-memory-utilization 0.5 --device cpu",
    "sweep --gpu-memory-utilization 0 --simulate",
    "sweep --metrics-port 99999 --device cpu",
    "sweep --threads zero --device cpu",
    "sweep --requests 1000000000 --simulate",
    "sweep --kv-memory 1TiB --device cpu",
    "share --n 2 --model llama-2-13b --device cpu",
    "share --n 2 --block-size 100000 --device cpu",
    "share --n 2 --num-blocks 99999999999 --device cpu",
    "share --n 2 --requests 1000000000 --device cpu",
    "share --n 2 --max-len 4097 --device cpu",
    "share --n 100000 --device cpu",
    "share --n 2 --prompt-len 1000000000 --device cpu",
    "share --n 2 --output-len 5000 --device cpu",
    "share --beam 2 --output-len 1000000000 --device cpu",
    "share --beam 2 --requests 1 --prompt-len 5000 --output-len 4 --num-blocks 100000 --device cpu",
    "waste --model /nonexistent",
    "waste --max-len 100000",
    "waste --trace /etc/hostname",
    "waste --requests 1000000000",
    "capacity --model gpt2-nope",
    "capacity --mean-len 5000",
    "kernels --batch 0",
    "diagnose /nonexistent",
    "compare /nonexistent /nonexistent",
    "serve --kv-events tcp://*:5557",
    "serve --kv-events 5557 --engine contiguous",
    "serve --kv-events 5557 --no-prefix-caching",
    "serve --kv-events-replay 5558",
    "serve --kv-events 5557 --kv-events-replay 5557",
    "serve --kv-events udp://127.0.0.1:5557",
    "sweep --target http://127.0.0.1:1 --kv-events tcp://127.0.0.1:0",
    "sweep --target http://127.0.0.1:1 --kv-events-replay 5558",
    "sweep --target http://127.0.0.1:1 --target b=http://127.0.0.1:2 --kv-events 5557",
    "sweep --target http://127.0.0.1:1 --thrash-window 0",
    "sweep --kv-events 5557",
    "diagnose --threshold max_thrash_share=2 /nonexistent",
    "diagnose --threshold max_thrash_share /nonexistent",
    "diagnose --threshold nope=1 /nonexistent",
    "diagnose --threshold fragmentation=abc /nonexistent",
    "diagnose --threshold =0.2 /nonexistent",
    "diagnose --threshold for=5x /nonexistent",
    "diagnose --threshold fragmentation=nan /nonexistent",
    "diagnose --threshold alloc_latency_p99_ms=inf /nonexistent",
    "diagnose --threshold fragmentation=0.2 --threshold fragmentation=0.3 /nonexistent",
    "sweep --target http://127.0.0.1:1 --trace mooncake-conversation-1k --rate 1",
    "sweep --target http://127.0.0.1:1 --time-scale 0.5",
    "sweep --target http://127.0.0.1:1 --trace mooncake-conversation-1k --prefix-hit-rate 0.5",
    "sweep --target http://127.0.0.1:1 --trace /nonexistent.jsonl",
    "sweep --target http://127.0.0.1:1 --trace mooncake-conversation-1k --window 5:1",
    "sweep --target http://127.0.0.1:1 --prefix-hit-rate 1.5",
    "sweep --target http://127.0.0.1:1 --prefix-hit-rate 0.5 --api chat",
    "capacity --gpu-memory 1e999GiB",
    "capacity --kv-memory 1e999GiB",
    "capacity --gpu-memory-utilization 1e-300",
    "sweep --simulate --kv-memory 1e999GiB",
    "waste --requests 20 --gpu-memory 1e999GiB",
    "reuse --points 2 --kv-sizes 1e999GiB",
    "reuse --points 2 --offload 1e999GiB",
    "reuse --points 2 --prefix-groups 2 --rate 1e-300",
    "dataset real-chat --model /nonexistent",
    "dataset real-chat --block-size 100000",
    "sweep --simulate --concurrency ٣",
    "fleet --simulate --policies round-robin,,random",
    "waste --trace /tmp",
]


@pytest.mark.parametrize("line", CASES)
def test_bad_input_is_one_error_line_and_nothing_else(line, tmp_path, capfd):
    args = line.split()
    if args[0] in ("sweep", "share", "waste"):
        args += ["--out", str(tmp_path / "run")]
    assert main(args) == 2
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, (captured.out, err)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"rope_scaling": "linear"}, "rope_scaling"),
        ({"head_dim": 7}, "head_dim"),
        ({"rope_theta": float("nan")}, "rope_theta"),
        ({"model_type": "gpt2"}, "unsupported architecture 'gpt2'"),
    ],
)
def test_malformed_configs_are_one_line_in_every_command(config, message, tmp_path, capfd):
    base = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
    }
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**base, **config}))
    for args in (
        ["capacity", "--model", str(model)],
        ["waste", "--model", str(model), "--out", str(tmp_path / "w")],
        ["sweep", "--model", str(model), "--device", "cpu", "--out", str(tmp_path / "s")],
    ):
        assert main(args) == 2
        captured = capfd.readouterr()
        err = captured.err.strip()
        assert captured.out == "" and message in err and len(err.splitlines()) == 1, (args, err)


def _one_error_line_alone(capfd) -> str:
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, (captured.out, err)
    return err


def test_a_trace_with_skipped_rows_and_a_pool_too_big_gives_the_error_alone(tmp_path, capfd):
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len\n10,10\n5000,10\n6000,1\n")  # 2 of 3 past max-len 2048
    assert main(["waste", "--model", "tiny", "--trace", str(trace), "--out", str(tmp_path / "w")]) == 2
    assert "more than the simulator's" in _one_error_line_alone(capfd)  # no "warning: 2 of 3 ... skipped" first


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda lines: [lines[0], "{broken", *lines[1:]], "not valid JSON"),
        (lambda lines: [lines[0], "[1, 2]", *lines[1:]], "not a sweep point"),
    ],
)
def test_a_resume_of_results_damaged_in_the_middle_gives_the_error_alone(damage, message, tmp_path, capfd):
    out = tmp_path / "run"
    args = ["sweep", "--simulate", "--scenario", "ci-smoke", "--out", str(out)]
    assert main(args) == 0
    capfd.readouterr()
    results = out / "results.jsonl"
    results.write_text("\n".join(damage(results.read_text().splitlines())) + "\n")
    assert main([*args, "--resume"]) == 2
    assert message in _one_error_line_alone(capfd)  # no SIMULATED:, KV pool: or stop: note first


def test_a_resume_with_a_torn_tail_and_other_settings_gives_the_error_alone(tmp_path, capfd):
    out = tmp_path / "run"
    args = ["sweep", "--simulate", "--scenario", "ci-smoke", "--out", str(out)]
    assert main(args) == 0
    capfd.readouterr()
    with (out / "results.jsonl").open("a") as results:
        results.write('{"engine": "paged", "conc')  # a write cut short
    assert main([*args, "--resume", "--seed", "7"]) == 2
    assert "other settings" in _one_error_line_alone(capfd)  # the torn-line warning is not printed before it


@pytest.mark.parametrize(
    "args, option",
    [
        (["compare", "/nonexistent", "/nonexistent", "-o", ""], "--output"),
        (["compare", "/nonexistent", "/nonexistent", "--output", " "], "--output"),
        (["kernels", "--batch", "1", "--context", "16", "--out", ""], "--out"),
        (["diagnose", "--emit-prometheus-rules", ""], "--emit-prometheus-rules"),
        (["sweep", "--device", "cpu", "--metrics-file", ""], "--metrics-file"),
    ],
)
def test_an_empty_file_option_is_named_not_written_as_the_current_folder(args, option, capfd):
    assert main(args) == 2
    assert _one_error_line_alone(capfd) == f"error: {option} is empty; give a file path"  # not "cannot write ."


# -- hostile /metrics endpoints (real servers on 127.0.0.1 that misbehave on purpose) -----------------------
@pytest.mark.parametrize(
    "handler, said",
    [
        (trickle(every_s=1.0), "did not answer within 5 s"),  # each read is quick; the scrape's deadline ends it
        (raw(b"HTTPX/9 banana\r\n\r\n"), "did not answer in HTTP: Bad status line"),
        (redirects({"/metrics": "/a", "/a": "/metrics"}), "redirects in a loop"),
        (redirects({"/metrics": "ftp://127.0.0.1/metrics"}), "redirects to ftp:// (ftp://127.0.0.1/metrics): only"),
        (respond("# TYPE x gauge\nx 1\n", content_length=500), "the body was cut short"),
    ],
    ids=["trickle", "bad status line", "redirect loop", "redirect to ftp", "short body"],
)
@pytest.mark.parametrize("command", ["diagnose", "watch"])
def test_a_hostile_metrics_endpoint_is_one_error_line_within_the_deadline(command, handler, said, tmp_path, capfd):
    out = tmp_path / "w"
    with RawServer(handler) as server:
        start = time.monotonic()
        args = (
            ["diagnose", "--metrics-url", server.url()]
            if command == "diagnose"
            else ["watch", "--metrics-url", server.url(), "--duration", "1", "--out", str(out)]
        )
        assert main(args) == 2
        took = time.monotonic() - start
    err = _one_error_line_alone(capfd)
    assert err.startswith("error: cannot scrape: ") and said in err, err
    assert took < 9, took  # 5 s for the whole scrape, not per socket read
    assert not out.exists()


@pytest.mark.parametrize(
    "values, invalid, not_shown",
    [
        ({"usage": 37.5}, "vllm:kv_cache_usage_perc is 37.5: outside 0-1 (a share, not a percentage)", "3750"),
        ({"running": -3}, "vllm:num_requests_running is -3: negative (a count)", "-3 running"),
        ({"waiting": float("nan")}, "vllm:num_requests_waiting is nan: not a number (NaN)", "nan waiting"),
        ({"prefix_hits": 1e12}, "vllm:prefix_cache_hits_total is 1e+12: more than the", "prefix-cache hit rate"),
    ],
)
def test_vllm_values_outside_their_meaning_are_flagged_never_reported(
    values, invalid, not_shown, metrics_server, vllm_exposition, capfd
):
    server = metrics_server.serve([vllm_exposition(**values)])
    assert main(["diagnose", "--metrics-url", server.url]) == 0
    out = capfd.readouterr().out
    text = " ".join(out.split())  # rich wraps long lines
    assert "note: invalid value set aside, not used: vLLM engine=0 model_name=" in text
    assert invalid in text, text
    assert not_shown not in text


def test_kvbench_values_outside_their_meaning_are_flagged_never_reported(metrics_server, capfd):
    exposition = "\n".join(
        [
            "# TYPE kvbench_kv_cache_blocks_capacity gauge",
            'kvbench_kv_cache_blocks_capacity{engine="paged",device="cpu"} 100',
            "# TYPE kvbench_kv_cache_blocks_free gauge",
            'kvbench_kv_cache_blocks_free{engine="paged",device="cpu"} 50',
            "# TYPE kvbench_kv_cache_blocks_used gauge",
            'kvbench_kv_cache_blocks_used{engine="paged",device="cpu"} 50',
            "# TYPE kvbench_kv_cache_fragmentation gauge",
            'kvbench_kv_cache_fragmentation{engine="paged",device="cpu"} 5',
            "# TYPE kvbench_requests_running gauge",
            'kvbench_requests_running{engine="paged",device="cpu"} 3',
            "# TYPE kvbench_block_alloc_latency_seconds histogram",
            'kvbench_block_alloc_latency_seconds_bucket{engine="paged",device="cpu",le="0.001"} NaN',
            'kvbench_block_alloc_latency_seconds_bucket{engine="paged",device="cpu",le="+Inf"} 4',
            'kvbench_block_alloc_latency_seconds_count{engine="paged",device="cpu"} 4',
            'kvbench_block_alloc_latency_seconds_sum{engine="paged",device="cpu"} 0.001',
            "",
        ]
    )
    server = metrics_server.serve([exposition])
    assert main(["diagnose", "--metrics-url", server.url, "--json"]) == 0
    result = json.loads(capfd.readouterr().out)
    assert [f["rule"] for f in result["findings"]] == []  # no "fragmentation 5.000 > 0.3", no "p99 ~inf ms"
    reasons = {n["rule"]: n["reason"] for n in result["not_evaluated"]}
    assert (
        reasons["fragmentation"] == "invalid value: kvbench_kv_cache_fragmentation is 5: outside 0-1 (a share, "
        "not a percentage)"
    )
    assert (
        reasons["alloc_latency"] == "invalid value: kvbench_block_alloc_latency_seconds_bucket: the bucket "
        "le=0.001 counts nan"
    )
    assert sum("invalid value set aside" in note for note in result["notes"]) == 2


def test_label_values_with_terminal_escapes_are_printed_escaped(
    metrics_server, vllm_exposition, tmp_path, monkeypatch, capfd
):
    import kvbench.studies.watch as watch_study

    hostile = vllm_exposition(usage=0.5).replace('engine="0"', 'engine="0\\u001b]0;pwned\\u0007\\u001b[2J"')
    hostile = hostile.replace("\\u001b", "\x1b").replace("\\u0007", "\x07")
    server = metrics_server.serve([hostile])
    assert main(["diagnose", "--metrics-url", server.url]) == 0
    out = capfd.readouterr().out
    assert "\x1b]" not in out and "\x07" not in out and "\x1b[2J" not in out
    assert "engine=0\\x1b]0;pwned\\x07\\x1b[2J" in out.replace("\n", "")
    monkeypatch.setattr(watch_study, "_sleep", lambda seconds: None)
    assert (
        main(
            [
                "watch",
                "--metrics-url",
                server.url,
                "--scrape-interval",
                "0.05",
                "--duration",
                "0.05",
                "--out",
                str(tmp_path / "w"),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "pwned" in out and "\x1b]0;pwned" not in out and "\x07" not in out


# -- JSON and TOML nested past any sense: one line, never a RecursionError traceback ------------------------
_DEEP = {
    "very deep": "[" * 100_000 + "]" * 100_000,
    "past the limit": "[" * 65 + "]" * 65,
    "a number of 5,000 digits": "1" * 5000,  # more digits than Python converts: a ValueError, not a JSONDecodeError
}


def _deep_cases(tmp_path, deep: str) -> list[list[str]]:
    files = {
        "data.json": deep,
        "data.jsonl": '{"prompt": "hi", "x": ' + deep + "}\n",
        "requests.jsonl": '{"prompt_token_ids": ' + deep + ', "output_len": 4}\n',
        "trace.jsonl": '{"prompt_len": 4, "output_len": 4, "x": ' + deep + "}\n",
        "model/config.json": '{"model_type": "llama", "x": ' + deep + "}",
        "run/summary.json": '{"schema_version": 1, "points": ' + deep + "}",
        "w/timeline.jsonl": '{"kind": "kvbench-watch", "version": 1, "url": ' + deep + "}\n",
        "scenario.toml": "x = " + deep.replace("]", "]") + "\n",
        "thresholds.toml": "x = " + deep + "\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    t = lambda name: str(tmp_path / name)  # noqa: E731
    return [
        ["dataset", t("data.json")],
        ["dataset", t("data.jsonl")],
        ["waste", "--dataset", t("data.json"), "--out", t("o1")],
        ["sweep", "--simulate", "--requests-file", t("requests.jsonl"), "--out", t("o2")],
        ["waste", "--trace", t("trace.jsonl"), "--out", t("o3")],
        ["capacity", "--model", t("model")],
        ["waste", "--model", t("model"), "--out", t("o4")],
        ["compare", t("run"), t("run")],
        ["diagnose", t("run")],
        ["diagnose", t("w/timeline.jsonl")],
        ["sweep", "--simulate", "--scenario", t("scenario.toml"), "--out", t("o5")],
        ["diagnose", t("run"), "--thresholds", t("thresholds.toml")],
    ]


@pytest.mark.parametrize("depth", list(_DEEP))
def test_deeply_nested_input_is_one_error_line(depth, tmp_path, capfd):
    for args in _deep_cases(tmp_path, _DEEP[depth]):
        assert main(args) == 2, args
        err = _one_error_line_alone(capfd)
        assert "Recursion" not in err and (
            "nested" in err or "not valid" in err or "invalid" in err or "not JSON" in err
        ), (
            args,
            err,
        )


def test_a_byte_order_mark_is_read_past(tmp_path, capfd):
    """Windows editors start UTF-8 files with a byte-order mark: not a reason to call a file "not JSON"."""
    bom = "\ufeff"
    prompt = "tell me, in a few words, how a paged KV cache differs from a contiguous one"
    (tmp_path / "data.jsonl").write_text(
        bom
        + json.dumps({"prompt": prompt, "output_len": 5})
        + "\n" * 1
        + (json.dumps({"prompt": prompt, "output_len": 5}) + "\n") * 2,
        encoding="utf-8",
    )
    (tmp_path / "trace.csv").write_text(bom + "prompt_len,output_len\n10,10\n20,5\n", encoding="utf-8")
    (tmp_path / "share.json").write_text(
        bom
        + json.dumps([{"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": prompt}]}] * 2),
        encoding="utf-8",
    )
    assert main(["dataset", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "d1"), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["meta"]["dataset"]["records"] == 3
    assert main(["dataset", str(tmp_path / "share.json"), "--out", str(tmp_path / "d2"), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["meta"]["dataset"]["records"] == 2
    assert main(["waste", "--trace", str(tmp_path / "trace.csv"), "--out", str(tmp_path / "w"), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["meta"]["requests"] == 2


@pytest.mark.parametrize(
    "row, said",
    [
        ('{"prompt_len": true, "output_len": 4}', "request 1: prompt_len must be a positive integer, got true"),
        ('{"prompt_len": 4, "output_len": false}', "request 1: output_len must be a positive integer, got false"),
    ],
)
@pytest.mark.parametrize("command", ["waste", "fleet"])
def test_a_trace_length_given_as_a_boolean_is_refused_not_counted_as_1(command, row, said, tmp_path, capfd):
    trace = tmp_path / "t.jsonl"
    trace.write_text(row + "\n")
    args = (
        ["waste", "--trace", str(trace)]
        if command == "waste"
        else ["fleet", "--simulate", "--rate", "5", "--trace", str(trace)]
    )
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    assert said in _one_error_line_alone(capfd)


# -- simulated fleets that would never end or would eat the machine: refused up front, with the reason -------
@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--rate", "1e-300"],
            "at 1e-300 req/s, 300 requests take about 2.99e+302 s to arrive; a simulated clock covers "
            "1e+09 s (about 31 years): raise the rate to at least 2.99e-07 req/s",
        ),
        (["--rate", "5", "--tick", "1e-9"], "a tick of 1e-09 s is finer than an engine step"),
        (
            ["--rate", "5", "--prefix-groups", "1000000", "--prefix-len", "100000"],
            "a shared prefix of 100,000 tokens does not fit a prompt: at max-len 2,048",
        ),
        (
            ["--rate", "5", "--prefix-groups", "99999999999", "--prefix-len", "8"],
            "prefix groups is above kvbench's limit",
        ),
        (["--rate", "5", "--autoscale", "--startup-s", "1e300"], "an instance start-up of 1e+300 s is past"),
        (["--trace", "FAR"], "span 1e+300 s; a simulated clock covers 1e+09 s"),
    ],
)
def test_a_simulated_fleet_that_could_not_end_is_refused_up_front(args, said, tmp_path, capfd):
    far = tmp_path / "far.jsonl"
    far.write_text(
        "".join(json.dumps({"prompt_len": 10, "output_len": 5, "arrival_time": t}) + "\n" for t in (0, 1, 1e300))
    )
    args = [str(far) if a == "FAR" else a for a in args]
    start = time.monotonic()
    assert main(["fleet", "--simulate", "--requests", "300", *args, "--out", str(tmp_path / "run")]) == 2
    assert said in _one_error_line_alone(capfd)
    assert time.monotonic() - start < 60 and not (tmp_path / "run").exists()


def test_a_fleet_with_a_one_year_gap_and_a_million_prefix_groups_runs_at_the_cost_of_its_requests(tmp_path, capfd):
    """A gap costs nothing (the idle fleet's clock jumps), and prefixes are drawn only as prompts use them."""
    trace = tmp_path / "year.jsonl"
    year = 365 * 86400
    trace.write_text(
        "".join(
            json.dumps({"prompt_len": 100 + i, "output_len": 20, "arrival_time": i if i < 10 else year + i}) + "\n"
            for i in range(20)
        )
    )
    start = time.monotonic()
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--instances",
                "64",
                "--trace",
                str(trace),
                "--tick",
                "0.5",
                "--policies",
                "round-robin",
                "--out",
                str(tmp_path / "year"),
                "--json",
            ]
        )
        == 0
    )
    (point,) = json.loads(capfd.readouterr().out)["points"]
    assert point["completed"] == 20 and point["elapsed_s"] > year
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--rate",
                "20",
                "--requests",
                "50",
                "--prefix-groups",
                "1000000",
                "--prefix-len",
                "1000",
                "--policies",
                "prefix-affinity",
                "--out",
                str(tmp_path / "prefix"),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capfd.readouterr().out)["points"][0]["completed"] == 50
    assert time.monotonic() - start < 120
