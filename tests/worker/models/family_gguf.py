"""A GGUF file of a tiny random Qwen2, written as llama.cpp's converter lays one out: the
hyperparameters under `qwen2.*`, tensors under GGUF names, and the embedded SmolLM2 GGUF's
tokenizer (vocabulary, merges, chat template) copied field by field."""

from __future__ import annotations

import gguf
import torch

from ztgi.bench.random_gguf import copy_tokenizer
from ztgi.common.model_source import embedded_gguf_path

TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def write_qwen2_gguf(model: torch.nn.Module, path: str) -> None:
    config = model.config
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    copy_tokenizer(writer, embedded_gguf_path())
    for name, tensor in model.state_dict().items():
        writer.add_tensor(_gguf_name(name), tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gguf_name(name: str) -> str:
    if name in TENSOR_NAMES:
        return TENSOR_NAMES[name]
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{LAYER_NAMES[rest]}"

