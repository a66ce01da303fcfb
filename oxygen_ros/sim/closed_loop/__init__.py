"""The closed-loop script: starts the sim and oxygen nodes, monitors the loop and writes its report.

May import oxygen_ros.core, oxygen_ros.ros and oxygen_ros.sim; never replay or bench.
"""
