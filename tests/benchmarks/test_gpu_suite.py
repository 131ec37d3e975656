"""benchmarks/gpu_suite.py on a CPU: the dry run lists every path the suite must cover with commands whose
overrides load, and the runner runs a case's commands, reads its run's metrics, judges them, and reports a
failure by its first error line (fake cases of `python -c`, nothing trained)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_suite import cases, main
from benchmarks.suite_runner import Case, CommandRun, ExampleCheck, HistoryCheck, RunCheck, error_line, run_case
from tests.conftest import REPO_ROOT
from trainer.config_loader import load_config

REQUIRED = {
    "one": {
        "readme_default",
        "hf_padded_checkpointing",
        "vllm_hybrid",
        "moe_vllm_hybrid",
        "megatron_moe_vllm_hybrid",
        "moe_agent_routing_replay",
        "lora_vllm_ref_first",
        "lora_unshared",
        "lora_shared_always",
        "lora_unshared_offload_always",
        "full_offload",
        "ppo_critic_offload",
        "ppo_critic",
        "dapo",
        "image_task",
        "checkpoint_resume",
        "engine_examples",
        "moe_lora_vllm_hybrid",
        "moe_routing_replay",
        "megatron_moe_routing_replay",
        "megatron_agent",
        "megatron_offload",
        "strategy_ppo_fsdp2",
        "strategy_ppo_megatron",
        "strategy_ppo_moe",
    },
    "two": {"fsdp_two_gpus", "hybrid_sharding_two", "hybrid_tp2", "lora_shared_tp2", "ulysses_two", "separate_async_nccl", "megatron_tp2", "megatron_moe_ep2",
            "megatron_moe_folded",
            "moe_async_routing_replay",
            "engine_quickstart_two_gpus"},
}


def test_dry_run_lists_every_case_with_its_commands():
    listing = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_suite", "--dry-run", "--part", "all"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    for part, names in REQUIRED.items():
        assert {case.name for case in cases(part)} == names
        for name in names:
            assert f"{name} [{part}]" in listing.stdout
    assert "    python -m trainer.main\n" in listing.stdout  # the README's job, as typed
    assert listing.stdout.count("check: ") == len(cases("all"))


def test_every_training_command_loads_as_a_config():
    for case in cases("all"):
        for command in case.commands:
            if command[:2] == ("-m", "trainer.main"):
                load_config(list(command[2:]))  # raises on an unknown key or a bad value


def test_the_lora_cases_cover_every_pair_of_settings():
    """base shared x offload x pass always: every pair of the three settings takes all four level pairs."""
    settings = []
    for case in cases("one"):
        if case.name.startswith("lora"):
            words = set(case.commands[0])
            settings.append(
                (
                    "actor_rollout_ref.rollout.share_base_weights=true" in words,
                    "actor_rollout_ref.actor.fsdp_config.param_offload=true" in words,
                    "actor_rollout_ref.actor.old_log_prob_pass=always" in words,
                )
            )
    for first, second in ((0, 1), (0, 2), (1, 2)):
        assert {(s[first], s[second]) for s in settings} == {(a, b) for a in (False, True) for b in (False, True)}


def _metrics_writer(
    steps: list[int],
    reward: float = 0.1,
    rise: float = 0.1,
    nan_at: int | None = None,
    unsynced: tuple[int, ...] = (1,),
    validation: bool = False,
) -> tuple[str, ...]:
    """A command that appends step records to run/logs/metrics.jsonl, as a training run does: a run's first
    step has no sync (the engine starts with the model folder's weights); `validation` logs step 0 first."""
    code = (
        "import json, pathlib; p = pathlib.Path('run/logs'); p.mkdir(parents=True, exist_ok=True)\n"
        f"with open(p / 'metrics.jsonl', 'a') as f:\n"
        f"    if {validation}: f.write(json.dumps({{'step': 0, 'val/reward': 0.1}}) + '\\n')\n"
        f"    for i, s in enumerate({steps}):\n"
        f"        row = {{'step': s, 'reward/mean': {reward} + {rise} * s, 'timing/step_s': 2.0 if s == 1 else 1.0,\n"
        f"               'actor/pg_loss': float('nan') if s == {nan_at} else 0.5}}\n"
        f"        if s not in {unsynced}: row.update({{'rollout/sync_logprob_max_diff': 0.01, "
        f"'rollout/sync_logprob_scaled_max_diff': 0.005, 'rollout/logprob_gap_mean': 0.02}})\n"
        "        f.write(json.dumps(row) + '\\n')\n"
    )
    return ("-c", code)


def _python(code: str) -> tuple[str, ...]:
    return ("-c", code)


def test_a_passing_case_reports_its_steady_step_time(tmp_path):
    check = RunCheck(6, reward_rises_by=0.2, synced=True)
    result = run_case(
        Case("fake", "one", "fake", (_metrics_writer([1, 2, 3, 4, 5, 6], validation=True),), check), tmp_path
    )
    assert result.passed, result.error  # the validation record (step 0) has no loss and is not a training step
    assert result.steady_step_s == 1.0 and result.runs[0]["steps"] == 7
    assert "sync gap max 0.010, scaled 0.005 (5 syncs)" in result.detail
    assert "engine-trainer log-prob gap mean 0.0200" in result.detail


def test_every_step_but_a_new_runs_first_must_be_synced(tmp_path):
    check = RunCheck(6, synced=True, resumed_after=4)
    unsynced_later = run_case(
        Case("late", "one", "", (_metrics_writer([1, 2, 3, 4, 5, 6], unsynced=(1, 4)),), RunCheck(6, synced=True)),
        tmp_path,
    )
    assert not unsynced_later.passed and unsynced_later.error == "no verified sync at steps [4]"
    # A resumed run's first step generates after syncing the checkpoint's weights: it must carry a sync.
    resumed = run_case(
        Case("resumed", "one", "", (_metrics_writer([1, 2, 3, 4]), _metrics_writer([5, 6], unsynced=(5,))), check),
        tmp_path,
    )
    assert not resumed.passed and resumed.error == "no verified sync at steps [5]"


def test_a_check_that_fails_names_what(tmp_path):
    flat = run_case(
        Case("flat", "one", "", (_metrics_writer([1, 2, 3, 4, 5, 6], rise=0.0),), RunCheck(6, reward_rises_by=0.2)),
        tmp_path,
    )
    assert not flat.passed and "reward rose by 0.000" in flat.error
    short = run_case(Case("short", "one", "", (_metrics_writer([1, 2, 3], nan_at=2),), RunCheck(6)), tmp_path)
    assert not short.passed and "last step 3, expected 6" in short.error and "not finite at steps [2]" in short.error


def test_a_first_step_metric_must_hold_its_value(tmp_path):
    check = RunCheck(1, first_step=(("actor/fsdp_shard_ranks", 1.0),))
    written = "import json, pathlib; p = pathlib.Path('run/logs'); p.mkdir(parents=True, exist_ok=True); " \
        "(p / 'metrics.jsonl').write_text(json.dumps({'step': 1, 'actor/pg_loss': 0.5, 'actor/fsdp_shard_ranks': %s}))"
    assert run_case(Case("held", "one", "", (_python(written % "1.0"),), check), tmp_path).passed
    other = run_case(Case("other", "one", "", (_python(written % "2.0"),), check), tmp_path)
    assert not other.passed and other.error == "step 1 logged actor/fsdp_shard_ranks=2.0, expected 1.0"


def test_a_bounded_metric_must_stay_under_its_bound_at_every_step(tmp_path):
    check = RunCheck(2, at_most=(("router_replay/mismatch_log_prob", 0.05),))
    written = "import json, pathlib; p = pathlib.Path('run/logs'); p.mkdir(parents=True, exist_ok=True); " \
        "(p / 'metrics.jsonl').write_text('\\n'.join(json.dumps({'step': s, 'actor/pg_loss': 0.5, " \
        "'router_replay/mismatch_log_prob': v}) for s, v in ((1, 0.01), (2, %s))))"
    held = run_case(Case("held", "one", "", (_python(written % "0.03"),), check), tmp_path)
    assert held.passed and "router_replay/mismatch_log_prob mean 0.0200, max 0.0300" in held.detail
    over = run_case(Case("over", "one", "", (_python(written % "0.9"),), check), tmp_path)
    assert not over.passed and over.error == "router_replay/mismatch_log_prob above 0.05 at (step, value) [(2, 0.9)]"


def test_a_resumed_run_must_start_after_its_checkpoint(tmp_path):
    check = RunCheck(6, resumed_after=4)
    resumed = run_case(
        Case("resumed", "one", "", (_metrics_writer([1, 2, 3, 4]), _metrics_writer([5, 6])), check), tmp_path
    )
    assert resumed.passed, resumed.error
    restarted = run_case(
        Case("restarted", "one", "", (_metrics_writer([1, 2, 3, 4]), _metrics_writer([1, 2, 3, 4, 5, 6])), check),
        tmp_path,
    )
    assert not restarted.passed and "expected to start at 5" in restarted.error


def test_a_failing_command_reports_its_error_line_and_stops_the_case(tmp_path):
    raising = _python("import sys; print('working'); raise ValueError('the model folder has no config.json')")
    never = _python("open('never_ran', 'w')")
    result = run_case(Case("raises", "one", "", (raising, never), RunCheck(1)), tmp_path)
    assert not result.passed and result.error == "ValueError: the model folder has no config.json"
    assert not (tmp_path / "raises" / "never_ran").exists() and len(result.runs) == 1
    refused = run_case(
        Case(
            "refused", "one", "", (_python("import sys; print('error: trainer.x=3 is bad'); sys.exit(2)"),), RunCheck(1)
        ),
        tmp_path,
    )
    assert refused.error == "error: trainer.x=3 is bad"


@pytest.mark.parametrize(
    "first_error",
    [
        "AssertionError: Error in memory profiling. Initial free memory 103.55 GiB, current free memory 137.39 GiB",
        "AssertionError: Memory usage increased after sleeping.",
    ],
    ids=["start", "sleep"],
)
def test_vllms_shared_gpu_race_runs_the_case_once_more(tmp_path, first_error):
    """The first attempt fails as vLLM does when a neighbouring case changed the GPU's memory during its start or
    its sleep; the second passes."""
    flaky = _python(
        "import pathlib, sys\n"
        "marker = pathlib.Path('../flaky_once')\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        f"    sys.exit({first_error!r})\n"
    )
    result = run_case(Case("flaky", "one", "", (flaky, _metrics_writer([1, 2])), RunCheck(2)), tmp_path)
    assert result.passed and result.retried == first_error
    other = run_case(
        Case("other", "one", "", (_python("raise SystemExit('RuntimeError: something else')"),), RunCheck(2)), tmp_path
    )
    assert not other.passed and other.retried is None


def test_a_case_past_its_time_limit_is_stopped(tmp_path):
    result = run_case(
        Case("slow", "one", "", (_python("import time; time.sleep(60)"),), RunCheck(1), timeout_s=2), tmp_path
    )
    assert not result.passed and result.error == "timed out after 2 s" and result.wall_s < 30


def test_error_line_finds_the_worker_exception_inside_rays_wrapper():
    log = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "trainer/main.py", line 3, in <module>',
            "ray.exceptions.RayTaskError(RuntimeError): ray::Colocated.update_actor() (pid=1, ip=127.0.0.1)",
            '  File "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", line 700, in foreach_reduce',
            "RuntimeError: attempting to assign a gradient with dtype 'c10::BFloat16' to a tensor with grad_dtype "
            "'Float'",
            "(Colocated pid=1) some later log line",
        ]
    )
    assert error_line(log).startswith("RuntimeError: attempting to assign a gradient")
    assert error_line("just\nlines\n") == "lines"


