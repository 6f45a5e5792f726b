"""GGUF files: the header and shape read without weights, bad files refused in one line, and kvbench's engines
emitting the same greedy tokens as transformers loading the same file. The files are written here."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvbench.cli import main
from kvbench.engine.config import EngineConfig
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.models.gguf_file import gguf_fingerprint, is_gguf, read_gguf_header, shape_from_gguf
from kvbench.models.resolve import resolve_model

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from gguf_fixture import EOS_ID, tiny_shape, vocabulary, write_tiny_gguf  # noqa: E402


def test_shape_comes_from_the_header(tiny_gguf):
    path, _ = tiny_gguf
    shape = shape_from_gguf(path)
    want = tiny_shape(len(vocabulary()))
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (
        2,
        64,
        4,
        2,
        16,
    )
    assert (shape.intermediate_size, shape.vocab_size, shape.max_position_embeddings) == (96, want.vocab_size, 512)
    assert shape.tie_word_embeddings and shape.eos_token_id == EOS_ID and shape.dtype == "fp32"
    assert shape.num_parameters == want.num_parameters
    assert resolve_model(str(path)).name == "tiny" and is_gguf(path)
    header = read_gguf_header(path)
    assert header.architecture == "llama" and len(header.tensors) == 2 + 9 * 2
    assert gguf_fingerprint(path) == gguf_fingerprint(path)


def test_waste_and_capacity_read_a_gguf_model_without_loading_weights(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    assert (
        main(["capacity", "--model", str(path), "--gpu", "l4-24g", "--max-len", "512", "--mean-len", "100", "--json"])
        == 0
    )
    assert '"vocab_size": 267' in capsys.readouterr().out


def test_a_truncated_gguf_is_one_line(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    data = path.read_bytes()
    for cut in (20, 300, len(data) - 100):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(KvbenchError, match="truncated GGUF file"):
            shape_from_gguf(short)
    assert (
        main(
            [
                "sweep",
                "--model",
                str(tmp_path / f"cut{len(data) - 100}.gguf"),
                "--scenario",
                "ci-smoke",
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: truncated GGUF file")


def test_not_a_gguf_and_unsupported_architectures_are_refused(tmp_path, capsys):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(KvbenchError, match="is not a GGUF file"):
        shape_from_gguf(fake)
    other = tmp_path / "bert.gguf"
    write_tiny_gguf(other, architecture="bert", tokenizer=False)
    assert main(["sweep", "--model", str(other), "--scenario", "ci-smoke", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unsupported architecture 'bert'" in err[0]


def test_missing_packages_name_the_extra(tiny_gguf, monkeypatch, capsys):
    path, _ = tiny_gguf
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert main(["sweep", "--model", str(path), "--scenario", "ci-smoke", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: loading a GGUF file needs the gguf package: pip install 'kvbench[gguf]'"]


def test_weights_and_tokenizer_load_as_written(tiny_gguf):
    from kvbench.studies.local_model import load_model

    path, source = tiny_gguf
    loaded = load_model(str(path), "cpu")
    assert loaded.real_weights and loaded.can_stop_at_eos and EOS_ID in loaded.stop_token_ids
    for (name, want), got in zip(source.named_parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(want, got), name
    ids = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "the heat"}], tokenize=False, add_generation_prompt=True
    )
    assert ids.startswith("<|im_start|>user\nthe heat<|im_end|>")


@pytest.mark.parametrize("engine", ["paged", "contiguous"])
def test_engines_emit_the_greedy_tokens_of_transformers_on_the_same_file(tiny_gguf, engine):
    from transformers import AutoModelForCausalLM

    from kvbench.studies.local_model import build_engine, load_model

    path, _ = tiny_gguf
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    loaded = load_model(str(path), "cpu")
    prompts = [loaded.tokenizer(text)["input_ids"] for text in ("the heat", "in the other", "a")]
    llm = build_engine(loaded, EngineConfig(engine=engine, block_size=4, num_blocks=64, max_len=64))
    got = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for prompt, tokens in zip(prompts, got, strict=True):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=12,
                do_sample=False,
                min_new_tokens=12,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert tokens == out[0, len(prompt) :].tolist()
    # with EOS: each answer is the reference's, cut after the first EOS
    stopped = llm.generate(prompts, SamplingParams(max_tokens=12, eos_token_id=tokens_of(got)))
    for full, cut in zip(got, stopped, strict=True):
        eos = tokens_of(got)
        assert cut == (full[: full.index(eos) + 1] if eos in full else full)


def tokens_of(outputs: list[list[int]]) -> int:
    """A token the model emits mid-answer, used as a stand-in EOS (random weights rarely pick the real one)."""
    counts: dict[int, int] = {}
    for tokens in outputs:
        for token in tokens[1:-1]:
            counts[token] = counts.get(token, 0) + 1
    return max(counts, key=counts.get)


# ------------------------------------------------------------------------------------------------ weight bytes


def test_ggml_block_layouts_match_the_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES

    from kvbench.models.gguf_file import GGML_TYPES

    theirs = {kind.value: sizes for kind, sizes in GGML_QUANT_SIZES.items()}
    assert {kind: (block, size) for kind, (_, block, size) in GGML_TYPES.items()} == {
        kind: theirs[kind] for kind in GGML_TYPES
    }


def test_weight_bytes_of_a_mixed_quantization_file(tmp_path):
    """Q8_0 MLP, Q4_0 attention, F16 embeddings and LM head, F32 norms (the way llama.cpp mixes types):
    the bytes kvbench counts equal the bytes each tensor takes between its offset and the next one's."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    from kvbench.models.gguf_file import tensor_nbytes

    path = tmp_path / "mixed.gguf"
    hidden, inter, layers, vocab = 64, 128, 2, 300
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (
        ("block_count", layers),
        ("context_length", 512),
        ("embedding_length", hidden),
        ("feed_forward_length", inter),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("vocab_size", vocab),
    ):
        writer.add_uint32(f"llama.{key}", value)
    rng = np.random.default_rng(0)

    def add(name: str, rows: int, cols: int, kind: T) -> None:
        data = rng.standard_normal((rows, cols)).astype(np.float32)
        if kind == T.F32:
            writer.add_tensor(name, data)
        elif kind == T.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)

    add("token_embd.weight", vocab, hidden, T.F16)
    add("output.weight", vocab, hidden, T.F16)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        add(f"blk.{i}.attn_q.weight", hidden, hidden, T.Q4_0)
        add(f"blk.{i}.attn_k.weight", 32, hidden, T.Q4_0)
        add(f"blk.{i}.attn_v.weight", 32, hidden, T.Q4_0)
        add(f"blk.{i}.attn_output.weight", hidden, hidden, T.Q4_0)
        for name in ("ffn_gate", "ffn_up"):
            add(f"blk.{i}.{name}.weight", inter, hidden, T.Q8_0)
        add(f"blk.{i}.ffn_down.weight", hidden, inter, T.Q8_0)
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_gguf_header(path)
    shape = shape_from_gguf(path)
    q4 = lambda n: n // 32 * 18  # noqa: E731 - 18 bytes per 32 weights
    q8 = lambda n: n // 32 * 34  # noqa: E731
    per_layer = q4(64 * 64) * 2 + q4(32 * 64) * 2 + q8(128 * 64) * 3 + 2 * 64 * 4
    by_hand = 2 * vocab * hidden * 2 + hidden * 4 + layers * per_layer
    assert shape.weight_bytes == by_hand == sum(tensor_nbytes(t) for t in header.tensors)
    ends = sorted(t.offset for t in header.tensors)[1:] + [header.file_size - header.data_start]
    for tensor, end in zip(sorted(header.tensors, key=lambda t: t.offset), ends, strict=True):
        assert -(-tensor_nbytes(tensor) // 32) * 32 == -(-(end - tensor.offset) // 32) * 32  # aligned extents
    assert "Q8_0" in shape.weight_format.describe() and shape.num_parameters * 2 > shape.weight_bytes


def test_metadata_arrays_nested_past_any_model_are_refused_in_one_line(tmp_path):
    """A header of arrays within arrays, 10,000 deep: refused before the reader recurses that far."""
    import struct

    key = b"general.nested"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
    nested = struct.pack("<IQ", 9, 1) * 10_000 + struct.pack("<IQ", 0, 0)
    path = tmp_path / "nested.gguf"
    path.write_bytes(header + nested)
    with pytest.raises(KvbenchError, match="metadata arrays nested deeper than 8 levels"):
        shape_from_gguf(path)


def test_an_architecture_list_of_objects_is_no_architecture(tmp_path):
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "architectures": [{"a": 1}, ["LlamaForCausalLM"]],
    }
    from kvbench.models.hf_config import model_type_of

    assert model_type_of(config) == "llama"  # the default, as for a config that names none
