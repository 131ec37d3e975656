"""The image task through `python -m trainer.main task=visual_colors` (HF rollout, 2 FSDP ranks, packed
forwards): GRPO learns it, a resumed run goes on from the checkpoint, and the export loads in transformers and
answers by the picture's colour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.e2e.conftest import ONE_RANK
from tests.e2e.test_training_runs import _train_rewards
from tests.vision.images import BLUE, RED, png, prompt_ids
from trainer.config_loader import load_config
from trainer.main import run
from trainer.rewards.char_class import compute_char_class_score

pytestmark = pytest.mark.slow


def visual_run(model: str, data: tuple[str, str], out_dir, *extra: str) -> list[str]:
    return [
        "task=visual_colors",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data[0]}",
        f"data.val_files={data[1]}",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[jsonl]",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        ONE_RANK,
        *extra,
    ]


def answer(model, tokenizer, model_dir: str, picture: bytes) -> str:
    from workers.vision.images import ImageInputs

    ids = torch.tensor(prompt_ids(model_dir, ["<image>colour? red: digits, blue: vowels."], [[picture]]))
    vision = ImageInputs(model_dir).row_inputs([picture])
    mm = (ids == model.config.image_token_id).int()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm, max_new_tokens=8,
                         do_sample=False, suppress_tokens=[model.config.image_token_id], **vision)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_grpo_learns_the_image_task_resumes_and_exports(ray_cluster, tiny_vlm_dir, visual_data, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    history = run(load_config(visual_run(tiny_vlm_dir, visual_data, tmp_path, "trainer.total_training_steps=18",
                                         "trainer.export_hf_at_end=true")))
    rewards = _train_rewards(history)
    assert len(rewards) == 18
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.4, rewards

    resumed = run(load_config(visual_run(tiny_vlm_dir, visual_data, tmp_path, "trainer.total_training_steps=19")))
    assert [r["step"] for r in resumed] == [19]  # went on from global_step_18
    assert _train_rewards(resumed)[0] > np.mean(rewards[:3]) + 0.4

    export = tmp_path / "hf_export"
    assert (export / "preprocessor_config.json").is_file()
    model = AutoModelForImageTextToText.from_pretrained(str(export), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(export))
    red, blue = answer(model, tokenizer, str(export), png(RED)), answer(model, tokenizer, str(export), png(BLUE))
    # One prompt text, two pictures: the trained model answers by the picture.
    assert compute_char_class_score(red, "digits:8") >= 0.75, red
    assert compute_char_class_score(blue, "vowels:8") >= 0.75, blue
