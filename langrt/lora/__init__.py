"""LoRA adapters served beside the base model: many adapters (and none) in one batch.

- `adapter.py`: one PEFT adapter directory read into per-layer low-rank factors.
- `registry.py`: the adapters loaded by name (start-up and run time), and the cap on how many
  different ones one batch may hold.

The model's side lives in langrt/model/: `lora_pass.py` (one forward pass's rows grouped by
adapter, and the low-rank products added to the base projections' outputs) and `lora_layer.py`
(a Llama-family decoder layer's math with those products added).
"""

from langrt.lora.adapter import LoraAdapter, LoraError
from langrt.lora.registry import LoraRegistry

__all__ = ["LoraAdapter", "LoraError", "LoraRegistry"]