def test_example_check_reads_the_examples_json(tmp_path):
    check = ExampleCheck(("quickstart (colocated)", "vlm"))
    (tmp_path / "examples.json").write_text(
        json.dumps(
            {
                "rows": [
                    {"example": "quickstart (colocated)", "passed": True},
                    {"example": "vlm", "passed": False, "error": "gap 3.1 above 0.25"},
                ]
            }
        )
    )
    assert check.judge(tmp_path, []) == ["vlm: gap 3.1 above 0.25"]
    assert check.judge(Path(tmp_path / "missing"), []) == ["no examples.json written"]


def test_example_check_details_each_examples_wall_time(tmp_path):
    check = ExampleCheck(("quickstart (colocated)", "vlm"))
    rows = [{"example": "quickstart (colocated)", "passed": True, "wall_s": 41.3},
            {"example": "vlm", "passed": True, "wall_s": 118.6}]
    (tmp_path / "examples.json").write_text(json.dumps({"rows": rows}))
    run = CommandRun(["-m", "benchmarks.engine_examples"], 0, 170.0, [], tmp_path / "command_0.log")
    assert check.detail([run]) == "quickstart (colocated) 41 s, vlm 119 s"
    assert check.detail([]) == ""
    assert check.detail([CommandRun([], 1, 1.0, [], tmp_path / "gone" / "command_0.log")]) == ""


