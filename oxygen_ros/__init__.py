"""oxygen_ros: a ROS 2 node running a pi0.5 Vision-Language-Action model."""
