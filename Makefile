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
# The robot needs only the runtime (requirements.txt): WITH_EVAL=0 leaves out Ray (`evaluate`),
# WITH_DEV=0 pytest.
WITH_EVAL ?= 1
WITH_DEV ?= 1
# numpy 1.x instead of 2.x (requirements-numpy1.txt): the default over apt ROS, whose packages are
# built against numpy 1.26.
NUMPY1 ?= $(ROS_FROM_APT)
RUNTIME_REQUIREMENTS = $(if $(filter 1,$(NUMPY1)),$(VENV)/requirements-runtime.txt,requirements.txt)
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

# DDS stays on this host in tests and demos (ROS_LOCALHOST_ONLY is ignored in Kilted).
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup demo test test-fast lint docs clean colcon-build check-numpy1

$(VENV)/.stamp: requirements.txt requirements-numpy1.txt requirements-eval.txt requirements-dev.txt $(ROS_REQUIREMENTS) requirements-sim.txt setup.py package.xml
	@echo "[setup 1/6] creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(if $(filter 1,$(ROS_FROM_APT)),--system-site-packages) $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	@echo "[setup 2/6] runtime requirements (torch, transformers, rosbags, OpenCV, …: the first time takes minutes)"
	$(if $(filter 1,$(NUMPY1)),grep -v -E '^(numpy|opencv-python-headless)==' requirements.txt | cat - requirements-numpy1.txt > $(VENV)/requirements-runtime.txt)
	$(if $(filter 1,$(TORCH_PREINSTALLED)),grep -v '^torch==' $(RUNTIME_REQUIREMENTS) > $(VENV)/requirements-no-torch.txt && $(PY) -m pip install -q -r $(VENV)/requirements-no-torch.txt,$(PY) -m pip install -q -r $(RUNTIME_REQUIREMENTS))
	@echo "[setup 3/6] ROS 2 $(if $(ROS_REQUIREMENTS),$(ROS_DISTRO) wheels from PyPI,from apt (system site packages))"
	$(if $(ROS_REQUIREMENTS),$(PY) -m pip install -q -r $(ROS_REQUIREMENTS))
	@echo "[setup 4/6] $(if $(filter 1,$(WITH_SIM)),MuJoCo ALOHA simulation,simulation skipped (WITH_SIM=0))"
	$(if $(filter 1,$(WITH_SIM)),$(PY) -m pip install -q -r requirements-sim.txt)
	@echo "[setup 5/6] $(if $(filter 1,$(WITH_EVAL)),evaluation (Ray),evaluation skipped (WITH_EVAL=0)); $(if $(filter 1,$(WITH_DEV)),tests (pytest),tests skipped (WITH_DEV=0))"
	$(if $(filter 1,$(WITH_EVAL)),$(PY) -m pip install -q -r requirements-eval.txt)
	$(if $(filter 1,$(WITH_DEV)),$(PY) -m pip install -q -r requirements-dev.txt)
	@echo "[setup 6/6] oxygen_ros itself (editable)"
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.stamp

$(COLCON_VENV)/.stamp: requirements-colcon.txt
	$(PYTHON) -m venv $(COLCON_VENV)
	$(COLCON_VENV)/bin/python -m pip install -q -r requirements-colcon.txt
	touch $@

# An install space for `ros2 launch`. colcon builds an ament_python package by running its setup.py with
# the interpreter colcon itself runs on (colcon_core.task.python.build: sys.executable), and setuptools
# writes that interpreter into every launcher's shebang (install/oxygen_ros/lib/oxygen_ros/*). A colcon
# from its own venv, or apt's on /usr/bin/python3, thus gives launchers that cannot import rclpy or
# torch. Here colcon runs under the project venv's python instead: the environment's colcon where
# that python can import it (apt's python3-colcon-* with ROS_FROM_APT=1), else the colcon venv's
# packages put in front of PYTHONPATH. Then, in a shell:
#   source install/setup.bash && ros2 launch oxygen_ros oxygen.launch.py
COLCON_OUT ?= .
colcon-build: setup $(COLCON_VENV)/.stamp
	@if $(PY) -c 'import colcon_core' 2>/dev/null; then pp="$$PYTHONPATH"; src="the environment's colcon"; \
	else pp="$$($(COLCON_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')$${PYTHONPATH:+:$$PYTHONPATH}"; \
	     src="colcon from $(COLCON_VENV)"; fi; \
	echo "colcon build of oxygen_ros into $(COLCON_OUT)/install ($$src), launchers running $(abspath $(PY))"; \
	PYTHONPATH="$$pp" \
	$(abspath $(PY)) -c 'import sys; from colcon_core.command import main; sys.exit(main())' \
	    build --paths . --build-base $(COLCON_OUT)/build --install-base $(COLCON_OUT)/install

demo: setup
	$(PY) -m oxygen_ros.replay.demo

test: setup $(COLCON_VENV)/.stamp
	OXYGEN_COLCON=$(abspath $(COLCON_VENV))/bin/colcon $(PY) -m pytest -q -m "slow or not slow" $(TEST_SELECTION) $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not ros" $(PYTEST_ARGS)

# Lint, format and types, with requirements-dev.txt's pinned tools: ruff (ruff.toml) and mypy
# (mypy.ini: strict for core/cache, core/engine, core/rtc; gradual elsewhere). CI runs it first.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The guides in docs/ and the API reference from the docstrings (Sphinx + MyST, as rosdoc2 builds ROS
# packages); warnings are errors. Output: docs/_build/html/index.html
$(VENV)/.docs-stamp: $(VENV)/.stamp requirements-docs.txt
	$(PY) -m pip install -q -r requirements-docs.txt
	touch $@

docs: $(VENV)/.docs-stamp
	$(PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# The runtime on numpy 1.26 (what apt ROS 2 on Ubuntu 24.04 ships): its own venv, .venv-numpy1, and the
# tests of what the robot runs (model core, engine, node, bags, replay, norm_stats; not the sim, Ray or
# the slow tests). docs/jetson.md has the result.
check-numpy1:
	$(MAKE) setup VENV=.venv-numpy1 NUMPY1=1 WITH_SIM=0 WITH_EVAL=0
	.venv-numpy1/bin/python -c "import numpy; assert numpy.__version__.startswith('1.26'), numpy.__version__; print('numpy', numpy.__version__)"
	.venv-numpy1/bin/python -m pytest -q -m "not slow" test/core test/ros test/bags test/stats test/replay $(PYTEST_ARGS)

clean:
	rm -rf .venv .venv-jazzy .venv-numpy1 $(COLCON_VENV) build install log .pytest_cache
