"""The tiny model folder loads with the Auto classes and its tokenizer behaves like a chat tokenizer."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.tiny_model import IM_END, IM_START, PAD_TOKEN, build_char_tokenizer, build_tiny_model, main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_folder_is_a_safetensors_checkpoint(tiny_dir) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    expected = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= names
    assert not any(name.endswith(".bin") for name in names)


def test_loads_with_auto_classes_and_config_matches_tokenizer(tiny_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    config = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (128, 2, 2)
    assert config.hidden_size // config.num_attention_heads == 64  # head_dim the CPU vLLM backend accepts
    assert config.num_key_value_heads in (1, 2) and config.intermediate_size == 256
    assert config.max_position_embeddings == 512 and config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    assert config.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    assert config.bos_token_id == tokenizer.bos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


def test_loaded_tokenizer_encodes_like_the_built_one(tiny_dir) -> None:
    # transformers rebuilds Qwen2Tokenizer's own pipeline on load; ours must match it.
    loaded, built = AutoTokenizer.from_pretrained(tiny_dir), build_char_tokenizer()
    texts = ["Write 8 digits.\n\n  x", "what is 12 + 7 * 3? #### 33", f"{IM_START}user\nhi{IM_END}\n", "it's (ok)!"]
    for text in texts:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == built(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text


def test_one_token_per_character(tiny_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Abc 12+3=?\n#"
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == len(text)


def test_chat_template_renders_qwen_style_with_single_id_specials(tiny_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "write 8 digits."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nbe brief.<|im_end|>\n<|im_start|>user\nwrite 8 digits.<|im_end|>\n<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert without == "<|im_start|>user\nwrite 8 digits.<|im_end|>\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start, end = tokenizer.convert_tokens_to_ids(IM_START), tokenizer.convert_tokens_to_ids(IM_END)
    assert ids.count(start) == 3 and ids.count(end) == 2
    assert tokenizer.decode(ids) == text  # specials round-trip as single ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "system\nbe brief.\nuser\nwrite 8 digits.\nassistant\n"


def test_generate_runs(tiny_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    messages = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 4)


def test_same_seed_same_weights_other_seed_differs(tiny_dir, tmp_path) -> None:
    same = load_file(build_tiny_model(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(build_tiny_model(tmp_path / "other", seed=1) / "model.safetensors")
    reference = load_file(tiny_dir / "model.safetensors")
    assert same.keys() == reference.keys()
    assert all(torch.equal(same[k], reference[k]) for k in reference)
    assert not all(torch.equal(other[k], reference[k]) for k in reference)


def test_cli_writes_folder(tmp_path, capsys) -> None:
    main([str(tmp_path / "cli"), "--seed", "3"])
    assert (tmp_path / "cli" / "model.safetensors").is_file()
    assert "wrote tiny model" in capsys.readouterr().out
