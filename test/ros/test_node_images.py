"""Image input over DDS: every supported encoding, padded rows and CompressedImage give the same
model input for the same picture; bad images give a diagnostic, never a crash.

The node (own process) runs with ``debug_model_input``, so it publishes what the model sees per
slot on ``/oxygen/model_input/<slot>`` (resized with padding, rgb8, stamped with the observation).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from ros_helpers import RosPeer, node_process
from sensor_msgs.msg import CompressedImage, Image, JointState

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.processing import resize_with_pad
from oxygen_ros.ros.convert import image_to_rgb, rgb_to_compressed_msg, rgb_to_image_msg, sec_to_stamp
from oxygen_ros.ros.qos import sensor_data_qos

pytestmark = pytest.mark.ros
SIZE = get_preset("pi05-tiny").vision.image_size
RED = np.zeros((48, 64, 3), np.uint8)
RED[..., 0] = 255
GREY = np.full((30, 40, 3), 100, np.uint8)
PARAMS = {
    "model": "pi05-tiny",
    "joint_names": ["j1", "j2"],
    "debug_model_input": True,
    "cameras.base_0_rgb.topic": "cam_raw",
    "cameras.left_wrist_0_rgb.topic": "cam_jpeg",
    "cameras.left_wrist_0_rgb.type": "compressed",
    "diagnostics_period_s": 0.2,
    "task_names": ["conversation"],
    "num_threads": 1,
}


def model_view(rgb: np.ndarray) -> np.ndarray:
    """What the node publishes for ``rgb``: resize_with_pad to the model size, back to uint8."""
    x = resize_with_pad(rgb, SIZE)
    return np.clip(np.rint((x + 1.0) * 127.5), 0, 255).astype(np.uint8)


def padded(msg: Image, pad: int) -> Image:
    """The same image with ``pad`` junk bytes at the end of every row."""
    rows = np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.step)
    junk = np.full((msg.height, pad), 0x5A, np.uint8)
    out = Image(
        header=msg.header,
        height=msg.height,
        width=msg.width,
        encoding=msg.encoding,
        is_bigendian=0,
        step=msg.step + pad,
    )
    out.data = np.hstack([rows, junk]).tobytes()
    return out


class Rig:
    def __init__(self, peer: RosPeer):
        self.peer = peer
        q = sensor_data_qos(5)
        self.raw = peer.node.create_publisher(Image, "cam_raw", q)
        self.jpeg = peer.node.create_publisher(CompressedImage, "cam_jpeg", q)
        self.joints = peer.node.create_publisher(JointState, "joint_states", q)
        for slot in ("base_0_rgb", "left_wrist_0_rgb"):
            peer.collect(Image, f"/oxygen/model_input/{slot}", sensor_data_qos(50))
        peer.collect(DiagnosticArray, "/diagnostics")

    def send(self, pub, msg, stamp: float) -> None:
        msg.header.stamp = sec_to_stamp(stamp)
        self.joints.publish(JointState(header=msg.header, name=["j1", "j2"], position=[0.1, 0.2]))
        pub.publish(msg)

    def model_input(self, slot: str, pub, msg, timeout: float = 10.0) -> np.ndarray:
        """Publish ``msg`` (re-stamped) until the node's model input for it comes back."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            stamp = time.time()
            self.send(pub, msg, stamp)
            want = sec_to_stamp(stamp)
            got = self.peer.wait_for(
                lambda want=want: [
                    m for m in self.peer.messages(f"/oxygen/model_input/{slot}") if m.header.stamp == want
                ],
                0.5,
            )
            if got:
                return image_to_rgb(got[0])
        raise AssertionError(f"no model input for {slot} within {timeout} s")

    def bad_input_diagnostic(self, pub, msg, text: str, timeout: float = 10.0) -> str:
        """Publish ``msg`` (best effort: repeatedly) until a diagnostic contains ``text``."""

        def find():
            for m in reversed(self.peer.messages("/diagnostics")):
                for s in m.status:
                    if text in s.message:
                        return s.message
            return None

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.send(pub, msg, time.time())
            found = self.peer.wait_for(find, 1.0)
            if found:
                return found
        raise AssertionError(f"no diagnostic containing {text!r}")


def test_encodings_compression_and_bad_images(tmp_path):
    with domain_id() as dom:
        peer = RosPeer(dom, "image_tester")
        try:
            rig = Rig(peer)
            with node_process(dom, tmp_path / "node.log", params=PARAMS) as node:
                # active, and its model-input publishers matched this peer (its /diagnostics)
                peer.wait_outputs_matched(
                    ["/oxygen/model_input/base_0_rgb", "/oxygen/model_input/left_wrist_0_rgb"], 90
                )
                assert peer.wait_for(
                    lambda: rig.raw.get_subscription_count() > 0 and rig.jpeg.get_subscription_count() > 0, 30
                )
                expected = model_view(RED)
                assert (expected[SIZE // 2, SIZE // 2] == [255, 0, 0]).all()  # red stays red
                raw = {enc: rgb_to_image_msg(RED, enc) for enc in ("rgb8", "bgr8", "rgba8", "bgra8")}
                raw["rgb8+pad"] = padded(raw["rgb8"], 7)
                raw["bgra8+pad"] = padded(raw["bgra8"], 64)
                for name, msg in raw.items():
                    seen = rig.model_input("base_0_rgb", rig.raw, msg)
                    np.testing.assert_array_equal(seen, expected, err_msg=name)
                grey = rig.model_input("base_0_rgb", rig.raw, rgb_to_image_msg(GREY, "mono8"))
                np.testing.assert_array_equal(grey, model_view(GREY))
                png = rig.model_input("left_wrist_0_rgb", rig.jpeg, rgb_to_compressed_msg(RED, "png"))
                np.testing.assert_array_equal(png, expected)
                jpg = rig.model_input("left_wrist_0_rgb", rig.jpeg, rgb_to_compressed_msg(RED, "jpeg", quality=95))
                assert np.abs(jpg.astype(int) - expected.astype(int)).max() <= 12
                # bad images: a diagnostic each, the node carries on
                yuv = rgb_to_image_msg(RED, "rgb8")
                yuv.encoding = "yuv422"
                rig.bad_input_diagnostic(rig.raw, yuv, "unsupported image encoding 'yuv422'")
                short = rgb_to_image_msg(RED, "rgb8")
                short.data = bytes(short.data[: short.step * 10])
                rig.bad_input_diagnostic(rig.raw, short, "image data too short")
                junk = CompressedImage(format="jpeg")
                junk.data = b"not a jpeg at all"
                rig.bad_input_diagnostic(rig.jpeg, junk, "compressed payload is neither PNG nor JPEG")
                odd = np.zeros((17, 31, 3), np.uint8)
                odd[..., 0] = 255  # another resolution is fine: resized with padding
                seen = rig.model_input("base_0_rgb", rig.raw, rgb_to_image_msg(odd, "bgr8"))
                np.testing.assert_array_equal(seen, model_view(odd))
                assert node.poll() is None
            assert node.returncode == 0, (tmp_path / "node.log").read_text()
        finally:
            peer.close()
