"""The model core: configs, types, processing, the pi0.5 model, the paged KV cache and the engine.

Plain PyTorch / numpy / transformers; never imports ROS or any other oxygen_ros subpackage.
"""
