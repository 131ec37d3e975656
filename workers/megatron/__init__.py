"""megatron-core backend (`actor.strategy=megatron`): Hugging Face <-> Megatron GPT weight layouts and their
parallel splits."""
