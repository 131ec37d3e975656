"""`rollout.engine_kwargs.vllm`: vLLM's own arguments passed as they are, checked by name before the engine starts."""

import pytest

from workers.rollout.engine_kwargs import vllm_argument_names, vllm_engine_kwargs

VALID = frozenset({"enable_prefix_caching", "mm_processor_cache_gb", "swap_space", "tensor_parallel_size"})


def test_known_arguments_pass_through_and_empty_is_nothing():
    assert vllm_engine_kwargs({"vllm": {"enable_prefix_caching": True, "swap_space": 2}}, VALID) == {
        "enable_prefix_caching": True, "swap_space": 2}
    assert vllm_engine_kwargs({"vllm": {}}, VALID) == {} and vllm_engine_kwargs(None, VALID) == {}


def test_every_bad_name_is_reported_with_the_key_to_use():
    with pytest.raises(ValueError) as error:
        vllm_engine_kwargs({"vllm": {"enable_prefix_cachng": True, "tensor_parallel_size": 2, "nope_nope": 1}}, VALID)
    message = str(error.value)
    assert "rollout.engine_kwargs.vllm.enable_prefix_cachng: not an argument of this vLLM's engine; did you mean enable_prefix_caching?" in message
    assert "rollout.engine_kwargs.vllm.tensor_parallel_size: set by rollout.tensor_model_parallel_size" in message
    assert "rollout.engine_kwargs.vllm.nope_nope: not an argument of this vLLM's engine" in message


def test_the_names_come_from_the_installed_vllm():
    names = vllm_argument_names()
    assert {"enable_prefix_caching", "tensor_parallel_size", "gpu_memory_utilization"} <= names
    assert "disable_mm_preprocessor_cache" not in names  # an older vLLM's name (RENAMED_ARGUMENTS)


def test_an_older_vllms_argument_becomes_this_ones():
    valid = VALID | {"disable_mm_preprocessor_cache"}
    assert vllm_engine_kwargs({"vllm": {"disable_mm_preprocessor_cache": True}}, VALID) == {"mm_processor_cache_gb": 0}
    assert vllm_engine_kwargs({"vllm": {"disable_mm_preprocessor_cache": False}}, VALID) == {}
    # a vLLM that still has it gets it as it is
    assert vllm_engine_kwargs({"vllm": {"disable_mm_preprocessor_cache": True}}, valid) == {"disable_mm_preprocessor_cache": True}
