# oxygen_ros — the README's two commands: `make demo` and `make test`.
# Everything is installed into a local virtual environment ($(VENV)); nothing system-wide.
# On a robot with apt ROS 2 (aarch64): `make demo ROS_FROM_APT=1` (venv sees the system rclpy);
# `WITH_SIM=0` skips the MuJoCo simulation stack; `TORCH_PREINSTALLED=1` keeps the torch already in the
# (system-site) environment, e.g. NVIDIA's JetPack wheel.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
COLCON_VENV ?= .venv-colcon
ROS_FROM_APT ?= 0
WITH_SIM ?= 1
TORCH_PREINSTALLED ?= 0
PYTEST_ARGS ?=

# DDS stays on this host in tests and demos (DESIGN §7; ROS_LOCALHOST_ONLY is ignored in Kilted).
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup demo test test-fast clean

$(VENV)/.stamp: requirements.txt requirements-ros.txt requirements-sim.txt setup.py package.xml
	$(PYTHON) -m venv $(if $(filter 1,$(ROS_FROM_APT)),--system-site-packages) $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(if $(filter 1,$(TORCH_PREINSTALLED)),grep -v '^torch==' requirements.txt > $(VENV)/requirements-no-torch.txt && $(PY) -m pip install -q -r $(VENV)/requirements-no-torch.txt,$(PY) -m pip install -q -r requirements.txt)
	$(if $(filter 1,$(ROS_FROM_APT)),,$(PY) -m pip install -q -r requirements-ros.txt)
	$(if $(filter 1,$(WITH_SIM)),$(PY) -m pip install -q -r requirements-sim.txt)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.stamp

$(COLCON_VENV)/.stamp: requirements-colcon.txt
	$(PYTHON) -m venv $(COLCON_VENV)
	$(COLCON_VENV)/bin/python -m pip install -q -r requirements-colcon.txt
	touch $@

demo: setup
	$(PY) -m oxygen_ros.replay.demo

test: setup $(COLCON_VENV)/.stamp
	OXYGEN_COLCON=$(abspath $(COLCON_VENV))/bin/colcon $(PY) -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not ros" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(COLCON_VENV) build install log .pytest_cache
