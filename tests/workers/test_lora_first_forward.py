"""A bf16 LoRA actor whose first forward is its reference pass (adapters disabled): what runs first when the old
log-prob pass is skipped (`old_log_prob_pass=auto`) and the rollout engine is not the actor's own model (vLLM).
peft clears the adapters' requires_grad while they are disabled; the update that follows must still reduce the
float32 factors' gradients in float32 and step exactly as it does when the update runs first (CPU, one rank in
this process; on a GPU this was a RuntimeError in FSDP2's reduce at 7B)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.packing.test_packed_forward import rollout_batch
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.lora.model import adapters_disabled
from workers.lora.spec import is_adapter_parameter
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.dist_utils import single_process_group
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates

PROMPTS = [9, 3, 6, 2, 7, 4]
RESPONSES = [12, 2, 5, 9, 1, 12]


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(torch.device("cpu")):
        yield


def _update(model_dir: str, reference_first: bool) -> tuple[float, dict[str, torch.Tensor], dict[str, torch.dtype]]:
    config = actor_rollout_ref_config(
        {
            "model": {"path": model_dir, "dtype": "bfloat16", "lora_rank": 4, "lora_alpha": 8},
            "actor": {
                "optim": {"lr": 1e-2, "weight_decay": 0.0},
                "ppo_mini_batch_size": len(PROMPTS),
                "ppo_micro_batch_size_per_gpu": 2,
                "use_kl_loss": False,
            },
        }
    )
    actor_cfg = config["actor"]
    engine = FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=actor_cfg["optim"])
    data = rollout_batch(PROMPTS, RESPONSES, seed=5)
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(6))
    if reference_first:
        with adapters_disabled(engine.module), torch.no_grad():
            response_log_probs_and_entropy(engine.module, data, engine.device, 1.0, with_entropy=False)
    grad_dtypes: dict[str, torch.dtype] = {}
    for name, param in engine.module.named_parameters():
        if is_adapter_parameter(name):
            param.register_post_accumulate_grad_hook(lambda p, name=name: grad_dtypes.__setitem__(name, p.grad.dtype))
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    metrics = run_ppo_updates(
        engine,
        data,
        actor_forward(actor_cfg, 1.0),
        lambda outputs, micro: actor_loss(outputs, micro, actor_cfg),
        schedule,
        "update_actor",
    )
    weights = {name: p.detach().full_tensor().float().clone() for name, p in engine.module.named_parameters()}
    return metrics["grad_norm"], weights, grad_dtypes


def test_update_after_a_reference_first_forward(tiny_model_dir, process_group):
    norm_first, after_update_first, _ = _update(tiny_model_dir, reference_first=False)
    norm_ref, after_ref_first, grad_dtypes = _update(tiny_model_dir, reference_first=True)
    assert grad_dtypes and set(grad_dtypes.values()) == {torch.float32}, grad_dtypes
    assert norm_ref > 0 and norm_ref == pytest.approx(norm_first, rel=1e-6)
    for name, value in after_ref_first.items():
        torch.testing.assert_close(value, after_update_first[name], rtol=0, atol=0)
