"""Padding-free (packed) forward passes and token-budget micro-batches, shared by the FSDP workers."""
