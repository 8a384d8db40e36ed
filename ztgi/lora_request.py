"""`LoRARequest`: vLLM's name for "generate with this adapter", as `LLM.generate(lora_request=...)` takes it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter in PEFT's format in directory `lora_path`, known as `lora_name`
    (`lora_int_id` is vLLM's numeric id: accepted, the name identifies it here)."""

    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must name the adapter's directory, got {self.lora_path!r}")
