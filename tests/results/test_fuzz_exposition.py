"""Fuzzed /metrics pages: whatever a server (or something that is not one) answers, reading it gives server
states or a one-line :class:`KvbenchError`, never a traceback, and every value on a state is one it can mean.

Text is arbitrary, or near-valid: exposition lines under the very names ``results/servers.py`` reads (kvbench's,
vLLM's, SGLang's), with fuzzed label sets and values (1e308, -1, NaN, +Inf, huge ints, garbage), and the
recorded vLLM page with values replaced. What a value may be is ``results/validity.py``'s table: a share within
0-1, a count finite, at least 0 and at most 2**53, a block size a whole number of tokens, histogram buckets
cumulative, a part never more than its whole.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.measure import metric_names as names
from kvbench.results.exposition import parse_samples
from kvbench.results.servers import ServerState, read_states
from kvbench.results.validity import _SLACK, KINDS, MAX_COUNT

RECORDED = (Path(__file__).parent.parent / "report" / "diagnose" / "data" / "vllm_metrics_busy.txt").read_text()
RECORDED_LINES = RECORDED.splitlines()

KVBENCH = [value for key, value in vars(names).items() if key.isupper() and value.startswith(names.PREFIX)]
KVBENCH += [f"{names.ALLOC_LATENCY}_{part}" for part in ("bucket", "sum", "count")]
VLLM = [
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_sum",
    "vllm:request_generation_tokens_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:cache_config_info",
]
SGLANG = [
    "sglang:token_usage",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:cache_hit_rate",
    "sglang:num_used_tokens",
    "sglang:num_requests_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:max_total_num_tokens",
    "sglang:page_size",
    "sglang:num_retracted_requests_total",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count",
]
NAMES = st.sampled_from(KVBENCH + VLLM + SGLANG) | st.from_regex(r"[a-z_:][a-z0-9_:]{0,12}", fullmatch=True)

NUMBERS = [
    "0",
    "1",
    "-1",
    "0.5",
    "1.5",
    "16",
    "1e308",
    "-1e308",
    "1e-320",
    "NaN",
    "+Inf",
    "-Inf",
    str(2**53 + 1),
    str(10**30),
    "1" * 400,
]
NUMBER_VALUES = st.sampled_from(NUMBERS) | st.floats().map(repr) | st.integers(-(10**20), 10**20).map(str)
GARBAGE = st.sampled_from(["garbage", "0x10", "1_000", "", "1 2", "nan", "inf", "1e", "--1"])
# one bad value refuses a whole page: rare enough that most pages are read
VALUES = st.integers(0, 24).flatmap(lambda pick: GARBAGE if pick == 0 else NUMBER_VALUES)
LABEL_KEYS = st.sampled_from(
    [
        "engine",
        "device",
        "instance",
        "exported_instance",
        "model_name",
        "le",
        "reason",
        "finished_reason",
        "block_size",
        "num_gpu_blocks",
        "num_cpu_blocks",
        "enable_prefix_caching",
        "tp_rank",
        "dp_rank",
        "page_size",
    ]
) | st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,6}", fullmatch=True)
LABEL_VALUES = st.sampled_from(NUMBERS + ["0", "1", "capacity", "length", "abc", ""]) | st.text(max_size=8)


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def lines(draw, names: st.SearchStrategy = NAMES) -> str:
    name = draw(names)
    labels = draw(st.dictionaries(LABEL_KEYS, LABEL_VALUES, max_size=4))
    shown = ",".join(f'{key}="{escaped(value)}"' for key, value in labels.items())
    line = f"{name}{{{shown}}} {draw(VALUES)}" if labels or draw(st.booleans()) else f"{name} {draw(VALUES)}"
    if draw(st.integers(0, 9)) == 0:
        line += f" {draw(st.sampled_from(['1700000000000', '-1', '0', 'x']))}"  # a timestamp, or not one
    return line


# the sample each family's reader needs before it reads an instance at all
ANCHORS = {"kvbench": [names.BLOCKS_CAPACITY], "vllm": VLLM[:3], "sglang": SGLANG[:2]}
FAMILY_NAMES = {"kvbench": KVBENCH, "vllm": VLLM, "sglang": SGLANG}


@st.composite
def family_pages(draw) -> str:
    """Some instances of one or more families: an anchor sample each, then others of their names."""
    out = []
    for family in draw(st.lists(st.sampled_from(sorted(ANCHORS)), min_size=1, max_size=2)):
        out.append(draw(lines(st.sampled_from(ANCHORS[family]))))
        out += draw(st.lists(lines(st.sampled_from(FAMILY_NAMES[family])), max_size=10))
    return "\n".join(draw(st.permutations(out))) + "\n"


COMMENTS = st.builds(
    lambda kind, name, what: f"# {kind} {name} {what}",
    st.sampled_from(["TYPE", "HELP", "EOF", "x"]),
    NAMES,
    st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped", "info", "", "a help text"]),
)


@st.composite
def recorded_with_changes(draw) -> str:
    """The recorded vLLM page with some of its samples' values replaced and some lines dropped."""
    out = []
    for line in RECORDED_LINES:
        if line.startswith("vllm:") and draw(st.integers(0, 7)) == 0:
            if draw(st.booleans()):
                continue
            line = line.rsplit(" ", 1)[0] + " " + draw(VALUES)
        out.append(line)
    return "\n".join(out) + "\n"


