"""ament_python build of oxygen_ros (also a plain pip-installable package)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "oxygen_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        (f"share/{PACKAGE}/config/security", glob("config/security/*.xml")),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="oxygen_ros developers",
    maintainer_email="dev@oxygen-ros.invalid",
    description="π0.5 VLA on ROS 2 with unified KV cache management (OxyGen)",
    license="Apache-2.0",
    python_requires=">=3.10",
    entry_points={
        "console_scripts": [
            "oxygen_demo = oxygen_ros.replay.demo:main",
            "bench = oxygen_ros.bench.bench:main",
            "chaos_soak = oxygen_ros.bench.soak:main",
            "gpu_check = oxygen_ros.bench.gpu_check.stages:main",
            "replay = oxygen_ros.replay.replay:main",
            "bag_player = oxygen_ros.bags.player:entry",
            "record_sim_bag = oxygen_ros.sim.record_bag:main",
            "record_demos = oxygen_ros.sim.demos:main",
            "train = oxygen_ros.train.train:main",
            "oxygen_node = oxygen_ros.ros.node:main",
            "oxygen = oxygen_ros.ros.cli.main:entry",
            "ingress_bench = oxygen_ros.bench.ingress:main",
            "hostile_inputs = oxygen_ros.ros.ingress.hostile:main",
            "aloha_sim = oxygen_ros.sim.node:main",
            "closed_loop = oxygen_ros.sim.closed_loop.run:main",
            "scripted_policy = oxygen_ros.sim.task.policy_node:main",
            "evaluate = oxygen_ros.evaluate.cli:main",
            "norm_stats = oxygen_ros.stats.tool:main",
            "fake_robot = oxygen_ros.sim.fake_robot.run:main",
        ],
    },
)
