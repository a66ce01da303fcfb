# oxygen_ros — the README's two commands: `make demo` and `make test` (plus `make docs`).
# Everything is installed into a local virtual environment ($(VENV)); nothing system-wide.
# On a robot with apt ROS 2 (aarch64): `make demo ROS_FROM_APT=1` (venv sees the system rclpy);
# `WITH_SIM=0` skips the MuJoCo simulation stack; `TORCH_PREINSTALLED=1` keeps the torch already in the
# (system-site) environment, e.g. NVIDIA's JetPack wheel.
# `ROS_DISTRO=jazzy` picks ROS 2 Jazzy's PyPI wheels (its own venv, .venv-jazzy); `make test
# ROS_DISTRO=jazzy` then runs the tests that touch rclpy (node, ROS processes, bags, sim node).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
COLCON_VENV ?= .venv-colcon
ROS_FROM_APT ?= 0
WITH_SIM ?= 1
TORCH_PREINSTALLED ?= 0
PYTEST_ARGS ?=
# The PyPI wheel set is chosen on the command line only (`make test ROS_DISTRO=jazzy`): a sourced ROS 2
# setup.bash exports ROS_DISTRO too, and must not change what `make demo` installs. With ROS_FROM_APT=1
# the distro is whatever apt installed.
ifneq ($(origin ROS_DISTRO),command line)
override ROS_DISTRO := kilted
endif
ifeq ($(ROS_FROM_APT),1)
VENV ?= .venv
ROS_REQUIREMENTS :=
else ifeq ($(ROS_DISTRO),kilted)
VENV ?= .venv
ROS_REQUIREMENTS := requirements-ros.txt
else ifeq ($(ROS_DISTRO),jazzy)
VENV ?= .venv-jazzy
ROS_REQUIREMENTS := requirements-ros-jazzy.txt
else
$(error ROS_DISTRO=$(ROS_DISTRO): PyPI wheels exist for kilted and jazzy; for another distro install it from apt and use ROS_FROM_APT=1)
endif
PY := $(VENV)/bin/python
# What `make test` runs: everything on the default lane; on Jazzy's wheels, the tests that touch rclpy.
ifeq ($(ROS_DISTRO)-$(ROS_FROM_APT),jazzy-0)
TEST_SELECTION := test/ros test/bags test/sim/test_sim_node.py test/sim/test_closed_loop.py
else
TEST_SELECTION :=
endif

# DDS stays on this host in tests and demos (DESIGN §7; ROS_LOCALHOST_ONLY is ignored in Kilted).
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup demo test test-fast docs clean

$(VENV)/.stamp: requirements.txt $(ROS_REQUIREMENTS) requirements-sim.txt setup.py package.xml
	$(PYTHON) -m venv $(if $(filter 1,$(ROS_FROM_APT)),--system-site-packages) $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(if $(filter 1,$(TORCH_PREINSTALLED)),grep -v '^torch==' requirements.txt > $(VENV)/requirements-no-torch.txt && $(PY) -m pip install -q -r $(VENV)/requirements-no-torch.txt,$(PY) -m pip install -q -r requirements.txt)
	$(if $(ROS_REQUIREMENTS),$(PY) -m pip install -q -r $(ROS_REQUIREMENTS))
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
	OXYGEN_COLCON=$(abspath $(COLCON_VENV))/bin/colcon $(PY) -m pytest -q -m "slow or not slow" $(TEST_SELECTION) $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not ros" $(PYTEST_ARGS)

# The guides in docs/ and the API reference from the docstrings (Sphinx + MyST, as rosdoc2 builds ROS
# packages); warnings are errors. Output: docs/_build/html/index.html
$(VENV)/.docs-stamp: $(VENV)/.stamp requirements-docs.txt
	$(PY) -m pip install -q -r requirements-docs.txt
	touch $@

docs: $(VENV)/.docs-stamp
	$(PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

clean:
	rm -rf .venv .venv-jazzy $(COLCON_VENV) build install log .pytest_cache
