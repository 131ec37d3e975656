"""Routing replay of a mixture of experts (verl's R2 / R3): docs/moe.md."""
