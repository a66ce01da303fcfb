# oxygen_ros on an x86_64 machine with an NVIDIA GPU (CUDA), ROS 2 Kilted from PyPI, no apt ROS.
#
#   docker build -t oxygen_ros .
#   docker run --rm --gpus all --net host --ipc host -v /models:/models oxygen_ros \
#       oxygen_node --ros-args --params-file config/aloha.yaml -p model:=/models/pi05_aloha
#   docker run --rm --gpus all -v $PWD/out:/out oxygen_ros bench --gpu --out /out/bench
#
# PyPI's torch wheel for linux x86_64 is the CUDA build and carries its CUDA libraries; the image
# only needs the host's NVIDIA driver (NVIDIA Container Toolkit, `--gpus all`). `--net host --ipc
# host` lets Fast DDS talk to ROS 2 nodes on the host (shared memory needs the common /dev/shm).
# The MuJoCo simulation stack is left out (WITH_SIM=0); add `--build-arg WITH_SIM=1` to include it.
# Only the runtime is installed (requirements.txt): no Ray (`evaluate`), no pytest.
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

ARG WITH_SIM=0
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev make ca-certificates \
        libgl1 libegl1 libglib2.0-0 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/oxygen_ros
# dependencies first (cached while only the sources change)
COPY requirements.txt requirements-ros.txt requirements-sim.txt ./
RUN python3 -m venv .venv \
 && .venv/bin/pip install -q --upgrade pip setuptools wheel \
 && .venv/bin/pip install -q -r requirements.txt -r requirements-ros.txt \
 && if [ "$WITH_SIM" = "1" ]; then .venv/bin/pip install -q -r requirements-sim.txt; fi

COPY . .
RUN .venv/bin/pip install -q --no-deps --no-build-isolation -e . && touch .venv/.stamp

ENV PATH=/opt/oxygen_ros/.venv/bin:$PATH
CMD ["oxygen_node", "--ros-args", "--params-file", "config/oxygen.yaml"]
