"""Demonstrations -> training frames -> a checkpoint the policy loads: ``record_demos`` and
``train`` end to end on a few short episodes, and their refusals of unusable input."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.core.config import get_preset
from oxygen_ros.train.dataset import DemoError, episode_folders, load_demos, read_episode
from oxygen_ros.train.train import TrainConfig, build_parser, config_from_args
from oxygen_ros.train.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "aloha_sim_sample"


def _card_config(card: str) -> TrainConfig:
    """The config that the model card's ``train`` command line parses to."""
    (line,) = [x for x in card.splitlines() if x.startswith("train ")]
    return config_from_args(build_parser().parse_args(shlex.split(line)[1:]))


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    pytest.importorskip("mujoco")
    pytest.importorskip("gym_aloha")
    from oxygen_ros.sim.demos import main as demos_main

    out = tmp_path_factory.mktemp("demos") / "set"
    # two spawned workers, from a process that already runs torch threads (a forked one deadlocked)
    assert (
        demos_main(["--out", str(out), "--episodes", "3", "--seconds", "1", "--first-seed", "7", "--workers", "2"]) == 0
    )
    return out


@pytest.mark.slow
def test_record_demos_writes_bags_with_language_targets(demos):
    folders = episode_folders(demos)
    assert [f.name for f in folders] == ["episode_0000", "episode_0001", "episode_0002"]
    index = json.loads((demos / "demos.json").read_text())
    assert index["seeds"] == [7, 8, 9] and index["size"] == [120, 160]
    from rosbags.highlevel import AnyReader

    with AnyReader([folders[0]]) as reader:
        topics = {c.topic: c.msgcount for c in reader.connections}
    assert topics["/language/cube_region"] == topics["/cam_high/image_raw/compressed"] == 10
    assert topics["/language/phase"] == 10 and topics["/commanded_action"] == 50
    # a rerun keeps the finished episodes (resume), it does not record them again
    before = (folders[0] / "metadata.yaml").stat().st_mtime_ns
    from oxygen_ros.sim.demos import main as demos_main

    assert demos_main(["--out", str(demos), "--episodes", "3", "--seconds", "1", "--first-seed", "7"]) == 0
    assert (folders[0] / "metadata.yaml").stat().st_mtime_ns == before
    # ... but only as asked before: other seeds or another start jitter would mix two datasets
    again = ["--out", str(demos), "--episodes", "3", "--seconds", "1"]
    assert demos_main([*again, "--first-seed", "8"]) == 2
    assert demos_main([*again, "--first-seed", "7", "--start-jitter", "0.2"]) == 2
    assert demos_main([*again, "--first-seed", "7", "--action-noise", "0.05"]) == 2
    assert demos_main(["--out", str(demos), "--episodes", "3", "--action-noise", "0.2"]) == 2
    assert demos_main(["--out", str(demos), "--episodes", "3", "--start-jitter", "0.9"]) == 2
    assert json.loads((demos / "demos.json").read_text()) == index


@pytest.mark.slow
def test_frames_are_what_the_policy_sees_and_chunks_follow_the_node_time_base(demos):
    from oxygen_ros.core.processing import prepare_images

    cfg = get_preset("pi05-tiny")
    data = load_demos(demos, cfg, progress=False)
    assert len(data) == 30 and data.images.shape == (30, 3, 3, 56, 56) and data.images.dtype == np.uint8
    assert data.commands.shape == (3, 50, 14)
    # images: the node's decode + the policy's resize, stored exactly (u / 255 * 2 - 1)
    from oxygen_ros.bags.reader import BagInput
    from oxygen_ros.ros.convert.images import compressed_to_rgb

    with BagInput(episode_folders(demos)[0]) as bag:
        topic, _, raw = next(bag.messages(["/cam_high/image_raw/compressed"]))
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import CompressedImage

    rgb = compressed_to_rgb(deserialize_message(raw, CompressedImage))
    pixels, _ = prepare_images({"base_0_rgb": rgb}, cfg.image_slots, cfg.vision.image_size)
    np.testing.assert_allclose(data.images[0, 0] * np.float32(2 / 255) - 1, pixels[0], atol=1e-6)
    # point i of the chunk of the frame at control step k is the command of step k + 1 + i
    rows = np.array([0, 5, 9])
    chunks = data.chunks(rows, 10)
    for r, c in zip(rows, chunks, strict=True):
        k = int(data.step[r])
        want = data.commands[0, np.minimum(np.arange(k + 1, k + 11), 49)]
        np.testing.assert_array_equal(c, want)
    assert data.step[:3].tolist() == [0, 5, 10]  # 10 Hz camera, 50 Hz control
    # the cached read gives the same frames
    again = load_demos(demos, cfg, progress=False)
    np.testing.assert_array_equal(again.images, data.images)
    assert again.instructions == data.instructions == ["pick up the red cube"] * 3


