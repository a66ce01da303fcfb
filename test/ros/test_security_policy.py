"""The SROS2 policy shipped in ``config/security/oxygen.policy.xml`` against the node's real endpoints.

The Fast DDS of the PyPI wheels (Kilted and Jazzy) is built without the DDS security plugins
(creating a participant with a keystore fails: "This Fast DDS version doesn't have the security
libraries"), so enforcement itself cannot run here. What can drift is the policy: a new topic,
service or renamed parameter default would leave the node without a permission it needs (under
``ROS_SECURITY_STRATEGY=Enforce`` it could not create that endpoint) or leave a stale grant. So
the node runs in its own process with ``config/oxygen.yaml`` (plus ``action_rate_hz`` > 0, the
per-step command stream of a real robot), and its publishers, subscriptions and services as seen
over DDS must be exactly what the ``/oxygen`` enclave grants (``/clock`` aside: it is subscribed
only with ``use_sim_time``). The ``/oxygen_operator`` enclave may only name the node's real
endpoints, and must cover what the ``oxygen`` command's own node creates (seen on a running
``oxygen listen``).
"""

from __future__ import annotations

import fnmatch
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from domain_coordinator import domain_id
from rclpy.node import NodeNameNonExistentError
from ros_helpers import REPO, RosPeer, node_process, ros_env

pytestmark = [pytest.mark.ros, pytest.mark.slow]
POLICY = REPO / "config" / "security" / "oxygen.policy.xml"
ACCESS = {"topics": ("publish", "subscribe"), "services": ("request", "reply")}
ONLY_WITH_SIM_TIME = {"/clock"}


def resolve(name: str, ns: str, node: str) -> str:
    """A policy name as SROS2 expands it: absolute stays, ``~/x`` is ``<ns>/<node>/x``, relative
    names go under ``ns``."""
    base = ns if ns.endswith("/") else ns + "/"
    if name.startswith("/"):
        return name
    if name.startswith("~"):
        return base + node + name[1:]
    return base + name


def read_policy(path: Path) -> dict[str, dict[str, set[str]]]:
    """Enclave path -> access (publish, subscribe, request, reply) -> fully qualified names granted.

    Raises:
        AssertionError: not an SROS2 policy 0.2.0 made of enclaves / profiles / topics / services
            with ALLOW qualifiers (DENY rules and actions are not used by this policy).
    """
    root = ET.parse(path).getroot()
    assert root.tag == "policy" and root.get("version") == "0.2.0", root.attrib
    out: dict[str, dict[str, set[str]]] = {}
    for enclave in root.find("enclaves"):
        grants = out.setdefault(enclave.get("path"), {a: set() for pair in ACCESS.values() for a in pair})
        for profiles in enclave:
            for profile in profiles:
                assert profile.tag == "profile" and profile.get("ns") and profile.get("node"), profile.attrib
                for rule in profile:
                    assert rule.tag in ACCESS, rule.tag
                    given = {k: v for k, v in rule.attrib.items()}
                    assert given and set(given) <= set(ACCESS[rule.tag]) and set(given.values()) == {"ALLOW"}, given
                    names = {resolve(e.text.strip(), profile.get("ns"), profile.get("node")) for e in rule}
                    for access in given:
                        grants[access] |= names
    return out


def node_endpoints(peer: RosPeer, name: str, ns: str = "/") -> dict[str, set[str]]:
    """What node ``ns/name`` has in the graph: publish, subscribe, reply (services), request (clients);
    all empty while the node is not (yet) in the graph."""
    n = peer.node
    try:
        return {
            "publish": {t for t, _ in n.get_publisher_names_and_types_by_node(name, ns)},
            "subscribe": {t for t, _ in n.get_subscriber_names_and_types_by_node(name, ns)},
            "reply": {s for s, _ in n.get_service_names_and_types_by_node(name, ns)},
            "request": {s for s, _ in n.get_client_names_and_types_by_node(name, ns)},
        }
    except NodeNameNonExistentError:
        return {"publish": set(), "subscribe": set(), "reply": set(), "request": set()}