EXPOSITIONS = st.one_of(
    family_pages(),
    family_pages(),
    st.lists(lines() | COMMENTS, min_size=1, max_size=14).map(lambda ls: "\n".join(ls) + "\n"),
    st.lists(lines(), min_size=1, max_size=6).map("\n".join),  # without the last newline
    recorded_with_changes(),
    st.text(max_size=200),
    st.sampled_from(["", "\n", "<!doctype html><p>hi", "# EOF\n", "\ufeffvllm:num_requests_running 1\n"]),
)


def read(text: str) -> list[ServerState]:
    """The states of ``text``; [] where it is refused in one line (a KvbenchError), the documented refusal."""
    try:
        samples = parse_samples(text)
    except KvbenchError:
        samples = None
    try:
        states = read_states(text)
    except KvbenchError:
        return []
    assert samples is not None  # what parse_samples refuses, read_states cannot read
    return states


def check_meaning(state: ServerState) -> None:
    """Each value within what validity.py says it can mean, or None."""
    for field, kind in KINDS.items():
        value = getattr(state, field)
        if value is None:
            continue
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), (field, value)
        if kind == "share":
            assert -_SLACK <= value <= 1 + _SLACK, (field, value)
        else:
            assert 0 <= value <= MAX_COUNT, (field, value)
    if state.block_size is not None:
        assert type(state.block_size) is int and state.block_size >= 1, state.block_size
    if state.total_blocks is not None:
        for part in (state.used_blocks, state.cached_blocks):
            assert part is None or part <= state.total_blocks
    if state.prefix_hits is not None and state.prefix_queries is not None:
        assert state.prefix_hits <= state.prefix_queries
    previous = 0.0
    for le, count in state.alloc_buckets:
        assert not math.isnan(le) and math.isfinite(count) and previous <= count
        previous = count
    assert state.free_share is None or 0 <= state.free_share <= 1
    hit_rate = state.hit_rate
    assert hit_rate is None or math.isfinite(hit_rate)
    assert state.source and isinstance(state.record(), dict)
    assert set(state.invalid) <= {f.name for f in state.__dataclass_fields__.values()}


# A histogram bucket's le label that is no number, and an SGLang page size that is NaN or infinite, were a
# ValueError / OverflowError out of read_states; a whole-number value past a float's range (the parser keeps it an
# int) an OverflowError out of parse_samples.
@settings(max_examples=300, deadline=None)
@given(text=EXPOSITIONS)
@example(text=f'{names.BLOCKS_CAPACITY} 10\n{names.ALLOC_LATENCY}_bucket{{le="abc"}} 1\n')
@example(text="sglang:token_usage 0.5\nsglang:page_size NaN\n")
@example(text="sglang:token_usage 0.5\nsglang:page_size +Inf\n")
@example(text="vllm:num_requests_running " + "9" * 309 + "\n")
def test_any_page_is_states_whose_values_mean_what_they_say_or_a_one_line_error(text):
    for state in read(text):
        check_meaning(state)


# Counters that validity.py's table leaves out: token counters, and the TTFT histogram's sum (seconds) and count.
# The server metrics of a point are their differences, so a NaN or a negative one would be recorded as measured.
@settings(max_examples=150, deadline=None)
@given(text=EXPOSITIONS)
@example(text="vllm:num_requests_running 1\nvllm:prompt_tokens_total NaN\n")
def test_the_counters_outside_the_validity_table_are_counts_too(text):
    for state in read(text):
        for field in ("prompt_tokens", "generation_tokens", "ttft_count", "ttft_sum_s"):
            value = getattr(state, field)
            assert value is None or (math.isfinite(value) and 0 <= value <= MAX_COUNT), (field, value)


def test_a_gauge_given_twice_for_one_engine_is_set_aside_never_summed():
    """30% and 40% for one engine (two models, or a duplicated series) are not a usage of 70%."""
    page = (
        'vllm:kv_cache_usage_perc{model_name="m"} 0.3\n'
        'vllm:kv_cache_usage_perc{model_name="other"} 0.4\n'
        'vllm:num_requests_running{model_name="m"} 3\n'
    )
    (state,) = read_states(page)
    assert state.usage is None and "given 2 times for one engine" in state.invalid["usage"]
    assert state.running == 3


def test_a_binary_page_is_one_line_with_its_bytes_written_out():
    with pytest.raises(KvbenchError) as raised:
        parse_samples("\x00\xff\xfe" * 100)
    said = str(raised.value)
    assert len(said.splitlines()) == 1 and "\x00" not in said and "\\x00" in said and len(said) < 200
