"""Hostile and malformed checkpoints fail *configure* of a running node, which stays up and then
configures a good one.

One node process (the shipped ALOHA-like config, pi05-tiny-sized checkpoint written to disk, CPU,
``autostart: false``); this process drives its lifecycle over DDS (``/oxygen/change_state``, as
``ros2 lifecycle set`` does), sets ``device`` through ``/oxygen/set_parameters`` and reads
``/diagnostics``. ``model`` names one folder throughout (it may be read-only); between attempts the
test replaces what is in it: (a) a ``config.json`` that is not JSON, (b) a shard index naming a file
outside the folder, (c) a NaN weight, (d) ``action_horizon: 1000000000`` in ``oxygen_config.json``,
then (e) the good checkpoint with ``device`` set to a CUDA device this machine lacks, and (f) with
``engine.kv_blocks: 1000000000`` (a pool no machine holds: before, configure ran 36 s into 8 GB and a
``SystemError``). Each configure fails with an ERROR diagnostic "configure failed: …" naming the
file / field / parameter; finally
the good checkpoint on the default device configures, activates and publishes action chunks.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from domain_coordinator import domain_id
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from ros_helpers import ALOHA_COMPRESSED, ALOHA_JOINTS, REPO, RosPeer, SensorFeed, node_process
from safetensors.torch import load_file, save_file
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.weights import random_pretrained, save_pretrained
from oxygen_ros.core.tokenizer import build_tokenizer
from oxygen_ros.core.types import NormStats

pytestmark = [pytest.mark.ros, pytest.mark.slow]
W = "model.safetensors"


def write_cases(root: Path) -> dict[str, Path]:
    """The good checkpoint (pi05-tiny, 14-joint identity stats, openpi layout) and four broken copies."""
    tiny = get_preset("pi05-tiny")
    stats = {"state": NormStats.identity(len(ALOHA_JOINTS)), "actions": NormStats.identity(len(ALOHA_JOINTS))}
    good = save_pretrained(
        random_pretrained(tiny, seed=2),
        root / "good",
        stats,
        layout="openpi",
        tokenizer=build_tokenizer(tiny.vocab_size),
    )
    cases = {name: shutil.copytree(good, root / name) for name in ("malformed", "outside", "nan", "horizon")}
    (cases["malformed"] / "config.json").write_text('{"action_horizon": 10,')
    sd = load_file(str(good / W))
    (cases["outside"] / W).unlink()  # sharded; the first entry points next to the folder the node loads
    save_file(sd, str(cases["outside"] / "shard-1.safetensors"))
    shutil.copy(good / W, root / "elsewhere.safetensors")  # a valid file: only confinement refuses it
    wmap = {k: "shard-1.safetensors" for k in sd} | {"action_in_proj.bias": "../elsewhere.safetensors"}
    (cases["outside"] / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    sd["action_out_proj.weight"][0, 0] = float("nan")
    save_file(sd, str(cases["nan"] / W))
    ox = json.loads((good / "oxygen_config.json").read_text())
    (cases["horizon"] / "oxygen_config.json").write_text(json.dumps(ox | {"action_horizon": 1_000_000_000}))
    return {"good": good, **cases}


def test_bad_checkpoints_fail_configure_and_the_node_stays_up(tmp_path):
    cases = write_cases(tmp_path)
    ckpt = tmp_path / "ckpt"  # what `model` names: its content is swapped between attempts

    def use(name: str) -> None:
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.copytree(cases[name], ckpt)

    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    expect = {  # case -> what "configure failed: …" must name
        "malformed": [f"{ckpt}/config.json: not a readable JSON file"],
        "outside": [
            f"{ckpt}/model.safetensors.index.json",
            "weight_map['action_in_proj.bias']",
            "'../elsewhere.safetensors' resolves to",
            "outside the checkpoint folder",
        ],
        "nan": [f"{ckpt}/model.safetensors: tensor action_out_proj.weight holds 1 non-finite value"],
        "horizon": [
            f"{ckpt}/oxygen_config.json: action_horizon=1000000000 is out of range",
            "must be an int in [1, 1000]",
        ],
    }
    params = {
        "model": str(ckpt),
        "autostart": False,
        "num_threads": 1,
        "diagnostics_period_s": 0.25,
        "tasks.memory.every_n_frames": 0,
    }
    with domain_id() as dom:
        peer = RosPeer(dom, "bad_checkpoint_driver")
        feed = None
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            peer.collect(JointTrajectory, "action_chunk")
            change = peer.node.create_client(ChangeState, "/oxygen/change_state")
            set_params = peer.node.create_client(SetParameters, "/oxygen/set_parameters")
            log = tmp_path / "node.log"
            use("malformed")
            with node_process(dom, log, REPO / "config" / "oxygen.yaml", params) as node:
                for client in (change, set_params):  # a request sent before discovery is lost
                    assert client.wait_for_service(timeout_sec=60), log.read_text()

                def call(client, request):
                    future = client.call_async(request)
                    assert peer.wait_for(future.done, 60), f"{request} timed out:\n{log.read_text()}"
                    return future.result()

                def configure() -> bool:
                    request = ChangeState.Request(transition=Transition(id=Transition.TRANSITION_CONFIGURE))
                    return call(change, request).success

                def failed_configure_says(pieces: list[str]) -> None:
                    t0 = time.monotonic()
                    assert not configure(), f"configure succeeded; expected a failure naming {pieces}"

                    def found():
                        for msg in peer.messages("/diagnostics", t0):
                            for st in msg.status:
                                if st.message.startswith("configure failed: ") and all(p in st.message for p in pieces):
                                    return st
                        return None

                    st = peer.wait_for(found, 20)
                    last = [s.message for m in peer.messages("/diagnostics")[-1:] for s in m.status]
                    assert st is not None, f'no "configure failed" diagnostic naming {pieces}; last: {last}'
                    assert st.level == DiagnosticStatus.ERROR, st
                    assert node.poll() is None, f"node died:\n{log.read_text()}"

                for name in ("malformed", "outside", "nan", "horizon"):
                    use(name)
                    failed_configure_says(expect[name])
                use("good")
                result = call(
                    set_params,
                    SetParameters.Request(parameters=[Parameter("device", value=missing).to_parameter_msg()]),
                )
                assert result.results[0].successful, result
                have = "this machine has ['cpu']" if missing == "cuda" else "this machine has ['cpu', 'cuda'"
                failed_configure_says([f"parameter device='{missing}'", have])
                result = call(
                    set_params, SetParameters.Request(parameters=[Parameter("device", value="cpu").to_parameter_msg()])
                )
                assert result.results[0].successful, result
                # (f) a KV pool no machine holds: refused before anything is allocated, at once
                result = call(
                    set_params,
                    SetParameters.Request(
                        parameters=[Parameter("engine.kv_blocks", value=1_000_000_000).to_parameter_msg()]
                    ),
                )
                assert result.results[0].successful, result
                t_kv = time.monotonic()
                failed_configure_says(
                    ["the largest part, KV pool, is set by engine.kv_blocks: lower it", "available on the host"]
                )
                assert time.monotonic() - t_kv < 15, "configure ran long before refusing"
                result = call(
                    set_params,
                    SetParameters.Request(parameters=[Parameter("engine.kv_blocks", value=0).to_parameter_msg()]),
                )
                assert result.results[0].successful, result
                assert configure(), log.read_text()
                request = ChangeState.Request(transition=Transition(id=Transition.TRANSITION_ACTIVATE))
                assert call(change, request).success, log.read_text()
                feed = SensorFeed(peer, ALOHA_COMPRESSED, ALOHA_JOINTS, 30.0, compressed=True).start()
                assert peer.wait_for(lambda: len(peer.messages("action_chunk")) >= 2, 60), log.read_text()
                assert node.poll() is None, log.read_text()
            assert node.returncode == 0, log.read_text()
        finally:
            if feed is not None:
                feed.stop()
            peer.close()
