"""Small Qwen3-MoE models for the Megatron tests, their weights under the per-expert names checkpoints hold, and
the HF side of megatron-core's router losses."""

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from workers.moe_router_loss import load_balance_loss, router_source


def qwen3_moe(
    folder=None, norm_topk_prob: bool = True, tied: bool = False, layers: int = 4, experts: int = 4
) -> Qwen3MoeForCausalLM:
    """`experts` experts of width 32, 2 active; 4 query / 2 key-value heads (so TP=2 splits them); saved to `folder` if
    given."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=experts,
        num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=tied, dtype="float32",
        pad_token_id=0,
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # routers start near uniform; spread them so top-2 choices are clear-cut
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=0.5)
    if folder is not None:
        model.save_pretrained(folder)
    return model


def per_expert_state(model: Qwen3MoeForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors under checkpoint names: transformers fuses the experts in memory
    (`mlp.experts.gate_up_proj` [E, 2F, H] = per expert [gate; up], `mlp.experts.down_proj` [E, H, F])."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e, fused in enumerate(tensor):
                gate, up = torch.chunk(fused, 2, dim=0)
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate.clone(), up.clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e, down in enumerate(tensor):
                out[f"{prefix}{e}.down_proj.weight"] = down.clone()
        else:
            out[name] = tensor.clone()
    return out


class HFRouterLosses:
    """The HF model's side of the router losses: each training forward's router logits (hooks), turned into the
    load-balancing loss of the FSDP workers (workers/moe_router_loss.py) and megatron-core's z-loss, over real tokens.
    Under sequence parallelism over `sequence_shards` TP ranks megatron-core takes the z-loss's mean over each rank's
    part of the sequence and averages those means (uneven padding weighs the parts unevenly): so does this."""

    def __init__(self, model, settings: dict, sequence_shards: int = 1) -> None:
        self.sequence_shards = sequence_shards
        router_class, self.index = router_source(model)
        self.settings, self.top_k, self.logits = settings, model.config.num_experts_per_tok, []
        self.aux: list[float] = []  # per micro-batch: the load-balancing loss averaged over layers
        self.z: list[float] = []  # and the z-loss likewise
        for module in model.modules():
            if isinstance(module, router_class):
                module.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        if torch.is_grad_enabled():
            self.logits.append(output[self.index])

    def __call__(self, attention_mask: torch.Tensor) -> torch.Tensor:
        layers, self.logits = self.logits, []
        real = attention_mask.reshape(-1).float()
        balance = torch.stack([load_balance_loss([logits], self.top_k, real) for logits in layers])
        z = torch.stack([self._z_loss(logits, attention_mask) for logits in layers])
        self.aux.append(float(balance.detach().mean()))
        self.z.append(float(z.detach().mean()))
        scale = 1 / len(layers) if self.settings.get("averaged_over_layers") else 1.0
        loss = self.settings["aux_loss_coeff"] * scale * balance.sum()
        return loss + self.settings.get("z_loss_coeff", 0.0) * z.sum()

    def _z_loss(self, logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows, length = attention_mask.shape
        squares = torch.logsumexp(logits.float(), -1).square().reshape(rows, length)
        real = attention_mask.float()
        parts = zip(squares.chunk(self.sequence_shards, dim=1), real.chunk(self.sequence_shards, dim=1))
        return torch.stack([(part * mask).sum() / mask.sum() for part, mask in parts]).mean()
