"""The ``oxygen`` node's parameters: specifications generated from the core dataclasses (``specs``),
the node's parameter set and its validated configuration (``node_config``), the check that every
name in a parameter file is one the node declares (``names``) and which parameters a running node
applies live (``live``), the check of a parameter file named at launch (``files``).

Plain rclpy parameter handling; may import oxygen_ros.core and oxygen_ros.streams / qos only.
"""
