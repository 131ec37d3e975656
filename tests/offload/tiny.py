"""A tiny FSDP2-sharded Qwen2 with AdamW, as the actor holds it, and what the offload tests compare."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import Qwen2Config, Qwen2ForCausalLM

from workers.fsdp.model_loading import transformer_layers
from workers.fsdp.wrap import device_mesh

# Odd vocabulary and MLP widths: over 2 ranks the embedding, head and MLP shards are uneven (padded).
UNEVEN = dict(vocab_size=67, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=98, max_position_embeddings=64, tie_word_embeddings=False)
# ~1.8M parameters: a leak of one copy of the state per round trip would show in the process's memory.
LEAK_CHECK = dict(UNEVEN, vocab_size=1001, hidden_size=256, intermediate_size=514)


def sharded_model(config: dict, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Each decoder layer and the root sharded over the default process group (CPU), float32, AdamW."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**config, attn_implementation="eager"))
    mesh = device_mesh(torch.device("cpu"))
    for layer in transformer_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def sharded_lora(model: torch.nn.Module, spec: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`model` with LoRA adapters (`spec`: a workers.lora.spec.LoraSpec), B drawn at random (B = 0 would make the first
    step's base irrelevant to the loss), each decoder layer and the root sharded as above; AdamW over the adapters."""
    from workers.lora.model import add_lora_adapters

    add_lora_adapters(model, spec)
    for name, param in model.named_parameters():
        if ".lora_B." in name:
            torch.nn.init.normal_(param, std=0.1)
    mesh = device_mesh(torch.device("cpu"))
    for layer in transformer_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> float:
    """One forward/backward/step on a seeded batch; returns the loss."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (3, 10), generator=generator)
    logits = model(input_ids=ids).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Copies of every local parameter shard, buffer and optimizer state tensor."""
    state = {f"param/{n}": local(p).detach().clone() for n, p in model.named_parameters()}
    state.update({f"buffer/{n}": b.clone() for n, b in model.named_buffers()})
    names = {id(p): n for n, p in model.named_parameters()}
    for param, values in optimizer.state.items():
        state.update({f"optim/{names[id(param)]}/{k}": local(v).clone() for k, v in values.items()})
    return state


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in any bit, dtype or shape (or are missing on one side)."""
    return sorted(n for n in a.keys() | b.keys()
                  if n not in a or n not in b or a[n].dtype != b[n].dtype or not torch.equal(a[n], b[n]))


def tensor_objects(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameter and optimizer state objects (identity must survive a round trip)."""
    return [*model.parameters(), *(v for s in optimizer.state.values() for v in s.values())]


def device_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the storages behind the local shards and the non-scalar optimizer state."""
    tensors = [local(p) for p in model.parameters()]
    tensors += [local(v) for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
