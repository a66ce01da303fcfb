"""Parameters of the ``aloha_sim`` node (names, types, defaults, ranges, descriptions)."""

from __future__ import annotations

from rclpy.parameter import Parameter

from oxygen_ros.ros.params.specs import ParamSpec
from oxygen_ros.ros.qos import QOS_NAMES
from oxygen_ros.sim.executor import SOURCES
from oxygen_ros.sim.scene import DEFAULT_CAMERAS

NODE_NAME = "aloha_sim"
STATUS_NAME = f"{NODE_NAME}: executor"
DEFAULT_CAMERA_TOPICS = (
    "cam_high/image_raw/compressed",
    "cam_left_wrist/image_raw/compressed",
    "cam_right_wrist/image_raw/compressed",
)
IMAGE_FORMATS = ("jpeg", "png", "rgb8", "bgr8")
COMMAND_TYPES = ("joint_state", "float64_multi_array")
_S, _I, _F, _B = (Parameter.Type.STRING, Parameter.Type.INTEGER, Parameter.Type.DOUBLE, Parameter.Type.BOOL)
_SA = Parameter.Type.STRING_ARRAY
_OK, _WARN, _ERROR = 0, 1, 2


def sim_specs() -> list[ParamSpec]:
    """Every parameter of the ``aloha_sim`` node (names, types, defaults, ranges, descriptions)."""
    qos = tuple(QOS_NAMES)
    return [
        ParamSpec(
            "control_rate_hz",
            _F,
            50.0,
            "Control (command) rate of the simulation, Hz; "
            "1/rate must be a whole number of 2 ms physics steps. Match the oxygen node: "
            "control_period_s = 1/rate.",
            1.0,
            500.0,
        ),
        ParamSpec(
            "real_time_factor",
            _F,
            1.0,
            "Simulated seconds per wall-clock second "
            "(1 = real time; 0 = as fast as possible). Not 1: publish /clock and run the "
            "other nodes with use_sim_time.",
            0.0,
            100.0,
        ),
        ParamSpec("publish_clock", _B, False, "Publish rosgraph_msgs/Clock on /clock every step."),
        ParamSpec(
            "clock_start",
            _F,
            0.0,
            "Simulation clock at start, seconds since the Unix epoch (0 = the wall clock at start).",
            0.0,
            2.0e9,
        ),
        ParamSpec(
            "max_lag_s",
            _F,
            0.25,
            "Wall-clock lag behind the pacing target beyond which the "
            "sim stops catching up (real time: the clock jumps ahead), seconds.",
            0.01,
            60.0,
        ),
        ParamSpec("seed", _I, 0, "Cube placement seed of the first episode (each reset adds 1).", 0, 2**31 - 1),
        ParamSpec("cameras", _SA, list(DEFAULT_CAMERAS), "MJCF cameras to render, in order (empty = no cameras)."),
        ParamSpec(
            "camera_topics", _SA, list(DEFAULT_CAMERA_TOPICS), "Image topic of each camera (same length as cameras)."
        ),
        ParamSpec(
            "image_format",
            _S,
            "jpeg",
            "jpeg/png: sensor_msgs/CompressedImage; rgb8/bgr8: sensor_msgs/Image.",
            choices=IMAGE_FORMATS,
        ),
        ParamSpec("jpeg_quality", _I, 90, "JPEG quality (1..100).", 1, 100),
        ParamSpec("image_width", _I, 160, "Rendered image width, pixels.", 8, 640),
        ParamSpec("image_height", _I, 120, "Rendered image height, pixels.", 8, 480),
        ParamSpec(
            "camera_rate_hz",
            _F,
            10.0,
            "Camera frames per simulated second (0 = none); "
            "the period is rounded to the nearest whole number of control steps.",
            0.0,
            500.0,
        ),
        ParamSpec("render_shadows", _B, False, "Render shadows and reflections (much slower on CPU)."),
        ParamSpec("camera_qos", _S, "sensor_data", "QoS profile name of the images.", choices=qos),
        ParamSpec("joint_state_topic", _S, "joint_states", "sensor_msgs/JointState output."),
        ParamSpec("joint_state_qos", _S, "sensor_data", "QoS profile name of the joint states.", choices=qos),
        ParamSpec("frame_id", _S, "", "header.frame_id of joint states (images: the camera name)."),
        ParamSpec(
            "command_source",
            _S,
            "trajectory",
            "'trajectory': execute JointTrajectory "
            "chunks from action_topic; 'stream': per-step commands from command_topic.",
            choices=SOURCES,
        ),
        ParamSpec("action_topic", _S, "action_chunk", "trajectory_msgs/JointTrajectory input."),
        ParamSpec("action_qos", _S, "reliable", "QoS profile name of the chunks.", choices=qos),
        ParamSpec("command_topic", _S, "joint_command", "Per-step command input (stream source)."),
        ParamSpec(
            "command_type",
            _S,
            "joint_state",
            "Per-step command message: 'joint_state' "
            "(stamped, by joint name) or 'float64_multi_array' (ALOHA order, receive time).",
            choices=COMMAND_TYPES,
        ),
        ParamSpec("command_qos", _S, "reliable", "QoS profile name of the command stream.", choices=qos),
        ParamSpec(
            "command_timeout_s",
            _F,
            0.1,
            "A stream command older than this is no longer applied (the last one is held), seconds.",
            0.001,
            60.0,
        ),
        ParamSpec(
            "command_delay_s",
            _F,
            0.0,
            "Added latency: every received chunk or command reaches the executor this many "
            "simulated seconds after it arrived, as from a slower policy computer or link "
            "(closed_loop --latency-ms); its stamp is unchanged, so points already past due are skipped.",
            0.0,
            10.0,
        ),
        ParamSpec(
            "loss_timeout_s",
            _F,
            0.25,
            "A hold (no chunk/command covers the step) this long is reported as a command loss, simulated seconds.",
            0.0,
            60.0,
        ),
        ParamSpec(
            "max_joint_speed",
            _F,
            3.0,
            "Speed limit of the applied command per joint, rad/s (grippers: normalised opening per s); 0 = none.",
            0.0,
            1000.0,
        ),
        ParamSpec(
            "lift_height_m",
            _F,
            0.05,
            "Task success: lift of the cube centre above its rest height that counts, metres.",
            0.001,
            1.0,
        ),
        ParamSpec(
            "lift_hold_s",
            _F,
            1.0,
            "Task success: how long the lift must last without a break, simulated seconds.",
            0.0,
            60.0,
        ),
        ParamSpec("diagnostics_period_s", _F, 1.0, "Period of /diagnostics, wall seconds.", 0.05, 60.0),
    ]