@pytest.mark.slow
def test_the_placement_checks_oracle_chunk_is_the_demonstrations_label(demos):
    # the placement check judges a first chunk against the oracle; that reference must be the label the
    # policy was trained on for frame 0 of the same placement (same time base), or skill is biased
    from oxygen_ros.core.policy import Pi05Policy
    from oxygen_ros.train.placement import placement_check

    # chunks of 48 points: the 1 s episodes hold commands 0 .. 49, the labels of frame 0 are 1 .. 48
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", seed=0, config_overrides={"action_horizon": 48})
    data = load_demos(demos, policy.cfg, progress=False)
    check = placement_check(policy, [7, 8])  # the demos' seeds 7 and 8: no jitter, no action noise
    assert check.oracle_chunks.shape == (2, 48, 14)
    for episode in (0, 1):
        row = np.flatnonzero((data.episode == episode) & (data.step == 0))
        label = data.chunks(row, 48)[0]
        assert np.abs(np.diff(label, axis=0)).max() > 1e-3  # the arm moves within it: a shift would show
        np.testing.assert_allclose(check.oracle_chunks[episode], label, atol=1e-6)


@pytest.mark.slow
def test_train_writes_a_checkpoint_the_policy_loads(demos, tmp_path, capsys):
    from oxygen_ros.core.policy import Pi05Policy

    out = tmp_path / "ckpt"
    args = ["--demos", str(demos), "--out", str(out), "--preset", "pi05-tiny", "--steps", "4", "--held-out", "1"]
    assert train_main([*args, "--batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    assert "held-out open-loop MAE" in printed and "placement check over 20 unseen placements" in printed
    for name in ("model.safetensors", "train_log.json", "loss.png", "tokenizer.json"):
        assert (out / name).is_file(), name
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 4 and log["episodes"] == 3 and log["train_frames"] == 20
    # the model card: the run's figures, and a command that repeats exactly this run
    card = (out / "README.md").read_text()
    assert "preset `pi05-tiny`" in card and "3 episodes, the last 1 held out" in card
    assert f"{log['held_out']['model_mae']:.4f} (hold the state: {log['held_out']['hold_mae']:.4f})" in card
    assert f"answers {int(log['placement']['answers_right'])}/20 right" in card
    assert _card_config(card) == TrainConfig(**log["config"])
    # judged with the render the demonstrations had (their 10 Hz cameras, shadows on)
    assert log["camera_rate_hz"] == 10.0
    assert "--sim-param=render_shadows:=true" in card and "--loop-arg=--camera-rate-hz=10 " not in card
    assert "--loop-arg=--camera-rate-hz=10\n" in card
    assert np.isfinite([e["flow"] for e in log["log"]]).all()
    assert log["placement"]["placements"] == 20 and np.isfinite(list(log["placement"].values())).all()
    policy = Pi05Policy.from_pretrained(out, device="cpu")
    data = load_demos(demos, get_preset("pi05-tiny"), progress=False)
    np.testing.assert_allclose(policy.norm_stats["state"].q99, np.quantile(data.state, 0.99, axis=0), rtol=1e-5)
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.slow
def test_a_warm_start_begins_from_the_checkpoint_with_its_norm_stats(demos, tmp_path, capsys):
    from safetensors.numpy import load_file

    first = tmp_path / "first"
    base = ["--demos", str(demos), "--steps", "3", "--held-out", "1", "--batch-size", "4"]
    assert train_main([*base, "--out", str(first), "--preset", "pi05-tiny"]) == 0
    # at learning rate 0 the run changes nothing: the weights it writes are exactly the ones it started from,
    # and the norm stats stay the checkpoint's although this run reads fewer episodes (other stats)
    again = tmp_path / "again"
    assert train_main([*base, "--out", str(again), "--init", str(first), "--lr", "0", "--max-episodes", "2"]) == 0
    before, after = load_file(first / "model.safetensors"), load_file(again / "model.safetensors")
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    stats = "assets/robot/norm_stats.json"
    assert (again / stats).read_text() == (first / stats).read_text()
    # the run's config names the checkpoint's model, not the default preset it never built
    logged = json.loads((again / "train_log.json").read_text())["config"]
    assert logged["init"] == str(first) and logged["preset"] == "pi05-tiny"
    card = (again / "README.md").read_text()
    assert f"warm start from `{first}`" in card and "preset `pi05-tiny`" in card
    # its command repeats the warm start (without --preset, which train refuses beside --init)
    assert _card_config(card) == replace(TrainConfig(**logged), preset=TrainConfig.preset)
    capsys.readouterr()
    # refusals: no such checkpoint (exit 2, nothing written); a preset beside the checkpoint's own config
    assert train_main([*base, "--out", str(tmp_path / "x"), "--init", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as exit_:
        train_main([*base, "--out", str(tmp_path / "x"), "--init", str(first), "--preset", "pi05-tiny"])
    assert exit_.value.code == 2 and "leave out --preset" in capsys.readouterr().err


@pytest.mark.slow
def test_train_mixes_rendered_start_frames_into_every_batch(demos, tmp_path, capsys, monkeypatch):
    import oxygen_ros.train.train as train_mod

    seen: list[np.ndarray] = []
    batch = train_mod._Batcher.batch

    def _spy(self, rows, rng, cube_question_only=False):
        seen.append((np.asarray(rows).copy(), cube_question_only))
        return batch(self, rows, rng, cube_question_only)

    monkeypatch.setattr(train_mod._Batcher, "batch", _spy)
    out = tmp_path / "ckpt"
    args = ["--demos", str(demos), "--out", str(out), "--preset", "pi05-tiny", "--steps", "3", "--held-out", "1"]
    assert train_main([*args, "--batch-size", "4", "--start-frames", "5", "--start-frame-share", "0.5"]) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert log["start_frames"] == 5 and log["train_frames"] == 20 and log["episodes"] == 3
    # 30 recorded frames (20 trained, 10 held out), then the 5 start frames: 2 of every 4 rows
    assert len(seen) == 3
    assert all(len(r) == 4 and (r[:2] < 20).all() and (r[2:] >= 30).all() and not only for r, only in seen)
    capsys.readouterr()
    for bad in (["--start-frames", "-1"], ["--start-frame-share", "1"]):
        assert train_main([*args, *bad]) == 2
        assert "--start-frame" in capsys.readouterr().err
    assert train_main([*args, "--start-frames", "2", "--start-frame-jitter", "0.9"]) == 2
    assert "start jitter" in capsys.readouterr().err
    for flag in ("--vision-first-steps", "--answer-first-steps"):
        for bad in ([flag, "-1"], [flag, "2"]):  # the second: no start frames to train on
            assert train_main([*args, *bad]) == 2
            assert flag in capsys.readouterr().err


@pytest.mark.slow
def test_the_first_stages_train_vision_then_the_cube_answer_on_start_frames(demos, tmp_path, monkeypatch):
    """The vision stage first, on the start frames at the reset; then the answer-first steps: those
    frames only, the cube question on every row, and no flow loss in the gradient (the action
    expert and its projections untouched); then the usual mix."""
    import torch

    import oxygen_ros.train.objective as objective
    import oxygen_ros.train.train as train_mod
    import oxygen_ros.train.vision_stage as vision_stage

    seen, losses, steps, frame_steps = [], [], [], np.zeros(0, dtype=np.int64)
    batch, loss = train_mod._Batcher.batch, objective.co_training_loss

    def _spy(self, rows, rng, cube_question_only=False):
        b = batch(self, rows, rng, cube_question_only)
        seen.append((np.asarray(rows).copy(), cube_question_only, b))
        steps.append(self.data.step[rows].copy())
        frame_steps.resize(self.data.step.shape, refcheck=False)
        frame_steps[:] = self.data.step
        return b

    def _loss(model, b, noise, t, text_weight=1.0, flow_weight=1.0):
        parts = loss(model, b, noise, t, text_weight, flow_weight)
        grads = torch.autograd.grad(parts.loss, [model.action_out_proj.weight], allow_unused=True, retain_graph=True)
        losses.append((flow_weight, grads[0] is None or not bool(grads[0].any())))
        return parts

    vision_rows = []
    stage = vision_stage.train_vision_stage

    def _vision(model, images, regions, rows, *a, **k):
        vision_rows.append(np.asarray(rows).copy())
        assert not seen  # before any other batch
        return stage(model, images, regions, rows, *a, **k)

    monkeypatch.setattr(train_mod._Batcher, "batch", _spy)
    monkeypatch.setattr(objective, "co_training_loss", _loss)
    monkeypatch.setattr(vision_stage, "train_vision_stage", _vision)
    out = tmp_path / "ckpt"
    args = ["--demos", str(demos), "--out", str(out), "--preset", "pi05-tiny", "--steps", "8", "--held-out", "1"]
    first = ["--vision-first-steps", "3", "--answer-first-steps", "6"]
    assert train_main([*args, "--batch-size", "4", "--start-frames", "5", *first]) == 0
    assert [only for _, only, _ in seen] == [True] * 6 + [False] * 2
    assert all((rows >= 30).all() for rows, _, _ in seen[:6])  # start frames only,
    assert all((s == 0).all() for s in steps[:6])  # at the reset (the same state for every placement)
    assert (frame_steps[30:] > 0).any()  # though not every start frame is
    assert all((rows < 20).sum() == 3 for rows, _, _ in seen[6:])  # then the usual mix (a quarter of 4)
    for _, _, b in seen[:6]:  # every row asks where the cube is: its answer is one of the regions
        assert b.text_target.any(-1).all()
        assert all(b.text[j, 0] == seen[0][2].text[0, 0] for j in range(len(b.text)))
    assert losses == [(0.0, True)] * 6 + [(1.0, False)] * 2
    log = json.loads((out / "train_log.json").read_text())
    assert log["config"]["answer_first_steps"] == 6 and log["vision_stage"]["steps"] == 3
    # the vision stage trained on the start frames at the reset, and only there
    assert len(vision_rows) == 1 and (vision_rows[0] >= 30).all() and (frame_steps[vision_rows[0]] == 0).all()
    assert len(vision_rows[0]) == int((frame_steps[30:] == 0).sum())


@pytest.mark.slow
def test_train_refuses_unusable_demonstrations(demos, tmp_path, capsys):
    base = ["--out", str(tmp_path / "c"), "--preset", "pi05-tiny", "--steps", "1"]
    assert train_main(["--demos", str(tmp_path / "none"), *base]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert train_main(["--demos", str(tmp_path / "empty"), *base]) == 2
    assert "no episode bag" in capsys.readouterr().err
    assert train_main(["--demos", str(demos), *base, "--held-out", "3"]) == 2
    assert "held out" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_bag_without_language_targets_is_refused(tmp_path):
    from bag_edit import edit_bag

    folder = tmp_path / "set" / "episode_0000"
    folder.parent.mkdir()
    edit_bag(SAMPLE, folder, lambda topic, t, raw: [] if topic.startswith("/language/") else [(topic, t, raw)])
    with pytest.raises(DemoError, match="/language/cube_region"):
        read_episode(folder, get_preset("pi05-tiny").image_slots, 56)
