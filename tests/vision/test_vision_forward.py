"""A Qwen2-VL forward with its images (no Ray): packed equals padded, HF generate agrees with the trainer's
forward, the model's vision tokens are never sampled, and LoRA leaves the vision tower alone by default."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from tests.vision.images import BLUE, RED, image_batch, png
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.lora.model import adapter_parameter_names, add_lora_adapters
from workers.lora.spec import LoraSpec
from workers.packing.forward import enable_packing, is_packed
from workers.rollout.hf_generate import generate_responses
from workers.rollout.sampling import SamplingParams
from workers.vision.forward_inputs import generate_inputs, vision_forward_inputs
from workers.vision.images import ImageInputs
from workers.vision.models import VISION_TOWER_EXCLUDE, vision_token_ids, with_vision_lora_default

CPU = torch.device("cpu")
TEXTS = ["<image>colour?", "which <image> is it, and <image>?", "no picture in this longer text row"]
PICTURES = [[png(RED)], [png(BLUE), png(RED)], []]


def load(model_dir: str) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def rollout(tiny_vlm_dir):
    """Three prompts (two pictures, one, none) with responses of different lengths, processed as a worker does."""
    batch = image_batch(tiny_vlm_dir, TEXTS, PICTURES, responses=[[40, 41, 42], [50, 51, 52, 53, 54, 55], [60]])
    return ImageInputs(tiny_vlm_dir).attach(batch)


def test_packed_log_probs_equal_padded_with_images(tiny_vlm_dir, rollout):
    padded, packed = load(tiny_vlm_dir), load(tiny_vlm_dir)
    assert enable_packing(packed, None) and is_packed(packed)
    assert packed.config.vision_config._attn_implementation == "sdpa"  # the vision tower keeps its own attention
    mask = rollout.batch["response_mask"].bool()
    with torch.no_grad():
        lp, ent = response_log_probs_and_entropy(padded, rollout, CPU, 1.0, True)
        plp, pent = response_log_probs_and_entropy(packed, rollout, CPU, 1.0, True)
    torch.testing.assert_close(plp[mask], lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(pent[mask], ent[mask], atol=1e-5, rtol=0)
    assert torch.all(plp[~mask] == 0)


def test_the_pictures_reach_the_log_probs(tiny_vlm_dir, rollout):
    model = load(tiny_vlm_dir)
    swapped = image_batch(tiny_vlm_dir, TEXTS, [[png(BLUE)], [png(RED), png(BLUE)], []],
                          responses=[[40, 41, 42], [50, 51, 52, 53, 54, 55], [60]])
    swapped = ImageInputs(tiny_vlm_dir).attach(swapped)
    with torch.no_grad():
        lp, _ = response_log_probs_and_entropy(model, rollout, CPU, 1.0, False)
        other, _ = response_log_probs_and_entropy(model, swapped, CPU, 1.0, False)
    assert float((lp[:2] - other[:2]).abs().max()) > 1e-3  # other colours, other log-probs
    torch.testing.assert_close(lp[2], other[2])  # the text-only row does not change
    positions = vision_forward_inputs(model, rollout, CPU)["position_ids"]
    assert positions.shape == (3, 3, rollout.batch["input_ids"].shape[1])
    assert not torch.equal(positions[1], positions[2])  # image tokens take (row, column) positions


def _params(model_dir: str, suppress: bool, length: int = 6) -> SamplingParams:
    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config()
    return SamplingParams(do_sample=False, temperature=1.0, top_p=1.0, top_k=0, response_length=length,
                          eos_token_ids=(text.eos_token_id,), pad_token_id=text.pad_token_id,
                          suppress_token_ids=vision_token_ids(config) if suppress else ())


def test_hf_generate_with_images_agrees_with_the_trainers_forward(tiny_vlm_dir):
    model = load(tiny_vlm_dir)
    prompts = ImageInputs(tiny_vlm_dir).attach(image_batch(tiny_vlm_dir, TEXTS, PICTURES))
    inputs = {k: prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    out = generate_responses(model, inputs, _params(tiny_vlm_dir, True), synced=False, model_kwargs=generate_inputs(model, prompts, CPU))
    rollout = prompts.select(batch_keys=[]).union(type(prompts).from_dict(out))
    with torch.no_grad():
        lp, _ = response_log_probs_and_entropy(model, rollout, CPU, 1.0, False)
    mask = out["response_mask"].bool()
    width = out["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=rollout.batch["input_ids"], attention_mask=rollout.batch["attention_mask"],
                       **vision_forward_inputs(model, rollout, CPU)).logits[:, -width - 1 : -1].float()
    torch.testing.assert_close(lp[mask], logits.log_softmax(-1).gather(-1, out["responses"][..., None])[..., 0][mask], atol=1e-5, rtol=0)
    # Greedy decoding picked, at every step, the token the trainer's forward rates highest among those allowed.
    logits[..., list(vision_token_ids(model.config))] = -float("inf")
    assert torch.equal(logits.argmax(-1)[mask], out["responses"][mask])
    assert mask.sum() > 3


def test_vision_tokens_are_never_sampled(tiny_vlm_dir):
    model = load(tiny_vlm_dir)
    pad_id = model.config.image_token_id
    with torch.no_grad():  # make the image placeholder the model's favourite token everywhere
        model.lm_head.weight[pad_id] *= 0
        model.lm_head.weight[pad_id] += model.model.language_model.norm.weight * 50
    prompts = ImageInputs(tiny_vlm_dir).attach(image_batch(tiny_vlm_dir, TEXTS[:2], PICTURES[:2]))
    inputs = {k: prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    extra = generate_inputs(model, prompts, CPU)
    free = generate_responses(model, inputs, _params(tiny_vlm_dir, False, 4), synced=False, model_kwargs=extra)
    assert (free["responses"] == pad_id).any()  # without suppression the placeholder would be sampled
    kept = generate_responses(model, inputs, _params(tiny_vlm_dir, True, 4), synced=False, model_kwargs=extra)
    assert not torch.isin(kept["responses"], torch.tensor(vision_token_ids(model.config))).any()


def test_lora_leaves_the_vision_tower_alone_by_default(tiny_vlm_dir):
    cfg = {"path": tiny_vlm_dir, "lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear", "exclude_modules": None}
    resolved = with_vision_lora_default(cfg)
    assert resolved["exclude_modules"] == VISION_TOWER_EXCLUDE
    model = load(tiny_vlm_dir)
    add_lora_adapters(model, LoraSpec.from_model_config(resolved))
    names = adapter_parameter_names(model)
    assert names and all(".language_model." in name for name in names)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable == names
    # The user's own setting wins: no exclusion adapts the vision tower too.
    everything = load(tiny_vlm_dir)
    add_lora_adapters(everything, LoraSpec.from_model_config(with_vision_lora_default({**cfg, "exclude_modules": []})))
    assert any(".visual." in name for name in adapter_parameter_names(everything))


def test_vllm_requests_never_sample_vision_tokens(tiny_vlm_dir):
    pytest.importorskip("vllm")
    from workers.rollout.vllm_requests import vllm_sampling

    params = _params(tiny_vlm_dir, True)
    request = vllm_sampling(params, 8, seed=1)
    assert request.logit_bias == {token: -100.0 for token in params.suppress_token_ids}
    assert vllm_sampling(_params(tiny_vlm_dir, False), 8, seed=1).logit_bias is None
