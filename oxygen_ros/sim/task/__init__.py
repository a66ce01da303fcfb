"""The transfer-cube task: the scripted pick-and-lift, the episode success detector and the
scripted oracle policy node (``scripted_policy``).

May import oxygen_ros.core, oxygen_ros.ros and oxygen_ros.sim (scene); never replay or bench.
"""
