"""The `hf` executor's generate (no Ray: the worker class in this process, on the tiny CPU model): one batched
`generate` for all prompts, and top_k, top_p, stop ids and seed honoured as on vLLM."""

import pytest

from trainer.tiny_model import build_tiny_model
from workers.engines.hf_inference_worker import HFInferenceWorker

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12]]  # different lengths: the batch is left-padded
GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    worker = HFInferenceWorker({"model": {"path": str(build_tiny_model(tmp_path_factory.mktemp("hf") / "model", seed=0))}})
    worker.init_model()
    return worker


def token_ids(results: list[dict]) -> list[list[int]]:
    return [r["token_ids"] for r in results]


def test_all_prompts_go_in_one_generate_and_match_one_at_a_time(worker, monkeypatch):
    batches = []
    generate = worker.model.generate
    monkeypatch.setattr(worker.model, "generate", lambda **kwargs: batches.append(len(kwargs["input_ids"])) or generate(**kwargs))
    batched = worker.generate_tokens(PROMPTS, GREEDY)
    assert batches == [len(PROMPTS)]
    for prompt, result in zip(PROMPTS, batched):
        (alone,) = worker.generate_tokens([prompt], GREEDY)
        assert result["token_ids"] == alone["token_ids"] and len(result["token_ids"]) == 8
        assert result["log_probs"] == pytest.approx(alone["log_probs"], abs=1e-5)


@pytest.mark.parametrize("narrowing", [{"top_k": 1}, {"top_p": 1e-6}])
def test_top_k_and_top_p_narrow_sampling_to_the_greedy_token(worker, narrowing):
    greedy = token_ids(worker.generate_tokens(PROMPTS, GREEDY))
    free = token_ids(worker.generate_tokens(PROMPTS, {"temperature": 1.0, "max_tokens": 8, "seed": 3}))
    assert free != greedy  # plain sampling of the random model wanders off the greedy tokens
    narrowed = worker.generate_tokens(PROMPTS, {"temperature": 1.0, "max_tokens": 8, "seed": 3, **narrowing})
    assert token_ids(narrowed) == greedy
    for result in narrowed:  # the log-prob under the distribution sampled from: one token left, probability 1
        assert result["log_probs"] == pytest.approx([0.0] * 8, abs=1e-6)


def test_a_stop_id_ends_the_response_and_a_seed_repeats_the_sample(worker):
    sampling = {"temperature": 1.0, "max_tokens": 8, "seed": 11}
    sampled = token_ids(worker.generate_tokens(PROMPTS, sampling))
    assert sampled == token_ids(worker.generate_tokens(PROMPTS, sampling))
    stop = sampled[0][3]
    stopped = token_ids(worker.generate_tokens(PROMPTS, {**sampling, "stop_token_ids": [stop]}))
    # Same draws up to the stop id, which ends each response that samples it (kept as its last token).
    assert stopped == [tokens[: tokens.index(stop) + 1] if stop in tokens else tokens for tokens in sampled]
    assert len(stopped[0]) <= 4
