"""Who may choose the node's checkpoint (``model_locked``, ``model_folders``), through a node process.

The review found that any participant on the DDS domain could run *deactivate → cleanup → set
model → configure → activate* and make the node drive ``/action_chunk`` from a folder of its choice.
These tests play that participant: a :class:`RosPeer` in this process (and the ``oxygen`` command in
a subprocess) calls the node's real lifecycle and parameter services over DDS.

- ``model_folders`` confines the checkpoint to folders by real path: a folder outside, a symlink
  inside an allowed folder that points outside, and a ``..`` path out of it are refused at
  configure (the node stays up and says why on ``/diagnostics``); a real checkpoint inside loads.
- ``model_locked`` (default true) declares ``model`` read-only: the attack sequence above ends
  with the node running the launch-time model, and ``oxygen params set model …`` is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters, SetParametersAtomically
from rclpy.parameter import Parameter
from ros_helpers import REPO, RosPeer, node_process, ros_env

pytestmark = [pytest.mark.ros, pytest.mark.slow]
CONFIG = REPO / "config" / "oxygen.yaml"
BASE = {"num_threads": 1, "diagnostics_period_s": 0.25}


def write_checkpoint(folder: Path) -> Path:
    """A real, loadable pi05-tiny checkpoint folder (random weights, 14 joints as config/oxygen.yaml)."""
    from oxygen_ros.core.config import get_preset
    from oxygen_ros.core.model.weights import random_pretrained, save_pretrained
    from oxygen_ros.core.tokenizer import build_tokenizer
    from oxygen_ros.core.types import NormStats

    cfg = get_preset("pi05-tiny")
    stats = {"state": NormStats.identity(14), "actions": NormStats.identity(14)}
    return save_pretrained(
        random_pretrained(cfg), folder, stats, layout="openpi", tokenizer=build_tokenizer(cfg.vocab_size)
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """``allowed/pi05_tiny`` (a checkpoint), ``outside/pi05_tiny`` (the same files outside the
    allowed folder), ``allowed/current`` (a symlink to the outside one) and ``allowed/latest`` (a
    symlink that stays inside)."""
    root = tmp_path_factory.mktemp("models")
    inside = write_checkpoint(root / "allowed" / "pi05_tiny")
    outside = Path(shutil.copytree(inside, root / "outside" / "pi05_tiny"))
    (root / "allowed" / "current").symlink_to(outside, target_is_directory=True)
    (root / "allowed" / "latest").symlink_to(inside, target_is_directory=True)
    return {
        "allowed": root / "allowed",
        "inside": inside,
        "outside": outside,
        "escaping_link": root / "allowed" / "current",
        "inner_link": root / "allowed" / "latest",
    }


class Caller:
    """The peer's service calls to the node ``/oxygen`` (each waits for the service and the answer)."""

    def __init__(self, peer: RosPeer) -> None:
        self.peer, self.clients = peer, {}

    def call(self, srv_type: type, service: str, request: Any, timeout: float = 120.0) -> Any:
        key = (srv_type, service)
        if key not in self.clients:
            self.clients[key] = self.peer.node.create_client(srv_type, f"/oxygen/{service}")
        client = self.clients[key]
        assert client.wait_for_service(timeout), f"/oxygen/{service} not available"
        future = client.call_async(request)
        assert self.peer.wait_for(future.done, timeout), f"/oxygen/{service}: no answer in {timeout} s"
        return future.result()

    def set(self, name: str, value: Any) -> Any:
        """``ros2 param set``: one SetParameters request; its result."""
        req = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        return self.call(SetParameters, "set_parameters", req).results[0]

    def transition(self, transition_id: int) -> bool:
        return self.call(
            ChangeState, "change_state", ChangeState.Request(transition=Transition(id=transition_id))
        ).success

    def model(self) -> str:
        return self.call(GetParameters, "get_parameters", GetParameters.Request(names=["model"])).values[0].string_value


def statuses(peer: RosPeer, since: float = 0.0) -> list[dict[str, str]]:
    """Key/values (plus ``_message``) of the ``oxygen: inference`` statuses received since ``since``
    (monotonic seconds), oldest first."""
    out = []
    for msg in peer.messages("/diagnostics", since):
        out += [
            {kv.key: kv.value for kv in st.values} | {"_message": st.message}
            for st in msg.status
            if st.name.endswith(": inference")
        ]
    return out


