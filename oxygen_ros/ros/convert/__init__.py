"""Message converters: images, joint states, action chunks to trajectories, stamps and the stamp book.

Pure functions over ROS messages and numpy; may import oxygen_ros.core only. The names are
re-exported here: ``from oxygen_ros.ros.convert import image_to_rgb``.
"""

from oxygen_ros.ros.convert.images import (
    SUPPORTED_COMPRESSED_FORMATS,
    SUPPORTED_ENCODINGS,
    ImageConversionError,
    compressed_to_rgb,
    image_size,
    image_to_rgb,
    rgb_to_compressed_msg,
    rgb_to_image_msg,
)
from oxygen_ros.ros.convert.joint_cdr import JointStateDecoder
from oxygen_ros.ros.convert.joints import JointStateError, joint_state_to_vector
from oxygen_ros.ros.convert.stamps import StampBook, make_header, sec_to_stamp, stamp_to_sec
from oxygen_ros.ros.convert.trajectory import (
    chunk_to_joint_trajectory,
    chunk_to_multi_array,
    command_messages,
    primary_values,
)

__all__ = [
    "SUPPORTED_COMPRESSED_FORMATS",
    "SUPPORTED_ENCODINGS",
    "ImageConversionError",
    "JointStateDecoder",
    "JointStateError",
    "StampBook",
    "chunk_to_joint_trajectory",
    "chunk_to_multi_array",
    "command_messages",
    "primary_values",
    "compressed_to_rgb",
    "image_size",
    "image_to_rgb",
    "joint_state_to_vector",
    "make_header",
    "rgb_to_compressed_msg",
    "rgb_to_image_msg",
    "sec_to_stamp",
    "stamp_to_sec",
]
