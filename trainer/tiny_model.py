"""Build a tiny random-init Qwen2 model with a character-level tokenizer, fully offline.

    python -m trainer.tiny_model OUT_DIR [--seed N]

The folder is a normal Hugging Face checkpoint (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja),
so the code paths that load real models (Auto classes, vLLM) load it too. It exists
so the trainer can be exercised end to end on CPU in minutes; see
trainer/datasets/synthetic.py for the task it can learn.

Tokenizer design: for `model_type == "qwen2"`, transformers 5 always loads
`Qwen2Tokenizer`, which keeps only the vocab/merges of tokenizer.json and rebuilds
its own pipeline (NFC, Qwen split regex, byte-level). A WordLevel tokenizer would be
silently mangled on load, so we build exactly that pipeline ourselves: a byte-level
BPE with no merges whose vocab is one symbol per printable ASCII character. Each
character is one token, and the tokenizer we build and the one any loader rebuilds
encode identically. Characters outside the vocab (non-ASCII) are dropped by the
byte-level BPE, as Qwen2Tokenizer has no unk token; every synthetic prompt is ASCII.
Uppercase letters are in the vocab, so no lowercasing is needed.
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path
from typing import Any, Callable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD_TOKEN = "<|endoftext|>"  # Qwen's pad/bos token name; never produced by the chat template
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a chat turn, doubles as eos so generation stops after one turn
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Printable ASCII plus newline/tab: everything the chat template and synthetic tasks use.
CHARACTERS = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")

# Same split regex as transformers' Qwen2Tokenizer (see the module docstring for why it must match).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen-style template: one `<|im_start|>role\ncontent<|im_end|>\n` block per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes stay themselves, the rest move to U+0100 and up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    mapping = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges over CHARACTERS: one token per character, specials are ids 0..2."""
    byte_chars = _byte_to_unicode()
    symbols = [byte_chars[b] for b in CHARACTERS.encode("ascii")]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + symbols)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=PAD_TOKEN,  # what Qwen2Tokenizer defaults to; BPE itself never emits it
        additional_special_tokens=[IM_START],
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """Qwen2 sized for CPU speed; head_dim 64 because the CPU vLLM backend only accepts some sizes."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
        dtype="float32",
    )


def seeded_model(model_class: type, config: Any, tokenizer: Any, seed: int) -> Any:
    """`model_class(config)` with weights that depend only on `seed` (not on earlier RNG use; the global RNG is
    restored), generating with the tokenizer's special tokens."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_class(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model


def build_tiny_model(out_dir: str | Path, seed: int = 0, num_key_value_heads: int | None = None) -> Path:
    """Write tokenizer + random-init Qwen2ForCausalLM to `out_dir`; same seed -> same weights.
    `num_key_value_heads=2` gives a shape that tensor parallelism of 2 can split (the default has one)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    config = build_tiny_config(tokenizer)
    if num_key_value_heads is not None:
        config.num_key_value_heads = num_key_value_heads
    model = seeded_model(Qwen2ForCausalLM, config, tokenizer, seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _make_tokenizer_config_portable(out / "tokenizer_config.json")
    return out


def _make_tokenizer_config_portable(config_path: Path) -> None:
    """Write tokenizer_config.json so transformers 4.x loads it too (vLLM may pin 4.x).

    Name the class every loader ends up with anyway (4.x has no `TokenizersBackend`),
    and list <|im_start|> under the key both versions read (4.x wants a dict under
    `extra_special_tokens`). tokenizer.json marks it special either way.
    """
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    extra = config.pop("extra_special_tokens", None)
    if extra:
        config["additional_special_tokens"] = list(extra)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def run_builder(
    argv: list[str] | None, doc: str, build: Callable[..., Path], what: str, kv_heads: bool = False
) -> None:
    """`python -m trainer.tiny_<kind> OUT_DIR [--seed N] [--kv-heads K]`: the command line of a tiny model's builder
    (`--kv-heads` where `build` takes `num_key_value_heads`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    if kv_heads:
        parser.add_argument(
            "--kv-heads", type=int, default=None, help="key/value heads (default 1; 2 for tensor parallel 2)"
        )
    args = parser.parse_args(argv)
    shape = {"num_key_value_heads": args.kv_heads} if kv_heads else {}
    print(f"wrote {what} to {build(args.out_dir, seed=args.seed, **shape)}")


def main(argv: list[str] | None = None) -> None:
    run_builder(argv, __doc__, build_tiny_model, "tiny model", kv_heads=True)


if __name__ == "__main__":
    main()
