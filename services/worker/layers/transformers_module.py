"""The types of a `transformers` model, its submodules and its config, as the worker reads them.

Their attributes (`config.num_attention_heads`, `model.layers`, `self_attn.q_proj`) depend on the
architecture and are set at run time, which no static type can list: code that walks a module
tree or a config by attribute names takes these, and checks what it needs at run time
(`models/llama_weights.py`'s `supports`, `models/families.py`).
"""

from typing import Any, TypeAlias

TransformersModule: TypeAlias = Any
TransformersConfig: TypeAlias = Any
