"""Client metrics against hand arithmetic and vLLM's definitions."""

from __future__ import annotations

import pytest

from kvbench.endpoint.client_metrics import client_metrics, parse_slo, percentile_name
from kvbench.endpoint.record import RequestRecord
from kvbench.errors import KvbenchError


def done(conv: int, token_times: list[float], output_tokens: int, prompt_tokens: int | None = 10) -> RequestRecord:
    record = RequestRecord(
        conv,
        0,
        start=100.0 + conv,
        ok=True,
        token_times=token_times,
        output_tokens=output_tokens,
        output_tokens_from="usage",
        prompt_tokens=prompt_tokens,
        prompt_tokens_from="usage",
    )
    record.ttft, record.latency = token_times[0], token_times[-1]
    return record


def test_figures_by_hand():
    records = [
        done(0, [0.100, 0.120, 0.140, 0.160], 4),  # TTFT 100 ms, E2EL 160 ms, TPOT 60 / 3 = 20 ms
        done(1, [0.300, 0.340], 2),  # TTFT 300, E2EL 340, TPOT 40
        done(2, [0.050], 1),  # one token: no TPOT, no ITL
        RequestRecord(3, 0).fail("http", "planned", 500),
        RequestRecord(4, 0).fail("timeout", "not finished within 1 s"),
    ]
    m = client_metrics(records, duration_s=2.0)
    assert (m["requests"], m["completed"], m["failed"]) == (5, 3, 2)
    assert m["failed_by_kind"] == {"http": 1, "timeout": 1}
    assert m["failure_examples"] == ["request 3.0: http 500: planned", "request 4.0: timeout: not finished within 1 s"]
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (30, 7)
    assert m["request_throughput"] == 1.5 and m["output_throughput"] == 3.5 and m["total_token_throughput"] == 18.5
    assert m["mean_ttft_ms"] == pytest.approx(150.0) and m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["std_ttft_ms"] == pytest.approx(((50**2 + 150**2 + 100**2) / 3) ** 0.5)  # population std
    # linear percentiles of [50, 100, 300]: p90 at rank 1.8 = 100 + 0.8 * 200
    assert m["p90_ttft_ms"] == pytest.approx(260.0) and m["p99_ttft_ms"] == pytest.approx(296.0)
    assert m["mean_tpot_ms"] == pytest.approx(30.0) and m["median_tpot_ms"] == pytest.approx(30.0)
    assert m["mean_itl_ms"] == pytest.approx((20 + 20 + 20 + 40) / 4)
    assert m["mean_e2el_ms"] == pytest.approx((160 + 340 + 50) / 3)
    assert m["request_goodput"] is None and "slo_ms" not in m
    assert m["output_tokens_from"] == {"usage": 3}


def test_goodput_under_an_slo():
    records = [done(0, [0.100, 0.120, 0.140, 0.160], 4), done(1, [0.300, 0.340], 2), done(2, [0.050], 1)]
    # TTFT <= 200 ms and TPOT <= 25 ms: request 0 (100, 20) and request 2 (50, TPOT 0 as in vLLM)
    m = client_metrics(records, duration_s=4.0, slo=parse_slo("ttft=200,tpot=25"))
    assert m["request_goodput"] == pytest.approx(2 / 4.0) and m["slo_ms"] == {"ttft": 200.0, "tpot": 25.0}
    assert client_metrics(records, 4.0, slo={"e2el": 160})["request_goodput"] == pytest.approx(2 / 4.0)


def test_no_completed_request_leaves_latencies_unknown_not_zero():
    m = client_metrics([RequestRecord(0, 0).fail("connect", "refused")], duration_s=1.0)
    assert m["completed"] == 0 and m["output_throughput"] == 0.0
    assert m["mean_ttft_ms"] is None and m["p99_e2el_ms"] is None and m["std_tpot_ms"] is None


def test_unknown_input_counts_make_the_total_unknown():
    m = client_metrics([done(0, [0.1, 0.2], 2), done(1, [0.1, 0.2], 2, prompt_tokens=None)], 1.0)
    assert m["total_input_tokens"] is None and m["total_token_throughput"] is None
    assert m["input_tokens_from"] == {"usage": 2}


def test_missing_output_counts_are_a_bug_not_a_zero():
    record = done(0, [0.1], 1)
    record.output_tokens = None
    with pytest.raises(ValueError, match="fill them in first"):
        client_metrics([record], 1.0)


def test_other_percentiles_are_named_as_vllm_names_them():
    m = client_metrics([done(0, [0.1, 0.2], 2)], 1.0, percentiles=(50, 99.9))
    assert "p50_ttft_ms" in m and "p99.9_ttft_ms" in m
    assert percentile_name(99.0) == "p99" and percentile_name(99.9) == "p99.9"


def test_slo_text():
    assert parse_slo("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo("TTFT:500, e2el=2000") == {"ttft": 500.0, "e2el": 2000.0}  # vLLM's KEY:VALUE too


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no objective"),
        ("ttft", "expected KEY=MILLISECONDS"),
        ("itl=5", "expected KEY=MILLISECONDS"),
        ("ttft=fast", "not a number"),
        ("ttft=-1", "positive"),
        ("ttft=nan", "positive"),
        ("ttft=1,ttft=2", "twice"),
    ],
)
def test_bad_slo_text_is_a_one_line_error(text, message):
    with pytest.raises(KvbenchError, match=message):
        parse_slo(text)
