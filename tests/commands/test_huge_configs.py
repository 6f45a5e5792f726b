"""A config with counts no model has is refused at once, in one line: layer and head counts are walked one by one,
so 1e9 layers or 2**40 heads would otherwise run for minutes."""

from __future__ import annotations

import json
import time

import pytest

from kvbench.cli import main
from kvbench.models.deployment import _divisors

BASE = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"num_attention_heads": 2**40, "num_key_value_heads": 2**40, "hidden_size": 2**47}, "num_attention_heads"),
        ({"num_attention_heads": 2**17, "num_key_value_heads": 2**17, "hidden_size": 2**20}, "num_attention_heads"),
        ({"hidden_size": 2**30}, "hidden_size"),
        ({"vocab_size": 10**12}, "vocab_size"),
        (  # a DeepSeek reader listed its MoE layers one by one before any limit held
            {
                "model_type": "deepseek_v3",
                "num_hidden_layers": 10**9,
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128,
                "v_head_dim": 128,
                "n_routed_experts": 256,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048,
            },
            "num_hidden_layers",
        ),
    ],
)
def test_counts_no_model_has_are_refused_at_once(change, field, tmp_path, capfd):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **change}))
    start = time.monotonic()
    assert main(["capacity", "--model", str(tmp_path), "--json"]) == 2
    assert time.monotonic() - start < 30
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and field in err and "broken config" in err


def test_a_large_real_shape_still_works(tmp_path, capfd):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                **BASE,
                "num_hidden_layers": 126,
                "hidden_size": 16384,
                "num_attention_heads": 128,
                "intermediate_size": 53248,
            }
        )
    )
    assert main(["capacity", "--model", str(tmp_path), "--gpu", "h100-80g", "-tp", "8", "--json"]) in (0, 1)


@pytest.mark.parametrize("value", [1, 2, 12, 97, 360, 2**20, 2**40])
def test_divisors(value):
    expected = [d for d in range(1, min(value, 10**6) + 1) if value % d == 0] if value <= 10**6 else None
    found = _divisors(value)
    if expected is not None:
        assert found == expected
    assert found[0] == 1 and found[-1] == value and all(value % d == 0 for d in found)
    if value == 2**40:
        assert found == [2**k for k in range(41)]


@pytest.mark.parametrize("name", ["owner/n\u00e4me", "\u00f6wner/name"])
def test_a_non_ascii_hub_id_is_one_line(name, capfd, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["capacity", "--model", name]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err


def test_an_eos_outside_the_vocabulary_is_refused(tmp_path, capfd):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "eos_token_id": 128256}))
    assert main(["capacity", "--model", str(tmp_path), "--json"]) == 2
    err = capfd.readouterr().err.strip()
    assert "eos_token_id 128256 is outside its vocabulary of 128,256 ids" in err and len(err.splitlines()) == 1
