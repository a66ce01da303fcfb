"""The ALOHA MuJoCo sim as a ROS 2 node (scene, chunk executor, runtime), the sample-bag recorder, closed loop.

May import oxygen_ros.core, oxygen_ros.ros and oxygen_ros.bags; never replay or bench.
"""
