"""The ROS 2 layer: the `oxygen` lifecycle node, its parameters, inputs, outputs and diagnostics.

May import oxygen_ros.core, oxygen_ros.bags (the ``oxygen record`` verb writes bags) and rclpy /
message packages; never replay, bench or sim.
"""
