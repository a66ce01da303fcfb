"""The ``norm_stats`` tool (oxygen_ros/stats): bags in, loader-readable stats out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sensor_msgs.msg import JointState

from oxygen_ros.bags.writer import BagOutput
from oxygen_ros.core.action_space import ActionSpace, ActionSpaceConfig
from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model import ckpt_files as cf
from oxygen_ros.core.model.weights import random_pretrained, save_pretrained
from oxygen_ros.core.types import NormStats
from oxygen_ros.stats.compute import Episode, model_rows
from oxygen_ros.stats.tool import main

JOINTS = ("j1", "j2", "grip")


def params(tmp: Path, extra: str = "", name: str = "robot.yaml") -> Path:
    p = tmp / name
    p.write_text(f"""/**/oxygen:
  ros__parameters:
    model: pi05-tiny
    joint_names: [j1, j2, grip]
    joint_state_topic: joint_states
    cameras:
      base_0_rgb: {{topic: cam, type: raw}}
{extra}""")
    return p


def known_bag(path: Path, n: int = 40, seed: int = 0, names=JOINTS) -> tuple[np.ndarray, np.ndarray]:
    """A bag with ``n`` states (extra joint, shuffled order) and ``n`` commands 1 ms later."""
    rng = np.random.default_rng(seed)
    states, cmds = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)) * 2 + 1
    out = BagOutput(path)
    for i in range(n):
        t = 1_000_000_000 + i * 20_000_000
        s = JointState(name=["other", *reversed(names)], position=[9.0, *reversed(states[i].tolist())])
        out.write("/joint_states", t, s)
        out.write("/commanded_action", t + 1_000_000, JointState(name=list(names), position=cmds[i].tolist()))
    out.close()
    return states, cmds


def test_openpi_output_loads_and_equals_numpy_quantiles(tmp_path, capsys):
    states, cmds = known_bag(tmp_path / "bag")
    rc = main(
        [
            str(tmp_path / "bag"),
            "--params-file",
            str(params(tmp_path)),
            "--out",
            str(tmp_path / "ckpt"),
            "--progress",
            "on",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    stats, asset = cf.read_openpi_stats(tmp_path / "ckpt")
    assert asset == "robot"
    for name, rows in (("state", states), ("actions", cmds)):
        np.testing.assert_allclose(stats[name].q01, np.quantile(rows, 0.01, axis=0), rtol=1e-6)
        np.testing.assert_allclose(stats[name].q99, np.quantile(rows, 0.99, axis=0), rtol=1e-6)
        np.testing.assert_allclose(stats[name].mean, rows.mean(0), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(stats[name].std, rows.std(0), rtol=1e-5)
    assert "wrote (openpi layout)" in capsys.readouterr().out


def test_lerobot_folder_gets_its_processor_files_updated(tmp_path):
    cfg = get_preset("pi05-tiny")
    ident = {"state": NormStats.identity(3), "actions": NormStats.identity(3)}
    save_pretrained(random_pretrained(cfg), tmp_path / "ckpt", ident, layout="lerobot")
    pre_json = (tmp_path / "ckpt" / cf.PRE_JSON).read_text()
    states, cmds = known_bag(tmp_path / "b1", seed=1)
    states2, cmds2 = known_bag(tmp_path / "b2", seed=2)
    argv = [
        str(tmp_path / "b1"),
        str(tmp_path / "b2"),
        "--params-file",
        str(params(tmp_path)),
        "--out",
        str(tmp_path / "ckpt"),
        "--progress",
        "off",
    ]
    assert main(argv) == 2  # the checkpoint's own stats are there: never replaced without --overwrite
    assert main(argv + ["--overwrite"]) == 0
    stats, info = cf.read_lerobot_stats(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / cf.PRE_JSON).read_text() == pre_json  # pipelines untouched
    np.testing.assert_allclose(
        stats["state"].q99, np.quantile(np.concatenate([states, states2]), 0.99, axis=0), rtol=1e-6
    )
    np.testing.assert_allclose(
        stats["actions"].q01, np.quantile(np.concatenate([cmds, cmds2]), 0.01, axis=0), rtol=1e-6
    )


def test_delta_space_rows_are_chunks_relative_to_the_observation_state():
    space = ActionSpace(ActionSpaceConfig(kind="delta", absolute_joints=("grip",)), JOINTS)
    ep = Episode(
        state_t=np.array([0.0, 1.0]),
        state=np.array([[1.0, 2.0, 0.5], [3.0, 4.0, 0.7]]),
        action_t=np.array([0.5, 1.5, 2.5]),
        actions=np.array([[1.5, 2.5, 0.1], [3.5, 4.5, 0.2], [4.0, 5.0, 0.3]]),
    )
    s, a = model_rows(ep, space, horizon=2)
    np.testing.assert_array_equal(s, ep.state)
    # chunk 0 anchored on state 0: commands 0 and 1; chunk 1 on state 1: commands 1, 2; chunk 2: command 2
    np.testing.assert_allclose(a, [[0.5, 0.5, 0.1], [2.5, 2.5, 0.2], [0.5, 0.5, 0.2], [1.0, 1.0, 0.3], [1.0, 1.0, 0.3]])


def test_missing_topic_and_joints_are_clear_errors(tmp_path, capsys):
    known_bag(tmp_path / "bag")
    p = params(tmp_path)
    assert (
        main(
            [
                str(tmp_path / "bag"),
                "--params-file",
                str(p),
                "--out",
                str(tmp_path / "o"),
                "--action-topic",
                "/nope",
                "--progress",
                "off",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "no topic /nope (--action-topic)" in err and "/commanded_action" in err
    known_bag(tmp_path / "bag2", names=("j1", "j2", "finger"))
    assert (
        main([str(tmp_path / "bag2"), "--params-file", str(p), "--out", str(tmp_path / "o"), "--progress", "off"]) == 2
    )
    err = capsys.readouterr().err
    assert "every message on /joint_states lacks joints ['grip']" in err
    assert (
        main(
            [
                str(tmp_path / "bag"),
                "--params-file",
                str(
                    params(
                        tmp_path,
                        "    action_space:\n      kind: delta\n      absolute_joints: [gripper]\n",
                        "delta.yaml",
                    )
                ),
                "--out",
                str(tmp_path / "o"),
                "--progress",
                "off",
            ]
        )
        == 2
    )
    assert "action_space.absolute_joints: ['gripper'] not in joint_names" in capsys.readouterr().err
    assert (
        main(
            [str(tmp_path / "missing_bag"), "--params-file", str(p), "--out", str(tmp_path / "o"), "--progress", "off"]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_existing_stats_are_kept_unless_overwrite_and_every_replaced_file_is_backed_up(tmp_path, capsys):
    known_bag(tmp_path / "bag")
    argv = [
        str(tmp_path / "bag"),
        "--params-file",
        str(params(tmp_path)),
        "--out",
        str(tmp_path / "ckpt"),
        "--progress",
        "off",
    ]
    stats_file = tmp_path / "ckpt" / "assets" / "robot" / "norm_stats.json"
    stats_file.parent.mkdir(parents=True)
    stats_file.write_text("the checkpoint's own")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds normalisation statistics" in err and str(stats_file) in err and "--overwrite" in err
    assert stats_file.read_text() == "the checkpoint's own"  # untouched
    assert main(argv + ["--overwrite"]) == 0
    out = capsys.readouterr().out
    bak = stats_file.with_name("norm_stats.json.bak")
    assert bak.read_text() == "the checkpoint's own" and f"kept as {bak}" in out
    first = stats_file.read_text()
    assert main(argv + ["--overwrite"]) == 0  # a second overwrite never clobbers the first backup
    assert bak.read_text() == "the checkpoint's own"
    assert stats_file.with_name("norm_stats.json.bak.1").read_text() == first


def test_zero_range_joints_are_warned_about_by_name(tmp_path, capsys):
    known_bag(tmp_path / "bag")
    from oxygen_ros.bags.writer import BagOutput as Out

    out = Out(tmp_path / "still")  # the gripper never moves: 10 s of a parked gripper
    for i in range(40):
        t = 1_000_000_000 + i * 20_000_000
        out.write("/joint_states", t, JointState(name=list(JOINTS), position=[0.01 * i, -0.02 * i, 0.5]))
        out.write("/commanded_action", t, JointState(name=list(JOINTS), position=[0.01 * i, 0.03 * i, 0.5]))
    out.close()
    assert (
        main(
            [
                str(tmp_path / "still"),
                "--params-file",
                str(params(tmp_path)),
                "--out",
                str(tmp_path / "o"),
                "--progress",
                "off",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    assert "warning: zero range (q01 == q99) for 2 dimension(s): state grip, actions grip" in cap.err
    assert cap.out.count("<- zero range") == 2


def test_a_bad_flag_fails_before_torch_or_rclpy_is_imported():
    import subprocess
    import sys

    code = (
        "import sys\nfrom oxygen_ros.stats.tool import main\ntry:\n    main(['--no-such-flag'])\n"
        "except SystemExit as e:\n    print(e.code, sorted(m for m in ('torch', 'rclpy') if m in sys.modules))"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.stdout.strip() == "2 []", got.stderr
