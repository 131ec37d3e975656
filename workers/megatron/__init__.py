"""megatron-core backend (in progress): Hugging Face <-> Megatron GPT weight layouts and their parallel splits."""
