"""The closed loop's repeated checkable ask (schedule, answers report) and its episode video
(overlays, MP4 writer), without ROS."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxygen_ros.sim.closed_loop.asks import AskSchedule, answers_report, is_checkable
from oxygen_ros.sim.closed_loop.video import MARKER_FRAMES, EpisodeVideo, FrameInfo, draw_overlay, overlay_lines

cv2 = pytest.importorskip("cv2")


def test_schedule_spaces_the_asks_and_stops_at_the_time_limit():
    s = AskSchedule(3, first_frame=1, every_frames=3, before_s=3.0)
    assert not s.due(0, False, math.nan)  # no chunk yet
    assert s.due(1, False, math.nan)  # before the episode starts: the arm has not moved
    s.mark_sent(1, math.nan)
    assert not s.due(3, True, 0.5) and s.due(4, True, 0.6)
    s.mark_sent(16, 0.6)  # sent late (the node's topics matched only then): spacing from here
    assert not s.due(18, True, 0.7) and s.due(19, True, 0.7)
    assert not s.due(9, True, 3.0)  # the limit: the cube may be touched from here on
    assert s.closed and not s.due(9, True, 0.1)  # never again, even on an out-of-order status
    assert s.sent == [{"at_frame": 1, "episode_time_s": None}, {"at_frame": 16, "episode_time_s": 0.6}]
    done = AskSchedule(1)
    done.mark_sent(1, 0.0)
    assert not done.due(100, False, math.nan)  # all sent


@pytest.mark.parametrize("kw", [{"count": 0}, {"count": 2, "every_frames": 0}, {"count": 1, "before_s": 0.0}])
def test_schedule_refuses_bad_values(kw):
    with pytest.raises(ValueError):
        AskSchedule(**kw)


def test_answers_report_matches_in_order_and_counts_missing():
    assert is_checkable("where is the cube") and not is_checkable("What do you see?") and not is_checkable("")
    s = AskSchedule(4, before_s=3.0)
    for i in range(3):
        s.mark_sent(1 + 3 * i, 0.2 * i)
    msgs = [
        "[request 1 waiting: no camera input yet; it waits up to 30.0 s (engine.max_queue_wait_s)]",
        "[#1 Q: Where is the cube?] Back left.",
        "[#2 Q: Where is the cube?] back right [request 2 expired: waited 30.0 s]",
        "[#7] a periodic text",
    ]
    r = answers_report(s, msgs, "back left", "Where is the cube?")
    assert (r["requested"], r["asked"], r["answered"], r["correct"], r["unmatched"]) == (4, 3, 2, 1, 1)
    assert r["accuracy"] == pytest.approx(1 / 3) and r["truth"] == "back left"
    assert [it["answer"] for it in r["items"]] == ["Back left.", msgs[2][len("[#2 Q: Where is the cube?] ") :], None]
    assert [it["correct"] for it in r["items"]] == [True, False, False] and len(r["sent"]) == 3


def test_overlay_lines_and_drawing():
    info = FrameInfo(1.234, 0.5, 7, True, "front l\u00e9ft " + "x" * 200)
    top, lines = overlay_lines(info, width_chars=40)
    assert top.startswith("video  1.23 s  episode 0.50 s  chunks 7")
    assert len(lines) == 2 and lines[0].startswith("A: front l?ft") and lines[1].endswith("...")
    assert overlay_lines(FrameInfo(0.0, None, 0, False), 40) == ("video  0.00 s  episode - s  chunks 0", [])
    rgb = np.zeros((24, 32, 3), np.uint8)
    bgr = draw_overlay(rgb, info)
    assert bgr.shape == (24 * 15, 32 * 15, 3) and bgr.dtype == np.uint8  # scaled up to >= 480 wide
    assert bgr[16, 32 * 15 - 16].tolist() == [0, 0, 255]  # the red new-chunk disc (BGR)
    plain = draw_overlay(rgb, FrameInfo(0.0, None, 0, False))
    assert plain[16, 32 * 15 - 16].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="uint8"):
        draw_overlay(np.zeros((4, 4), np.uint8), info)


def test_episode_video_writes_an_mp4_frame_by_frame(tmp_path):
    with pytest.raises(ValueError, match=r"\.mp4"):
        EpisodeVideo(tmp_path / "v.gif", 10.0)
    with pytest.raises(ValueError):
        EpisodeVideo(tmp_path / "v.mp4", 0.0)
    v = EpisodeVideo(tmp_path / "sub" / "v.mp4", 10.0, max_frames=10)
    infos = []
    for i in range(8):
        info = v.frame_info(100.0 + 0.1 * i, 0.1 * i, chunks=1 if i < 4 else 2, answer="back left" if i > 2 else "")
        infos.append(info)
        v.add(np.full((120, 160, 3), 20 * i, np.uint8), info)
    assert v.add(np.zeros((50, 90, 3), np.uint8), infos[-1]) is False  # another size: dropped
    assert v.add(np.zeros((5, 5), np.uint8), infos[-1]) is False  # not an image: dropped
    # the marker: on for MARKER_FRAMES frames after each new chunk
    assert [i.new_chunk for i in infos] == [True] * MARKER_FRAMES + [False] + [True] * MARKER_FRAMES + [False]
    assert infos[3].sim_time_s == pytest.approx(0.3)
    rep = v.close()
    assert rep["frames"] == 8 and rep["dropped"] == 2 and rep["size"] == [480, 360] and rep["error"] == ""
    cap = cv2.VideoCapture(rep["path"])
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    assert n == 8
    capped = EpisodeVideo(tmp_path / "c.mp4", 10.0, max_frames=1)
    assert capped.add(np.zeros((8, 8, 3), np.uint8), infos[0]) and not capped.add(
        np.zeros((8, 8, 3), np.uint8), infos[1]
    )
    assert capped.close()["dropped"] == 1
    empty = EpisodeVideo(tmp_path / "none.mp4", 10.0).close()
    assert empty["path"] is None and empty["error"] == "no camera frame received"