def graph_report(peer: RosPeer) -> str:
    """Who is in the graph: every node with its enclave, and the nodes and endpoint GIDs behind
    ``/diagnostics`` and ``/rosout`` (the participant is the GID's first 12 bytes) -- tells a stale
    or second ``oxygen`` node on the domain from a node that lacks an endpoint."""
    n = peer.node
    pubs = {
        t: [(i.node_name, bytes(i.endpoint_gid[:12]).hex()) for i in n.get_publishers_info_by_topic(t)]
        for t in ("/diagnostics", "/rosout")
    }
    return f"nodes {n.get_node_names_and_namespaces_with_enclaves()}; publishers {pubs}"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell may have ignored SIGINT


def granted(name: str, patterns: set[str]) -> bool:
    """Whether ``name`` matches a grant (DDS permissions match topic names as fnmatch patterns)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def test_the_shipped_policy_is_a_well_formed_sros2_policy():
    policy = read_policy(POLICY)
    assert set(policy) == {"/oxygen", "/oxygen_operator"}
    assert policy["/oxygen"]["request"] == set(), "the node calls no service"


def test_the_policy_grants_exactly_the_endpoints_the_node_has(tmp_path):
    policy = read_policy(POLICY)
    node_grants, operator = policy["/oxygen"], policy["/oxygen_operator"]
    params = {"model": "pi05-tiny", "num_threads": 1, "diagnostics_period_s": 0.25, "action_rate_hz": 50.0}
    with domain_id() as dom, node_process(dom, tmp_path / "node.log", REPO / "config" / "oxygen.yaml", params) as proc:
        peer = RosPeer(dom)
        try:
            peer.collect(DiagnosticArray, "/diagnostics")
            assert peer.wait_for(lambda: any(d.get("state") == "active" for d in peer.diagnostics()), 120), (
                f"node not active; last: {peer.diagnostics()[-1:]}"
            )
            want = {a: node_grants[a] - (ONLY_WITH_SIM_TIME if a == "subscribe" else set()) for a in node_grants}
            # discovery fills the graph gradually: wait for the policy's view, then compare whatever is there
            peer.wait_for(lambda: node_endpoints(peer, "oxygen") == want, 30)
            have = node_endpoints(peer, "oxygen")
            for access in want:
                assert have[access] == want[access], (
                    f"{access}: the node has but the policy lacks {sorted(have[access] - want[access])}; "
                    f"the policy grants but the node lacks {sorted(want[access] - have[access])}; " + graph_report(peer)
                )
            assert ONLY_WITH_SIM_TIME <= node_grants["subscribe"]
            # the operator enclave names only the node's real endpoints, and may call every lifecycle and
            # parameter service (the type-description service is for tools, not operators)
            assert operator["request"] == have["reply"] - {"/oxygen/get_type_description"}, operator["request"]
            assert operator["publish"] - {"/parameter_events"} <= have["subscribe"], operator["publish"]
            assert operator["subscribe"] <= have["publish"], operator["subscribe"]
            asks = {t for t in have["subscribe"] if t == "/ask" or t.endswith("/ask")}
            assert asks and asks | {"/instruction"} <= operator["publish"]
            # the `oxygen` command's own node: everything it creates is granted to the operator enclave
            cli = subprocess.Popen(
                [sys.executable, "-m", "oxygen_ros.ros.cli", "listen"],
                cwd=REPO,
                env=ros_env(dom),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_default_sigint,
            )
            try:
                name = f"oxygen_cli_{cli.pid}"
                assert peer.wait_for(lambda: len(node_endpoints(peer, name)["subscribe"]) >= 4, 60), (
                    f"{name} not seen: {peer.node.get_node_names()}"
                )
                # rclpy's own entities of every node (created before the subscriptions, discovered in any order)
                peer.wait_for(
                    lambda: (
                        {f"/{name}/get_type_description"} <= node_endpoints(peer, name)["reply"]
                        and "/parameter_events" in node_endpoints(peer, name)["publish"]
                    ),
                    30,
                )
                own = node_endpoints(peer, name)
                for access in ("publish", "subscribe", "reply", "request"):
                    missing = sorted(n for n in own[access] if not granted(n, operator[access]))
                    assert not missing, f"the oxygen command {access}es {missing}, not granted to /oxygen_operator"
            finally:
                cli.send_signal(signal.SIGINT)
                try:
                    cli.communicate(timeout=30)
                finally:
                    cli.kill()
            assert proc.poll() is None
        finally:
            peer.close()
    assert proc.returncode == 0, (tmp_path / "node.log").read_text()[-3000:]
