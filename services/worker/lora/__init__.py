"""LoRA adapters in the paged engine: loaded from PEFT's format, mixed in one step (`lora_adapters.py`)."""
