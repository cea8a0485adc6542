"""PEFT LoRA adapters for tests: written by peft itself onto a checkpoint in tmp_path, with
random non-zero A and B (peft's own init makes B zero, an adapter that changes nothing)."""

from __future__ import annotations

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_hf(base) -> "torch.nn.Module":
    """The transformers model of an HF directory or a .gguf file (dequantized), float32."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    base = Path(base)
    if base.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(base.parent, gguf_file=base.name, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()


def write_adapter(base_dir, out_dir, seed: int, rank: int = 4, alpha: int = 8, targets=TARGETS, scale: float = 0.3):
    """Save a peft adapter for the HF checkpoint at `base_dir` into `out_dir`; -> out_dir."""
    from peft import LoraConfig, get_peft_model

    model = load_hf(base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(scale * torch.randn(param.shape, generator=gen))
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def merged_greedy(base_dir, adapter_dir, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy output with the adapter merged into the weights (None: the base)."""
    model = load_hf(base_dir)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         min_new_tokens=new_tokens, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()
