"""Rosbag I/O with the `rosbags` library: reading, writing, the bag player node and the topic recorder.

May import oxygen_ros.core and rclpy/messages; never the node modules of oxygen_ros.ros, replay, bench or sim.
"""
