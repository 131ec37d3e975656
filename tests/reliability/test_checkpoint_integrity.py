"""Partial and corrupt checkpoint folders are detected from their manifest: `resume_mode=auto` skips them
with a warning naming why and takes the newest whole one; an explicit path raises; retention counts
only whole checkpoints."""

import json

import pytest

from workers import checkpoint_format
from workers.checkpoint_format import CheckpointError, checkpoint_problem, find_resume_dir, save_checkpoint


def save(root, step, keep=None):
    def save_roles(folder):
        (folder / "actor").mkdir()
        (folder / "actor" / "shard_0.bin").write_bytes(bytes(1000))

    return save_checkpoint(root, step, {"global_step": step}, save_roles, keep)


def test_manifest_lists_every_file_with_its_size(tmp_path):
    folder = save(tmp_path, 1)
    manifest = json.loads((folder / checkpoint_format.MANIFEST_FILE).read_text())
    assert manifest["complete"] is True and manifest["step"] == 1
    assert manifest["files"] == {"actor/shard_0.bin": 1000, "driver_state.json": len(json.dumps({"global_step": 1}))}
    assert checkpoint_problem(folder) is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda f: (f / "actor" / "shard_0.bin").write_bytes(bytes(10)), "actor/shard_0.bin has 10 bytes, the manifest says 1000"),
        (lambda f: (f / "actor" / "shard_0.bin").unlink(), "actor/shard_0.bin is missing"),
        (lambda f: (f / "MANIFEST.json").unlink(), "it has no MANIFEST.json, so its save never finished"),
        (lambda f: (f / "MANIFEST.json").write_text("{not json"), "its MANIFEST.json is unreadable"),
    ],
)
def test_auto_skips_damaged_checkpoints_and_says_why(tmp_path, capsys, damage, reason):
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    damage(newest)
    assert find_resume_dir(tmp_path, "auto") == tmp_path / "global_step_1"
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint {newest}: " in err and reason in err
    assert "latest_checkpointed_iteration.txt names step 2, but the newest whole checkpoint is step 1" in err
    with pytest.raises(CheckpointError, match="is not a complete checkpoint folder: .*" + reason.split(",")[0][:20]):
        find_resume_dir(tmp_path, str(newest))


def test_auto_with_only_damaged_checkpoints_stops_instead_of_starting_over(tmp_path, capsys):
    (save(tmp_path, 1) / "driver_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"found checkpoints under .* but none is whole:\n  global_step_1: files "
                                              r"differ from its manifest: driver_state.json has 2 bytes"):
        find_resume_dir(tmp_path, "auto", warn=False)
    assert capsys.readouterr().err == ""
    assert find_resume_dir(tmp_path, "disable") is None
    # A save killed before its rename leaves no step folder: that run simply starts over.
    assert find_resume_dir(tmp_path / "fresh", "auto") is None


def test_retention_keeps_the_newest_whole_checkpoints(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "global_step_3" / "MANIFEST.json").unlink()  # step 3 is not whole: it does not count
    save(tmp_path, 4, keep=2)
    remaining = sorted(p.name for p in tmp_path.glob("global_step_*"))
    assert remaining == ["global_step_2", "global_step_3", "global_step_4"]
    assert find_resume_dir(tmp_path, "auto").name == "global_step_4"


def test_saving_a_step_again_replaces_it_whole_and_clears_killed_saves(tmp_path):
    save(tmp_path, 1)
    stale = tmp_path / ".global_step_7.tmp"  # what a save killed by SIGKILL leaves behind
    stale.mkdir()
    save(tmp_path, 1)
    assert checkpoint_problem(tmp_path / "global_step_1") is None and not stale.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
