"""LoRA fine-tuning of the FSDP actor: the adapter's description (`LoraSpec`), adapters on an HF model, and
the vLLM side that takes an adapter from tensors in memory (docs/lora.md)."""

from workers.lora.spec import LoraSpec

__all__ = ["LoraSpec"]
