"""Remedies are keys rendered per engine family: each family hears about its own knobs only, and a kvbench run
hears about the flags of the command that made it, checked against that command's own option parser."""

from __future__ import annotations

import importlib
import re
from functools import cache

import pytest
import typer

from kvbench.cli import COMMANDS
from kvbench.report.diagnose.remedies import REMEDIES, phrase, render

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
RUN_COMMANDS = ("sweep", "waste", "share", "fleet", "serve", None)  # None: a live kvbench server
CONTEXT = {
    "block_size": 16,
    "gpu_memory_utilization": "0.9",
    "kv_cache_memory_bytes": "1024",
    "max_len": 2048,
    "reserve": "max",
}


@cache
def options_of(command: str) -> frozenset[str]:
    """The long options kvbench COMMAND's own parser accepts."""
    app = typer.Typer()
    importlib.import_module(COMMANDS[command].module).register(app)
    return frozenset(o for p in typer.main.get_command(app).params for o in p.opts if o.startswith("--"))


def flags_by_command(text: str, command: str) -> list[tuple[str, str]]:
    """Each flag a suggestion names with the command it belongs to: the run's, or the one the clause names
    ("kvbench fleet --policies ...", "start kvbench serve with --block-size")."""
    out = []
    for clause in re.split(r"; |\(", text):
        named = re.search(r"kvbench (\w+)", clause)
        for flag in FLAG.findall(clause):
            out.append((named.group(1) if named else command, flag))
    return out


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=lambda c: c or "server")
def test_every_kvbench_suggestion_parses_with_the_command_it_advises(command):
    """Advice a user cannot act on is worse than none: `waste` was told to use --kv-memory, --engines and
    --reserve, which it does not accept."""
    context = {**CONTEXT, "command": command}
    for key, by_family in REMEDIES.items():
        if "kvbench" not in by_family:
            continue
        text = phrase(key, "kvbench", context)
        if text is None:  # no such knob for this command: left out, never another command's flag
            continue
        for owner, flag in flags_by_command(text, command or "serve"):
            assert flag in options_of(owner), (key, command, owner, flag, text)


def test_a_waste_run_is_told_only_what_waste_accepts():
    context = {**CONTEXT, "command": "waste"}
    text = render(("more_kv_memory", "layout", "route_to_free"), "kvbench", context)
    assert "--kv-memory" not in text and "--engines" not in text and "--reserve" not in text
    assert "route" not in text  # one engine, no router
    assert "--max-len" in text and "--gpu-memory-utilization" in text


FAMILY_FLAGS = {
    "vllm": {
        "--gpu-memory-utilization",
        "--kv-cache-memory-bytes",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--block-size",
        "--enable-prefix-caching",
        "--tensor-parallel-size",
    },
    "sglang": {
        "--mem-fraction-static",
        "--context-length",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--page-size",
        "--disable-radix-cache",
        "--tp-size",
        "--max-prefill-tokens",
    },
}


@pytest.mark.parametrize("family", sorted(FAMILY_FLAGS))
def test_every_phrase_names_only_its_own_familys_flags(family):
    context = {
        "block_size": 16,
        "gpu_memory_utilization": "0.9",
        "kv_cache_memory_bytes": "1024",
        "max_len": 2048,
        "reserve": "max",
    }
    for key, by_family in REMEDIES.items():
        if family not in by_family:
            continue
        text = phrase(key, family, context)
        assert text and text == text.strip()
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text))
        assert flags <= FAMILY_FLAGS[family], (key, flags - FAMILY_FLAGS[family])


def test_render_joins_what_the_family_has_and_quotes_its_settings():
    assert render(("more_kv_memory", "layout"), "vllm", {"gpu_memory_utilization": "0.92"}) == (
        "give the KV cache more memory: raise --gpu-memory-utilization (now 0.92) or set --kv-cache-memory-bytes, "
        "or free memory with a lower --max-model-len"
    )  # vLLM has no contiguous layout to change
    assert "(now" not in render(("smaller_blocks",), "vllm", {})  # unknown settings are not quoted as "?"
    assert (
        render(("smaller_blocks",), "kvbench", {"block_size": 32, "command": "sweep"})
        == "use a smaller --block-size (now 32; 16-32 work best)"
    )
    assert render(("smaller_blocks",), "kvbench", {"block_size": 32}).startswith(
        "start kvbench serve with a smaller --block-size"
    )  # a live server is told how to start it
    with pytest.raises(KeyError):
        phrase("bogus", "vllm")
