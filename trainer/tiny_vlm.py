"""Build a tiny random-init Qwen2-VL with the character tokenizer and a Qwen2-VL image processor, offline.

    python -m trainer.tiny_vlm OUT_DIR [--seed N]

The vision-language counterpart of trainer/tiny_model.py (same tokenizer, chat template and text sizes, plus
the four vision tokens), for the image task `task=visual_colors` (trainer/datasets/visual_colors.py) and the
image tests. A 56 x 56 picture is 4 x 4 patches of 14 pixels, merged 2 x 2 into 4 image tokens; the image
processor resizes every picture to that size (min_pixels = max_pixels), so every image costs 4 tokens.
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from trainer.tiny_model import (
    IM_START,
    _make_tokenizer_config_portable,
    build_char_tokenizer,
    build_tiny_config,
    run_builder,
    seeded_model,
)

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_SIDE = 56  # pixels: 4 x 4 patches of 14, merged 2 x 2 into 4 image tokens


def build_tiny_vlm(out_dir: str | Path, seed: int = 0) -> Path:
    """Write tokenizer + image processor + random-init Qwen2VLForConditionalGeneration to `out_dir`.

    Text part: the tiny Qwen2's sizes (hidden 128, head_dim 64, which vLLM's CPU attention accepts); mrope
    sections [16, 8, 8] split the 32 rotary frequencies over time, height and width. Vision part: one block
    of width 64."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, *VISION_TOKENS]})
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    text = build_tiny_config(tokenizer).to_dict()
    text.update(rope_scaling={"type": "mrope", "mrope_section": [16, 8, 8]})
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=1, embed_dim=64, hidden_size=text["hidden_size"], num_heads=2, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    model = seeded_model(Qwen2VLForConditionalGeneration, config, tokenizer, seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _make_tokenizer_config_portable(out / "tokenizer_config.json")
    Qwen2VLImageProcessorPil(min_pixels=IMAGE_SIDE**2, max_pixels=IMAGE_SIDE**2).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    run_builder(argv, __doc__, build_tiny_vlm, "tiny vision-language model")


if __name__ == "__main__":
    main()