def wait_status(peer: RosPeer, pred, what: str, since: float = 0.0, timeout: float = 120.0) -> dict[str, str]:
    """The newest status received since ``since`` that satisfies ``pred``, waiting up to ``timeout`` s."""
    got = peer.wait_for(lambda: next((d for d in reversed(statuses(peer, since)) if pred(d)), None), timeout)
    assert got, f"no /diagnostics status {what} in {timeout} s; last: {statuses(peer)[-1:]}"
    return got


def test_model_folders_refuse_a_checkpoint_outside_them_at_configure(models, tmp_path):
    allowed = str(models["allowed"])
    params = {**BASE, "model": str(models["outside"]), "model_folders": [allowed], "model_locked": False}
    with domain_id() as dom, node_process(dom, tmp_path / "node.log", CONFIG, params) as proc:
        peer = RosPeer(dom)
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            node = Caller(peer)
            # launched with a folder outside: autostart's configure fails, the node stays up and says why
            failed = wait_status(peer, lambda d: d["_message"].startswith("configure failed:"), "configure failed")
            assert "model_folders" in failed["_message"] and allowed in failed["_message"], failed
            assert f"model={str(models['outside'])!r}" in failed["_message"], failed
            assert "is outside model_folders" in failed["_message"], failed
            assert failed["state"] == "unconfigured" and proc.poll() is None
            # a symlink inside the allowed folder that points outside, and a '..' path out of it
            dotted, shown = f"{allowed}/../outside/pi05_tiny", f"(real path {os.path.realpath(models['outside'])})"
            for model in (models["escaping_link"], dotted):
                assert node.set("model", str(model)).successful  # unconfigured, lock off: accepted
                t0 = time.monotonic()
                assert not node.transition(Transition.TRANSITION_CONFIGURE), model
                why = wait_status(peer, lambda d, m=str(model): f"model={m!r}" in d["_message"], f"naming {model}", t0)
                assert shown in why["_message"] and "model_folders" in why["_message"], why
                assert proc.poll() is None
            # the same files inside the allowed folder load, through a symlink that stays inside too
            assert node.set("model", str(models["inner_link"])).successful
            t0 = time.monotonic()
            assert node.transition(Transition.TRANSITION_CONFIGURE)
            ok = wait_status(peer, lambda d: d["state"] == "inactive", "inactive", t0)
            assert ok["model"] == str(models["inner_link"]), ok
        finally:
            peer.close()
    assert proc.returncode == 0, (tmp_path / "node.log").read_text()[-3000:]


def test_a_locked_model_cannot_be_changed_remotely(tmp_path):
    params = {**BASE, "model": "pi05-tiny"}  # model_locked left at its default
    with domain_id() as dom, node_process(dom, tmp_path / "node.log", CONFIG, params) as proc:
        peer = RosPeer(dom)
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            node = Caller(peer)
            wait_status(peer, lambda d: d["state"] == "active", "active")
            # the attacker's sequence: deactivate, cleanup, set model, configure, activate
            assert node.transition(Transition.TRANSITION_DEACTIVATE)
            assert node.transition(Transition.TRANSITION_CLEANUP)
            for name, value in (("model", "/some/folder"), ("model_locked", False), ("model_folders", ["/some"])):
                res = node.set(name, value)
                assert not res.successful and res.reason == f"Trying to set a read-only parameter: {name}.", res
            described = node.call(
                DescribeParameters,
                "describe_parameters",
                DescribeParameters.Request(names=["model", "model_locked", "model_folders"]),
            ).descriptors
            assert [d.read_only for d in described] == [True, True, True], described
            req = SetParametersAtomically.Request(
                parameters=[Parameter("model", value="/some/folder").to_parameter_msg()]
            )
            assert not node.call(SetParametersAtomically, "set_parameters_atomically", req).result.successful
            # the same through the `oxygen` command (ros2 param set on apt ROS), in its own process
            r = subprocess.run(
                [sys.executable, "-m", "oxygen_ros.ros.cli", "params", "set", "model", "/some/folder"],
                cwd=REPO,
                env=ros_env(dom),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert (r.returncode, r.stdout) == (1, "refused model: Trying to set a read-only parameter: model.\n"), r
            t0 = time.monotonic()
            assert node.transition(Transition.TRANSITION_CONFIGURE)
            assert node.transition(Transition.TRANSITION_ACTIVATE)
            assert node.model() == "pi05-tiny"
            wait_status(peer, lambda d: d["state"] == "active", "active again", since=t0)
            assert {d["model"] for d in statuses(peer, t0)} == {"pi05-tiny"}, statuses(peer, t0)
            assert proc.poll() is None
        finally:
            peer.close()
    assert proc.returncode == 0, (tmp_path / "node.log").read_text()[-3000:]
