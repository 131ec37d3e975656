"""synthetic/visual_colors: an image task a random tiny vision-language model learns by RL on CPU in minutes.

Each row is one picture (56 x 56, PNG) filled with red or blue, its shade jittered per picture, and a prompt
asking which colour it is. The answer is written in the colour's code: 8 digits for red, 8 vowels for blue,
scored like synthetic/char_class (trainer/rewards/char_class.py): the fraction of the first 8 response
characters in the class. The prompt's text never names the picture's colour (every phrasing lists both codes),
so only the image tells which class is asked for: a policy ignoring the image scores at most about 0.5, one
reading it reaches 1.0. A random policy already writes ~10% digits or vowels, so GRPO's groups differ in
reward from the first step (the same reason char_class is learnable; see trainer/datasets/synthetic.py).

Rows follow verl's image layout: `prompt` with one `<image>` placeholder, and `images` holding a list of
{"bytes", "path"} structs (Hugging Face datasets' image feature, as verl's geo3k data has it).
"""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import pyarrow as pa

from trainer.rewards.char_class import DEFAULT_LENGTH

VISUAL_COLORS_SOURCE = "synthetic/visual_colors"
IMAGE_COLUMN = "images"
IMAGE_SIDE = 56
# colour -> (its code: the char class the answer is written in, its RGB value)
COLOURS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "red": ("digits", (210, 40, 40)),
    "blue": ("vowels", (40, 60, 210)),
}
SHADE_JITTER = 40  # each channel moves by up to this much per picture

_TEMPLATES = (  # at most 64 tokens with the tiny tokenizer's chat template and 4 image tokens
    "<image>colour? red: digits, blue: vowels.",
    "<image>red means digits, blue vowels.",
    "code of <image>? red digits, blue vowels.",
    "<image>its code: red 8 digits, blue 8 vowels",
)

IMAGE_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def colour_png(rgb: tuple[int, int, int], rng: random.Random) -> bytes:
    """A picture of one colour, each channel shifted by up to SHADE_JITTER, encoded as PNG."""
    from PIL import Image

    shade = [min(255, max(0, value + rng.randint(-SHADE_JITTER, SHADE_JITTER))) for value in rgb]
    pixels = np.empty((IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    pixels[:] = shade
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def make_visual_colors_row(rng: random.Random) -> dict[str, Any]:
    """One visual_colors example (without extra_info)."""
    colour = rng.choice(sorted(COLOURS))
    char_class, rgb = COLOURS[colour]
    return {
        "data_source": VISUAL_COLORS_SOURCE,
        "prompt": [{"role": "user", "content": rng.choice(_TEMPLATES)}],
        "ability": "vision",
        "reward_model": {"style": "rule", "ground_truth": f"{char_class}:{DEFAULT_LENGTH}"},
        IMAGE_COLUMN: [{"bytes": colour_png(rgb, rng), "path": None}],
    }
