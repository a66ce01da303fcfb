"""Input load on a running ``oxygen`` node: a sensor feed process (``feed``; three 30 Hz cameras,
joint states at 30 Hz or 1 kHz) for the ingress benchmark (``oxygen_ros.bench.ingress``, console
script ``ingress_bench``), and the hostile-input measurements (``hostile``, console script
``hostile_inputs``). May import oxygen_ros.core, oxygen_ros.streams and oxygen_ros.ros (and rclpy).
"""