def test_history_check_reads_the_strategy_examples_history(tmp_path):
    check = HistoryCheck(6, reward_rises_by=0.3)
    synced = {"actor/loss": 0.1, "rollout/sync_logprob_max_diff": 0.02}

    def write(rewards):
        rows = [{"step": step, "reward": reward, **synced} for step, reward in enumerate(rewards)]
        (tmp_path / "history.json").write_text(json.dumps(rows))
        return rows

    write((0.1, 0.1, 0.1, 0.9, 0.9, 0.9))
    assert check.judge(tmp_path, []) == []
    run = CommandRun(["-m", "examples.strategy_ppo"], 0, 60.0, [], tmp_path / "command_0.log")
    assert check.detail([run]) == "reward 0.10->0.90; sync gap max 0.020 (6 syncs)"
    rows = write((0.1, 0.1, 0.1, 0.2, 0.2, 0.2))
    rows[5] = {"step": 5, "reward": 0.2, "actor/loss": float("nan")}  # no sync, a lost loss
    (tmp_path / "history.json").write_text(json.dumps(rows))
    assert check.judge(tmp_path, []) == [
        "actor/loss missing or not finite at steps [5]",
        "reward rose by 0.100 (0.100 -> 0.200), wanted 0.3",
        "no verified engine update at steps [5]",
    ]
    assert HistoryCheck(7, 0.3).judge(tmp_path, [])[0] == "ran 6 steps, expected 7"
    routers = HistoryCheck(6, 0.0, finite=("actor/router_aux_loss",))
    assert routers.judge(tmp_path, [])[0] == "actor/router_aux_loss missing or not finite at steps [0, 1, 2, 3, 4]"
    assert check.judge(tmp_path / "missing", []) == ["no history.json written"]


