"""Tiny GGUF files written by the tests themselves (with the ``gguf`` package): a random Llama, its weights laid out
as llama.cpp writes them, and a small byte-level BPE tokenizer with a ChatML template. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2; <|im_end|> is EOS
EOS_ID = 2
MERGES = ["h e", "t h", "Ġ t", "Ġ a", "i n", "e r", "Ġt he", "o n"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_alphabet() -> list[str]:
    """The 256 printable characters a byte-level BPE spells bytes with (GPT-2's table, rebuilt here)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    table = dict(zip(printable, codes, strict=True))
    return [chr(table[byte]) for byte in range(256)]


def vocabulary() -> list[str]:
    tokens = SPECIALS + byte_alphabet()
    tokens += ["".join(merge.split(" ")) for merge in MERGES]
    return tokens


def tiny_shape(vocab_size: int, tied: bool = True) -> ModelShape:
    return ModelShape(
        "gguf-tiny",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        dtype="fp32",
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        eos_token_id=EOS_ID,
    )


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved per rotary pair; transformers undoes this when it loads."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_tiny_gguf(
    path: Path, seed: int = 0, architecture: str = "llama", tied: bool = True, tokenizer: bool = True
) -> torch.nn.Module:
    """A random Llama written as a GGUF file at ``path`` (F32 tensors); returns the source model."""
    import gguf

    tokens = vocabulary()
    shape = tiny_shape(len(tokens), tied)
    model = build_random_model(shape, seed=seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    arch = architecture
    writer.add_name("gguf-tiny")
    writer.add_uint32(f"{arch}.block_count", shape.num_layers)
    writer.add_uint32(f"{arch}.context_length", shape.max_position_embeddings)
    writer.add_uint32(f"{arch}.embedding_length", shape.hidden_size)
    writer.add_uint32(f"{arch}.feed_forward_length", shape.intermediate_size)
    writer.add_uint32(f"{arch}.attention.head_count", shape.num_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", shape.num_kv_heads)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_norm_eps)
    writer.add_uint32(f"{arch}.rope.dimension_count", shape.head_dim)
    writer.add_uint32(f"{arch}.vocab_size", shape.vocab_size)
    writer.add_file_type(0)  # all F32
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
        writer.add_token_merges(MERGES)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(EOS_ID)
        writer.add_pad_token_id(EOS_ID)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)
    state = {name: p.detach().float().numpy() for name, p in model.state_dict().items()}
    heads, kv_heads = shape.num_heads, shape.num_kv_heads
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not tied:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "self_attn.v_proj": "attn_v",
    }
    for layer in range(shape.num_layers):
        prefix = f"model.layers.{layer}."
        writer.add_tensor(
            f"blk.{layer}.attn_q.weight", _llama_cpp_permute(state[prefix + "self_attn.q_proj.weight"], heads)
        )
        writer.add_tensor(
            f"blk.{layer}.attn_k.weight", _llama_cpp_permute(state[prefix + "self_attn.k_proj.weight"], kv_heads)
        )
        for hf, ours in names.items():
            writer.add_tensor(f"blk.{layer}.{ours}.weight", state[f"{prefix}{hf}.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
