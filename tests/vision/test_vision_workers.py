"""The FSDP actor/rollout/ref worker with a vision-language model on 2 ranks: HF generate with the batch's
pictures, log-probs equal to a plain padded forward of the same model with the same pictures (the workers run
packed), the pictures' pixels stay on the workers, and an update trains on them."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText

from single_controller.ray import RayResourcePool
from tests.vision.images import BLUE, RED, image_batch, png
from tests.workers.helpers import actor_config, make_group
from workers.fsdp import ActorRolloutRefWorker
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.vision.images import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS, ImageInputs
from workers.vision.models import vision_token_ids

TEXTS = ["<image>colour?", "<image> and <image>: colours?", "<image>which one?", "no picture here"]
PICTURES = [[png(RED)], [png(BLUE), png(RED)], [png(BLUE)], []]


@pytest.fixture(scope="module")
def vlm_group(ray_cluster, tiny_vlm_dir):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    config = actor_config(tiny_vlm_dir, actor={"use_kl_loss": True, "kl_loss_coef": 0.01}, rollout={"response_length": 6})
    group = make_group(pool, ActorRolloutRefWorker, config, "actor_rollout_ref")
    yield group
    group.kill()
    pool.release()


def test_generate_log_probs_and_update_with_images(vlm_group, tiny_vlm_dir):
    prompts = image_batch(tiny_vlm_dir, TEXTS, PICTURES)
    prompts.meta_info["seed"] = 3
    rollout = vlm_group.generate_sequences(prompts)
    assert MULTI_MODAL_INPUTS not in rollout.non_tensor_batch  # processed pixels never leave the workers
    assert list(rollout.non_tensor_batch[MULTI_MODAL_DATA]) == list(prompts.non_tensor_batch[MULTI_MODAL_DATA])
    mask = rollout.batch["response_mask"].bool()
    assert mask.sum() > 4
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()
    assert not torch.isin(rollout.batch["responses"][mask], torch.tensor(vision_token_ids(model.config))).any()

    old = vlm_group.compute_log_prob(rollout).batch["old_log_probs"]
    with torch.no_grad():
        expected, _ = response_log_probs_and_entropy(model, ImageInputs(tiny_vlm_dir).attach(rollout), torch.device("cpu"), 1.0, False)
    torch.testing.assert_close(old[mask], expected[mask], atol=1e-5, rtol=0)
    ref = vlm_group.compute_ref_log_prob(rollout).batch["ref_log_prob"]
    torch.testing.assert_close(ref[mask], old[mask], atol=1e-5, rtol=0)

    step = rollout.union(type(rollout).from_dict({"old_log_probs": old, "ref_log_prob": ref}))
    step.batch["advantages"] = torch.where(torch.arange(4)[:, None] % 2 == 0, 1.0, -1.0) * mask.float()
    metrics = vlm_group.update_actor(step)
    assert metrics[0]["grad_norm"] > 0
    after = vlm_group.compute_log_prob(rollout).batch["old_log_probs"]
    rewarded, punished = mask[0::2], mask[1::2]
    assert after[0::2][rewarded].mean() > old[0::2][rewarded].mean()
    assert after[1::2][punished].mean() < old[1::2][punished].mean()