def test_a_part_refuses_a_machine_of_another_size(capsys):
    with pytest.raises(SystemExit):
        main(["--part", "two", "--workdir", "/tmp/unused"])
    assert "part two runs on exactly 2 visible GPU(s); this process sees 0" in capsys.readouterr().err


def test_a_case_marked_alone_runs_after_the_others_end(tmp_path, monkeypatch):
    """Cases run side by side (--jobs), but one marked `alone` starts only when every other case has ended."""
    import benchmarks.gpu_suite as suite

    def stamps(seconds: float) -> tuple[str, ...]:
        return _python(
            f"import time, pathlib; s = time.time(); time.sleep({seconds}); "
            "pathlib.Path('span').write_text(f'{s} {time.time()}')"
        )

    fake = [
        Case("alone", "one", "", (stamps(0.1),), ExampleCheck(()), alone=True),
        Case("slow", "one", "", (stamps(1.5),), ExampleCheck(())),
        Case("quick", "one", "", (stamps(0.2),), ExampleCheck(())),
    ]
    monkeypatch.setattr(suite, "cases", lambda part: fake)
    monkeypatch.setattr(suite, "visible_gpus", lambda: 1)
    monkeypatch.setattr(suite, "machine", lambda: {"gpus": 1})
    results = suite.main(
        ["--part", "one", "--jobs", "2", "--workdir", str(tmp_path), "--out", str(tmp_path / "out.json")]
    )
    assert [r.name for r in results] == ["slow", "quick", "alone"]
    span = {
        name: [float(x) for x in (tmp_path / name / "span").read_text().split()] for name in ("alone", "slow", "quick")
    }
    assert span["quick"][0] < span["slow"][1]  # the two others overlapped
    assert span["alone"][0] >= max(span["slow"][1], span["quick"][1])
    written = [c["name"] for c in json.loads((tmp_path / "out.json").read_text())["cases"]]  # in the order they ended
    assert sorted(written[:2]) == ["quick", "slow"] and written[2] == "alone"
