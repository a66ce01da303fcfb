"""End to end over Fast DDS: publisher process -> oxygen node process -> listener (this process).

The node runs the shipped ALOHA-like config (3 compressed cameras, 14 joints) with the pi05-tiny
random-weight preset; a separate publisher process sends cameras + joint states at 30 Hz, the
instruction and an ask. This process listens for action chunks, text and /diagnostics.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from ros_helpers import ALOHA_JOINTS, REPO, RosPeer, node_process, ros_env, stop_process
from oxygen_ros.core.config import get_preset

pytestmark = pytest.mark.ros
H = get_preset('pi05-tiny').action_horizon
PERIOD = 0.02  # control_period_s of config/oxygen.yaml


def _diag_values(msg: DiagnosticArray) -> dict[str, str]:
    status = [s for s in msg.status if s.name.endswith(': inference')][0]
    return {kv.key: kv.value for kv in status.values} | {'_message': status.message,
                                                         '_level': status.level[0]}


@pytest.mark.slow
@pytest.mark.parametrize('schedule', ['serial', 'concurrent'])
def test_chunks_and_streamed_text_end_to_end(tmp_path, schedule):
    with domain_id() as dom:
        peer = RosPeer(dom, 'listener')
        try:
            peer.collect(JointTrajectory, 'action_chunk')
            peer.collect(String, 'conversation/delta')
            peer.collect(String, 'conversation/text')
            peer.collect(String, 'memory/delta')
            peer.collect(String, 'memory/text')
            peer.collect(DiagnosticArray, '/diagnostics')
            peer.collect(Float64MultiArray, 'forward_position_controller/commands')
            params = {'model': 'pi05-tiny', 'tasks.conversation.temperature': 1.0,
                      'tasks.conversation.max_new_tokens': 24, 'tasks.memory.every_n_frames': 10,
                      'tasks.memory.max_new_tokens': 8, 'num_threads': 1, 'action_rate_hz': 50.0,
                      'command_type': 'float64_multi_array',
                      'command_topic': 'forward_position_controller/commands', 'engine.schedule': schedule}
            stamps_file = tmp_path / 'stamps.txt'
            with node_process(dom, tmp_path / 'node.log', REPO / 'config' / 'oxygen.yaml',
                              params) as node:
                pub = subprocess.Popen(
                    [sys.executable, str(REPO / 'test' / 'ros_helpers.py'), 'publish', '--domain',
                     str(dom), '--rate', '30', '--duration', '25', '--compressed',
                     '--ask', 'What do you see?', '--stamps-out', str(stamps_file)],
                    env=ros_env(dom), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                try:
                    got_text = peer.wait_for(lambda: peer.messages('conversation/text'), 40)
                    peer.wait_for(lambda: len(peer.messages('memory/text')) >= 2, 10)
                    peer.wait_for(lambda: len(peer.messages('action_chunk')) >= 20, 10)
                    peer.wait_for(lambda: len(peer.messages('forward_position_controller/commands')) > 60, 10)
                finally:
                    assert stop_process(pub) == 0
                assert node.poll() is None, 'node died'
            assert node.returncode == 0, (tmp_path / 'node.log').read_text()
        finally:
            peer.close()
    log = (tmp_path / 'node.log').read_text()
    assert got_text, f'no finished text; node log:\n{log}'
    chunks = peer.messages('action_chunk')
    assert len(chunks) >= 20, log
    sent = {round(float(s), 6) for s in stamps_file.read_text().split()}
    for msg in chunks:
        assert list(msg.joint_names) == list(ALOHA_JOINTS)
        assert len(msg.points) == H
        for i, p in enumerate(msg.points):
            assert len(p.positions) == len(ALOHA_JOINTS)
            t = p.time_from_start.sec + p.time_from_start.nanosec * 1e-9
            assert t == pytest.approx((i + 1) * PERIOD, abs=1e-9)
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        assert round(stamp, 6) in sent, 'chunk stamp is not an observation stamp'
    stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in chunks]
    assert stamps == sorted(stamps)
    # the per-step command stream (ros2_control forward controller) sends points of the chunks
    commands = peer.messages('forward_position_controller/commands')
    assert len(commands) > 50
    points = {tuple(p.positions) for m in chunks for p in m.points}
    assert all(len(c.data) == len(ALOHA_JOINTS) for c in commands)
    matched = sum(tuple(c.data) in points for c in commands)
    assert matched >= 0.9 * len(commands)  # the rest: chunks the listener missed at shutdown
    # one ask -> one utterance: its deltas concatenate to the finished text
    texts = [m.data for m in peer.messages('conversation/text')]
    deltas = ''.join(m.data for m in peer.messages('conversation/delta'))
    assert len(texts) == 1 and deltas == texts[0]
    mem_texts = [m.data for m in peer.messages('memory/text')]
    mem_deltas = ''.join(m.data for m in peer.messages('memory/delta'))
    # the newest text may arrive before its last deltas (two topics, stopped right after it)
    assert mem_texts and mem_deltas.startswith(''.join(mem_texts[:-1]))
    diags = [_diag_values(m) for m in peer.messages('/diagnostics')]
    active = [d for d in diags if d.get('state') == 'active' and float(d.get('chunk_hz', 0)) > 0]
    assert active, diags[-3:]
    last = active[-1]
    for key in ('frame_hz', 'chunk_hz', 'action_hz', 'tok_per_s', 'frame_time_p50_ms',
                'frame_time_p99_ms', 'decode_batch_max', 'kv_blocks_in_use', 'kv_blocks_total',
                'deadline_misses', 'dropped_out_of_order', 'model', 'device'):
        assert key in last, key
    assert last['model'] == 'pi05-tiny' and last['device'] == 'cpu' and last['engine_schedule'] == schedule
    for key in ('chunk_latency_language_ms', 'chunk_latency_no_language_ms', 'batcher_busy', 'tokens_per_frame'):
        assert key in last, key  # the schedule metrics of issue 13
    assert float(last['tok_per_s']) > 0
