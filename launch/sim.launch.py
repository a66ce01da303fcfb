"""Closed loop: the ALOHA MuJoCo simulation (``aloha_sim``) driven by the ``oxygen`` node.

    ros2 launch oxygen_ros sim.launch.py model:=pi05-tiny
    ros2 launch oxygen_ros sim.launch.py model:=/models/pi05_aloha device:=cuda
    ros2 launch oxygen_ros sim.launch.py model:=pi05-tiny real_time_factor:=0.25   # slow CPU

Both nodes read ``config/sim.yaml`` (its ``aloha_sim`` section for the sim, its ``oxygen`` section
on top of ``config/oxygen.yaml`` for the node: the same joints, camera topics, chunk topic and
control period). The same loop without ``ros2 launch``: the ``closed_loop`` script.

Arguments:
    sim_params_file: parameter YAML of the loop (default: the package's config/sim.yaml).
    oxygen_params_file: base parameter YAML of the oxygen node (default: config/oxygen.yaml).
        Either one not a file stops the launch at once with one line naming it (exit status 1).
    namespace: namespace of both nodes (all their topics are relative, so they follow it).
    model: checkpoint folder or preset name; empty = the value in the parameter files.
    device: torch device (cuda, cpu); empty = the value in the parameter files.
    real_time_factor: simulated seconds per wall second; empty = the sim parameter file's. Any
        value but 1 (given here or in the file) switches to simulation time: the sim publishes
        /clock and the oxygen node uses it.
    use_sim_time: force simulation time (/clock) also at real time.
    log_level: ROS log level of both nodes.
"""

from pathlib import Path

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription
from oxygen_ros.ros.params.files import check_params_file

PACKAGE = "oxygen_ros"
SIM_EXECUTABLE, SIM_NAME = "aloha_sim", "aloha_sim"
OXYGEN_EXECUTABLE, OXYGEN_NAME = "oxygen_node", "oxygen"
SIM_PARAMS = ("config", "sim.yaml")
OXYGEN_PARAMS = ("config", "oxygen.yaml")
_TRUE = ("true", "1", "yes", "on")


def _params_file(context, argument: str) -> str:
    """The parameter file named by launch argument ``argument``, checked before any node starts
    (:func:`oxygen_ros.ros.params.files.check_params_file`: a missing one stops the launch)."""
    return check_params_file(
        argument,
        LaunchConfiguration(argument).perform(context),
        lambda: Path(FindPackageShare(PACKAGE).perform(context), "config"),
    )


def _file_rtf(path: str) -> float:
    """``real_time_factor`` of the sim section of a parameter file (1.0 when absent/unreadable)."""
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        for key, section in doc.items():
            if str(key).split("/")[-1] == SIM_NAME:
                return float(section["ros__parameters"].get("real_time_factor", 1.0))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ImportError):
        pass
    return 1.0


def _nodes(context, *args, **kwargs):
    """Build both node actions with matching timing overrides."""
    sim_overrides, oxygen_overrides = {}, {}
    for argument in ("sim_params_file", "oxygen_params_file"):
        _params_file(context, argument)
    sim_params = LaunchConfiguration("sim_params_file")
    rtf_arg = LaunchConfiguration("real_time_factor").perform(context).strip()
    sim_time = LaunchConfiguration("use_sim_time").perform(context).strip().lower() in _TRUE
    if rtf_arg:
        rtf = float(rtf_arg)
        sim_overrides["real_time_factor"] = rtf
    else:
        rtf = _file_rtf(sim_params.perform(context))
    sim_time = sim_time or rtf != 1.0
    sim_overrides["publish_clock"] = sim_time
    oxygen_overrides["use_sim_time"] = sim_time
    for key in ("model", "device"):
        value = LaunchConfiguration(key).perform(context)
        if value:
            oxygen_overrides[key] = value
    log_args = ["--ros-args", "--log-level", LaunchConfiguration("log_level")]
    return [
        Node(
            package=PACKAGE,
            executable=SIM_EXECUTABLE,
            name=SIM_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=[sim_params, sim_overrides],
            arguments=log_args,
            output="screen",
            emulate_tty=True,
        ),
        LifecycleNode(
            package=PACKAGE,
            executable=OXYGEN_EXECUTABLE,
            name=OXYGEN_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("oxygen_params_file"), sim_params, oxygen_overrides],
            arguments=log_args,
            output="screen",
            emulate_tty=True,
        ),
    ]


def generate_launch_description() -> LaunchDescription:
    """The launch description (arguments + the sim node + the oxygen lifecycle node)."""
    share = FindPackageShare(PACKAGE)
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "sim_params_file",
                default_value=PathJoinSubstitution([share, *SIM_PARAMS]),
                description="Parameter YAML of the closed loop (aloha_sim + oxygen overrides)",
            ),
            DeclareLaunchArgument(
                "oxygen_params_file",
                default_value=PathJoinSubstitution([share, *OXYGEN_PARAMS]),
                description="Base parameter YAML of the oxygen node",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="Namespace of both nodes"),
            DeclareLaunchArgument(
                "model", default_value="", description="Checkpoint folder or preset; empty = from the params"
            ),
            DeclareLaunchArgument(
                "device", default_value="", description="Torch device (cuda, cpu); empty = from the params"
            ),
            DeclareLaunchArgument(
                "real_time_factor", default_value="", description="Sim seconds per wall second; not 1 = simulation time"
            ),
            DeclareLaunchArgument(
                "use_sim_time", default_value="false", description="Use /clock from the sim even at real time"
            ),
            DeclareLaunchArgument("log_level", default_value="info", description="Log level"),
            OpaqueFunction(function=_nodes),
        ]
    )
