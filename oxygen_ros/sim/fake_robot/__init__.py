"""``fake_robot``: a stand-in robot for trying a robot profile against the real node before the robot
is there — it publishes the profile's joint states and cameras and checks what each controller would
receive.

May import oxygen_ros.core and oxygen_ros.ros; never replay, bench or evaluate.
"""
