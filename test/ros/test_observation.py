"""ObservationAssembler: newest image per camera, state matching, staleness, ordering (no ROS)."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.streams.observation import AssemblerConfig, ObservationAssembler, Verdict

SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


def img(value: int) -> np.ndarray:
    return np.full((4, 6, 3), value, np.uint8)


class Decoder:
    """Payloads are ints (pixel value) or Exceptions (decode errors); records what was decoded."""

    def __init__(self):
        self.calls = []

    def __call__(self, payload):
        self.calls.append(payload)
        if isinstance(payload, Exception):
            raise payload
        return img(payload)


def make(cameras=SLOTS[:2], **kw):
    dec = Decoder()
    cfg = AssemblerConfig(
        slots=SLOTS, cameras=cameras, **{"state_tolerance_s": 0.05, "camera_max_age_s": 0.5, "time_jump_s": 2.0, **kw}
    )
    return ObservationAssembler(cfg, dec, instruction="pick"), dec


def test_newest_images_nearest_state_and_stamp():
    a, dec = make()
    a.add_state(10.00, [1.0, 2.0])
    a.add_state(10.03, [3.0, 4.0])
    a.add_image("base_0_rgb", 10.00, 1)
    a.add_image("base_0_rgb", 10.04, 2)  # newer image supersedes the first one
    a.add_image("left_wrist_0_rgb", 10.02, 3)
    res = a.assemble()
    obs = res.observation
    assert res.waiting is None and obs is not None
    assert set(obs.images) == set(SLOTS)
    assert obs.images["base_0_rgb"][0, 0, 0] == 2 and obs.images["left_wrist_0_rgb"][0, 0, 0] == 3
    assert obs.images["right_wrist_0_rgb"] is None  # no camera configured: masked
    np.testing.assert_array_equal(obs.state, [3.0, 4.0])  # nearest to the newest image (10.04)
    assert obs.stamp == pytest.approx(10.04) and obs.instruction == "pick"
    assert dec.calls == [2, 3]  # lazily: the superseded image was never decoded


def test_repeat_without_new_input_gives_no_frame():
    a, _ = make(cameras=SLOTS[:1])
    a.add_state(1.0, [0.0])
    a.add_image("base_0_rgb", 1.0, 5)
    assert a.assemble().observation is not None
    again = a.assemble()
    assert again.observation is None and again.waiting is None
    assert a.assemble(require_new=False).observation is not None
    a.add_state(1.01, [1.0])  # a state farther from the image than the used one: still a repeat
    assert a.assemble().observation is None
    a.add_image("base_0_rgb", 1.02, 6)  # a new image makes a new frame, with the nearest state
    obs = a.assemble().observation
    assert obs.state[0] == 1.0 and obs.stamp == pytest.approx(1.02)


def test_stale_camera_is_masked_and_reported():
    a, _ = make()
    a.add_image("left_wrist_0_rgb", 9.0, 7)
    a.add_image("base_0_rgb", 10.0, 1)
    a.add_state(10.0, [0.0])
    res = a.assemble()
    assert res.observation.images["left_wrist_0_rgb"] is None
    assert res.observation.images["base_0_rgb"] is not None
    assert any("left_wrist_0_rgb" in n and "stale" in n for n in res.stale)


def test_camera_never_received_is_reported():
    a, _ = make()
    a.add_image("base_0_rgb", 10.0, 1)
    a.add_state(10.0, [0.0])
    res = a.assemble()
    assert res.observation is not None
    assert any("left_wrist_0_rgb" in n and "no image received" in n for n in res.stale)


def test_no_state_no_image_state_too_far():
    a, _ = make()
    res = a.assemble()
    assert res.observation is None and res.waiting.startswith("waiting for camera images")
    a.add_image("base_0_rgb", 10.0, 1)
    res = a.assemble()
    assert res.observation is None and res.waiting == "waiting for joint states"
    a.add_state(9.8, [0.0])
    res = a.assemble()
    assert res.observation is None and "within 0.05 s" in res.waiting
    assert a.status()[0] is not None


def test_all_cameras_stale_means_waiting():
    a, _ = make(cameras=SLOTS[:1])
    a.add_image("base_0_rgb", 10.0, 1)
    a.add_state(10.0, [0.0])
    assert a.assemble().observation is not None
    a.add_state(11.0, [0.0])  # time moves on through the joint states only
    res = a.assemble()
    assert res.observation is None and "stale" in res.waiting
    waiting, notes = a.status()
    assert "stale" in waiting and any("stale" in n for n in notes)


def test_out_of_order_messages_are_dropped_and_counted():
    a, _ = make()
    assert a.add_image("base_0_rgb", 10.0, 1) is Verdict.ACCEPTED
    assert a.add_image("base_0_rgb", 9.9, 2) is Verdict.OUT_OF_ORDER
    assert a.add_image("base_0_rgb", 10.0, 3) is Verdict.OUT_OF_ORDER  # duplicate stamp
    assert a.add_state(10.0, [0.0]) is Verdict.ACCEPTED
    assert a.add_state(9.5, [9.0]) is Verdict.OUT_OF_ORDER
    assert a.counts()["dropped_out_of_order"] == 3
    obs = a.assemble().observation
    assert obs.images["base_0_rgb"][0, 0, 0] == 1 and obs.state[0] == 0.0


def test_backwards_time_jump_clears_buffers():
    a, _ = make()
    a.add_image("base_0_rgb", 100.0, 1)
    a.add_image("left_wrist_0_rgb", 100.0, 2)
    a.add_state(100.0, [5.0])
    assert a.assemble().observation is not None
    assert a.add_image("base_0_rgb", 3.0, 3) is Verdict.TIME_JUMP  # e.g. a bag loop
    assert a.counts()["time_jumps"] == 1
    res = a.assemble()
    assert res.observation is None and res.waiting == "waiting for joint states"
    assert a.add_state(3.0, [6.0]) is Verdict.ACCEPTED  # its buffer was cleared too
    obs = a.assemble().observation
    assert obs.stamp == 3.0 and obs.state[0] == 6.0
    assert obs.images["left_wrist_0_rgb"] is None  # the old camera image is gone


def test_decode_error_is_reported_and_previous_good_image_used():
    a, dec = make(cameras=SLOTS[:1])
    a.add_image("base_0_rgb", 10.0, 4)
    a.add_state(10.0, [0.0])
    assert a.assemble().observation is not None
    a.add_image("base_0_rgb", 10.1, ValueError("unsupported image encoding"))
    a.add_state(10.1, [1.0])
    res = a.assemble(require_new=False)
    assert res.errors and "unsupported image encoding" in res.errors[0]
    assert res.observation.images["base_0_rgb"][0, 0, 0] == 4  # previous good one, still fresh
    assert a.counts()["image_decode_errors"] == 1


def test_decode_error_without_good_image_masks_the_slot():
    a, _ = make()
    a.add_image("base_0_rgb", 10.0, 1)
    a.add_image("left_wrist_0_rgb", 10.0, ValueError("image data too short"))
    a.add_state(10.0, [0.0])
    res = a.assemble()
    assert res.observation.images["left_wrist_0_rgb"] is None
    assert any("no decodable image" in n for n in res.stale)


def test_config_rejects_unknown_camera_slot():
    with pytest.raises(ValueError, match="not model slots"):
        AssemblerConfig(slots=SLOTS, cameras=("front",))


def test_cameras_behind_counts_live_cameras_without_a_new_image():
    a, _ = make()
    assert a.cameras_behind() == 0
    a.add_image("base_0_rgb", 10.0, 1)
    a.add_image("left_wrist_0_rgb", 10.0, 2)
    a.add_state(10.0, [0.0])
    assert a.cameras_behind() == 0  # both delivered since the last frame
    assert a.assemble().observation is not None
    a.add_image("base_0_rgb", 10.033, 3)
    assert a.cameras_behind() == 1  # left wrist is live but has not sent this instant yet
    a.add_image("left_wrist_0_rgb", 10.034, 4)
    assert a.cameras_behind() == 0
    a.assemble()
    a.add_image("base_0_rgb", 11.0, 5)  # left wrist is now 1 s old: dead, not waited for
    assert a.cameras_behind() == 0
