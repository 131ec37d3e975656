"""A vision-language module through the engine API: a tiny Qwen2-VL trains with its image processor and
tokenizer living on the workers; only small inputs (an image seed and a caption) travel over Ray.

    python -m examples.engine_vlm [--model outputs/tiny_vlm]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from examples.engine_quickstart import run_example
from trainer.tiny_model import build_char_tokenizer
from workers.engines import NeedParallel, TrainEngine, TrainModule

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_SIDE = 56  # pixels: 4x4 patches of 14, merged 2x2 into 4 image tokens


def build_tiny_vlm(folder: Path) -> Path:
    """A random-init Qwen2-VL (2 text layers, 1 vision block) with the character tokenizer plus vision
    tokens and a Qwen2-VL image processor, written as a normal Hugging Face folder."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=128, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [8, 4, 4]}, bos_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil(min_pixels=IMAGE_SIDE**2, max_pixels=IMAGE_SIDE**2).save_pretrained(folder)
    return folder


class TinyVLPolicy(TrainModule, Qwen2VLForConditionalGeneration):
    """Learns to caption solid-colour images; the data is built and preprocessed on the worker."""

    def on_weights_materialized(self) -> None:
        source = self.materialization_source()
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(source)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=5e-3)

    def _sample(self, colour: int, caption: str) -> dict[str, torch.Tensor]:
        image = np.zeros((IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        image[..., colour % 3] = 255
        vision = self.image_processor(images=[image], return_tensors="pt")
        image_tokens = int(vision["image_grid_thw"].prod()) // self.config.vision_config.spatial_merge_size**2
        ids = [self.config.vision_start_token_id, *[self.config.image_token_id] * image_tokens, self.config.vision_end_token_id]
        ids += self.tokenizer.encode(caption, add_special_tokens=False)
        input_ids = torch.tensor([ids])
        labels = input_ids.clone()
        labels[:, : image_tokens + 2] = -100  # learn the caption, not the image placeholders
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels,
                "mm_token_type_ids": (input_ids == self.config.image_token_id).long(), **vision}

    def train_step(self, samples: list[tuple[int, str]]) -> float:
        device = next(self.parameters()).device
        total = 0.0
        for colour, caption in samples:
            batch = {k: v.to(device) for k, v in self._sample(colour, caption).items()}
            loss = self(**batch).loss / len(samples)
            loss.backward()
            total += loss.item()
        return total

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run(model_path: str, steps: int = 6, world_size: int = 1) -> dict[str, object]:
    with init_empty_weights():
        policy = TinyVLPolicy(AutoConfig.from_pretrained(model_path))
    train = TrainEngine(policy).build(world_size=world_size, use_gpu=torch.cuda.is_available())
    samples = [(0, "red"), (1, "green"), (2, "blue"), (0, "red")]
    losses = []
    for _ in range(steps):
        losses.append(float(np.mean(train.train_step(NeedParallel(samples)))))
        train.optimizer_step()
    return {"losses": losses, "train": train}


def main() -> None:
    run_example(__doc__, "outputs/tiny_vlm", build_tiny_vlm, run)


if __name__ == "__main__":
    main()
