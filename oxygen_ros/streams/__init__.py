"""The node's streams without ROS: observation assembly from camera and joint-state streams
(``observation``), per-task text deltas and utterances, the fixed-rate per-step command stream,
input liveness and the switch discontinuity between consecutive action chunks.

State machines the ROS node (and the replay, which drives the same logic from a bag) feed and
publish from; they never touch rclpy. May import oxygen_ros.core only.
"""
