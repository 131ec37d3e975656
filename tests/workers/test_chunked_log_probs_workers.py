"""Two FSDP2 ranks through the Ray worker group: the chunked LM-head log-probs (a few tokens a chunk) give the
same old and reference log-probs, entropies and PPO update (entropy bonus and KL loss on; tied embeddings, so
the head's gradient joins the embedding's) as the full logits."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from tests.packing.test_packed_forward import rollout_batch
from tests.workers.helpers import actor_config, make_group
from workers.fsdp import ActorRolloutRefWorker

PROMPTS = [9, 8, 2, 7, 3, 5, 1, 6]
RESPONSES = [12, 3, 11, 10, 2, 7, 9, 4]


def _batch():
    data = rollout_batch(PROMPTS, RESPONSES, seed=11)
    generator = torch.Generator().manual_seed(12)
    shape = data.batch["responses"].shape
    data.batch["old_log_probs"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    data.batch["advantages"] = torch.randn(len(data), 1, generator=generator).expand(shape).contiguous()
    return data


def _run(pool, model_dir: str, chunk: int, packed: bool, export: str) -> dict[str, torch.Tensor]:
    config = actor_config(
        model_dir,
        model={"logits_chunk_tokens": chunk, "use_remove_padding": packed},
        actor={"ppo_mini_batch_size": len(PROMPTS), "ppo_micro_batch_size_per_gpu": 2, "entropy_coeff": 0.01,
               "use_kl_loss": True, "optim": {"eps": 1e-4}},  # eps: see test_packing_workers.py
        rollout={"temperature": 0.8},
    )
    group = make_group(pool, ActorRolloutRefWorker, config, "actor_rollout_ref")
    try:
        data = _batch()
        old = group.compute_log_prob(data)
        ref = group.compute_ref_log_prob(data)
        data.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
        group.update_actor(data)
        group.export_hf(export)
    finally:
        group.kill()
    return {key: out.batch[key] for out, key in ((old, "old_log_probs"), (old, "entropys"), (ref, "ref_log_prob"))}


def test_two_ranks_chunked_log_probs_and_update_equal_the_full_logits(pool_2, tiny_model_dir, tmp_path):
    mask = _batch().batch["response_mask"].bool()
    full = _run(pool_2, tiny_model_dir, 0, packed=True, export=str(tmp_path / "full"))
    results = {"packed": _run(pool_2, tiny_model_dir, 5, packed=True, export=str(tmp_path / "packed")),
               "padded": _run(pool_2, tiny_model_dir, 7, packed=False, export=str(tmp_path / "padded"))}
    want = load_file(tmp_path / "full" / "model.safetensors")
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert max(float((want[k] - initial[k]).abs().max()) for k in initial) > 1e-4  # the step changed the weights
    for name, outputs in results.items():
        for key in ("old_log_probs", "entropys", "ref_log_prob"):
            torch.testing.assert_close(outputs[key][mask], full[key][mask], atol=1e-5, rtol=0, msg=f"{name} {key}")
        got = load_file(tmp_path / name / "model.safetensors")
        for key in want:
            torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=0, msg=f"{name} {key}")
