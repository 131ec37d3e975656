"""verl's Megatron offload switches (workers/megatron/offload.py) under the workers' residency policy, moved for
real on CPU (megatron-core over gloo, real Ray workers): what leaves the device when, and that a bf16 actor with its
float32 main weights, gradient buffers and Adam state round-tripping through host memory computes exactly what the
same actor computes with everything kept in place."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

pytest.importorskip("megatron.core", reason="install the [megatron] extra")

PROMPT, RESPONSE = 6, 5


def _model_folder(folder, num_hidden_layers: int = 2) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return str(folder)


def _batch() -> dict:
    torch.manual_seed(1)
    ids = torch.randint(1, 100, (4, PROMPT + RESPONSE))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:], "response_mask": mask[:, PROMPT:]}


@pytest.mark.parametrize("dp, dist_opt", [(2, True), (1, False)], ids=["dp2-distributed-optimizer", "dp1"])
def test_offloaded_state_leaves_between_phases_and_the_steps_are_unchanged(megatron_probes, tmp_path, dp, dist_opt):
    folder = _model_folder(tmp_path)
    with megatron_probes(dp) as group:
        (kept,) = [r for r in group.offload_round_trip(folder, dp, dist_opt, _batch(), False) if r is not None]
        (moved,) = [r for r in group.offload_round_trip(folder, dp, dist_opt, _batch(), True) if r is not None]
    # Bit for bit: the same storages come back with the same bytes, views and optimizer references intact.
    for key in ("old", "ref"):
        for step in range(2):
            assert torch.equal(moved[key][step], kept[key][step]), (key, step)
    assert moved["grad_norm"] == kept["grad_norm"]
    assert torch.equal(moved["final"], kept["final"])
    assert not torch.equal(kept["final"], kept["old"][0])  # the two steps moved the weights

    held = kept["start"]
    assert min(held.values()) > 0
    assert held["grads"] == 2 * held["weights"] or dist_opt  # float32 buffers of bf16 weights (padded with dp > 1)
    # Before the engine starts: the weights, gradient buffers, main weights (no Adam state yet) and reference gone.
    assert moved["start"] == {"weights": 0, "grads": 0, "optimizer": 0, "ref": 0}
    for step in range(2):
        # after the optimizer step: weights and gradient buffers in, the optimizer's state out, the reference out
        assert moved["after_step"][step] == {**kept["after_step"][step], "optimizer": 0, "ref": 0}
        # the hybrid engine's claim: everything configured leaves
        assert moved["generating"][step] == {"weights": 0, "grads": 0, "optimizer": 0, "ref": 0}
        assert kept["generating"][step] == kept["after_step"][step]
        assert kept["moves"][step] == {}  # nothing configured: no offload metrics
    # Adam's moments exist after the first step: the optimizer's storages grew (main weights + 2 moments)
    assert kept["after_step"][0]["optimizer"] > held["optimizer"]
    # Moves since step 1's end: weights and gradient buffers out at the engine's claim, the weights back for the
    # old log-probs and the gradient buffers at zero_grad; the optimizer's state in and out around the step only;
    # the reference in and out around its pass.
    step_two = moved["moves"][1]
    assert step_two["offload/update_actor/actor_params_moves"] == 2
    assert step_two["offload/update_actor/actor_grads_moves"] == 2
    assert step_two["offload/update_actor/actor_optimizer_moves"] == 2
    assert step_two["offload/update_actor/ref_params_moves"] == 2
    assert step_two["offload/update_actor/h2d_gib"] > 0 and step_two["offload/update_actor/d2h_gib"] > 0
