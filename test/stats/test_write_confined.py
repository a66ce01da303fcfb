"""``norm_stats --out`` into a LeRobot folder writes only inside it: a pipeline JSON whose
``state_file`` points elsewhere is refused before anything is written (oxygen_ros/stats/write.py)."""

from __future__ import annotations

import json

import pytest

from oxygen_ros.core.model.keymap import CheckpointError
from oxygen_ros.core.types import NormStats
from oxygen_ros.stats.write import write_stats

STATS = {"state": NormStats.identity(2), "actions": NormStats.identity(2)}


@pytest.mark.parametrize("target", ["../evil.safetensors", "{tmp}/evil.safetensors"])
def test_state_file_outside_the_folder_is_refused(tmp_path, target):
    folder = tmp_path / "ckpt"
    write_stats(folder, STATS, layout="lerobot")  # a valid LeRobot pipeline, then made hostile
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    target = target.format(tmp=tmp_path)  # relative with .., or absolute: both outside the folder
    pre["steps"][2]["state_file"] = target
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(CheckpointError, match=r"policy_preprocessor\.json steps\[2\]\.state_file: "):
        write_stats(folder, STATS, layout="lerobot")
    assert not (folder / target).exists() and not (tmp_path / "evil.safetensors").exists()
    (folder / "policy_preprocessor.json").write_text('{"steps": "x"}')
    with pytest.raises(CheckpointError, match=r"'steps' must be a list"):
        write_stats(folder, STATS, layout="lerobot")
