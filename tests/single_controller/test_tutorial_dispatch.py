"""The online DPO tutorial's custom dispatch dict (`return data.chunk(worker_group.world_size)`), as written,
on real worker groups of 1, 2 and 4 workers; malformed dispatch results give one error naming what to do."""

from __future__ import annotations

import pytest
import torch

from protocol import DataProto
from single_controller import DispatchError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.verl_style_workers import TutorialGenerator

ROWS = 8


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world_size_{n}")
def generator(request, ray_cluster):
    pool = RayResourcePool(process_on_nodes=[request.param], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(TutorialGenerator), name_prefix=f"tutorial{request.param}")
    yield group
    group.kill()
    pool.release()


def prompts() -> DataProto:
    return DataProto.from_dict({"x": torch.arange(ROWS)}, meta_info={"step": 0})


def test_tutorial_dispatch_splits_in_order_and_merges_worker_metrics(generator):
    n = generator.world_size
    out = generator.generate_sequences(prompts())
    assert out.batch["x"].tolist() == list(range(ROWS))
    assert out.batch["rank"].tolist() == [row // (ROWS // n) for row in range(ROWS)]
    # DataProto.concat in the tutorial's collect_fn gathers each worker's metrics per key
    assert out.meta_info == {"metrics": {"rows": [ROWS // n] * n, "rank": list(range(n))}}


def test_collect_fn_written_with_torch_cat_concatenates_the_dataprotos(generator):
    n = generator.world_size
    out = generator.generate_collected_with_torch_cat(prompts())
    assert isinstance(out, DataProto)
    assert out.batch["x"].tolist() == [2 * row for row in range(ROWS)]
    assert out.batch["rank"].tolist() == [row // (ROWS // n) for row in range(ROWS)]
    assert out.meta_info == {"metrics": {"rank": list(range(n))}}


def test_malformed_dispatch_results_name_method_function_and_shapes(generator):
    n = generator.world_size
    with pytest.raises(DispatchError) as unsplit:
        generator.generate_unsplit(prompts())
    message = str(unsplit.value)
    assert f"dispatch function dispatch_whole of {generator.name}.generate_unsplit returned DataProto" in message
    assert f"a list or tuple of length {n}" in message and f"(args, kwargs) in which every value is a list of length {n}" in message
    with pytest.raises(AssertionError, match=r"returned \(args, kwargs\) whose argument 'scale' is int"):
        generator.generate_bad_kwargs(prompts(), scale=2)
    with pytest.raises(DispatchError, match="but the call passed 2 arguments; return \\(args, kwargs\\)"):
        generator.generate_with_two_arguments(prompts(), 3)
    if n > 1:
        with pytest.raises(DispatchError, match="dispatch_one_chunk .* returned list of length 1"):
            generator.generate_one_chunk(prompts())
    else:
        assert len(generator.generate_one_chunk(prompts())) == ROWS


def test_storing_a_dp_compute_proto_output_into_batch_fails_at_the_assignment(generator):
    data = prompts()
    with pytest.raises(TypeError, match=r"batch\['ref_log_prob'\].*\.batch\['ref_log_prob'\]"):
        data.batch["ref_log_prob"] = generator.infer(data)
    data.batch["ref_log_prob"] = generator.infer(data).batch["ref_log_prob"]
    assert torch.allclose(data.batch["ref_log_prob"], torch.arange(ROWS) / 10)
