"""Launch the ``oxygen`` lifecycle node (it configures and activates itself: ``autostart``).

    ros2 launch oxygen_ros oxygen.launch.py
    ros2 launch oxygen_ros oxygen.launch.py params_file:=/path/robot.yaml namespace:=robot1 \
        model:=/models/pi05_aloha device:=cuda

Arguments:
    params_file: parameter YAML (default: the package's config/oxygen.yaml, ALOHA-like). A path
        that is not a file stops the launch at once with one line naming it (exit status 1).
    namespace: node namespace (all topics are relative, so they follow it).
    model: checkpoint folder or preset name; empty = the value in params_file.
    device: torch device (cuda, cuda:1, cpu); empty = the value in params_file.
    use_sim_time: use /clock (for ``ros2 bag play --clock``).
    log_level: ROS log level of the node.
"""

from pathlib import Path

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription
from oxygen_ros.ros.params.files import check_params_file

PACKAGE = "oxygen_ros"
EXECUTABLE = "oxygen_node"
NODE_NAME = "oxygen"
DEFAULT_PARAMS = ("config", "oxygen.yaml")


def _params_file(context, argument: str) -> str:
    """The parameter file named by launch argument ``argument``, checked before any node starts
    (:func:`oxygen_ros.ros.params.files.check_params_file`: a missing one stops the launch)."""
    return check_params_file(
        argument,
        LaunchConfiguration(argument).perform(context),
        lambda: Path(FindPackageShare(PACKAGE).perform(context), "config"),
    )


def _node(context, *args, **kwargs):
    """Build the node action; model/device override the params file only when given."""
    _params_file(context, "params_file")
    overrides = {}
    for key in ("model", "device"):
        value = LaunchConfiguration(key).perform(context)
        if value:
            overrides[key] = value
    sim_time = LaunchConfiguration("use_sim_time").perform(context).lower() in ("true", "1", "yes")
    overrides["use_sim_time"] = sim_time
    return [
        LifecycleNode(
            package=PACKAGE,
            executable=EXECUTABLE,
            name=NODE_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("params_file"), overrides],
            arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
            output="screen",
            emulate_tty=True,
        )
    ]


def generate_launch_description() -> LaunchDescription:
    """The launch description (arguments + the lifecycle node)."""
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "params_file",
                default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), *DEFAULT_PARAMS]),
                description="Parameter YAML file for the oxygen node",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="Node namespace"),
            DeclareLaunchArgument(
                "model", default_value="", description="Checkpoint folder or preset; empty = from params_file"
            ),
            DeclareLaunchArgument(
                "device", default_value="", description="Torch device (cuda, cpu); empty = from params_file"
            ),
            DeclareLaunchArgument("use_sim_time", default_value="false", description="Use simulation time from /clock"),
            DeclareLaunchArgument("log_level", default_value="info", description="Node log level"),
            OpaqueFunction(function=_node),
        ]
    )
