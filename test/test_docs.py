"""The guides cannot drift from the code: every command block marked ``<!-- check: flags -->`` in
README.md and docs/*.md is checked against the current tools.

Per command line in a marked ```bash block (``#`` comments skipped, ``\\`` continues a line,
leading ``VAR=value`` assignments allowed):

- ``make <targets> [VAR=value]``: ``make -n`` accepts it (the target exists, the variables parse);
- one of the package's console scripts (optionally ``.venv/bin/``) or ``python -m oxygen_ros.…``:
  the tool's own argparse parser accepts the flags (the tool stops right after parsing);
- ``oxygen_node``/``aloha_sim --ros-args``: ``--params-file`` exists; for ``oxygen_node`` every
  ``-p`` name is a declared node parameter and the file + overrides pass the node's own checks;
- ``ros2 launch oxygen_ros <file> name:=value``: the launch file exists and declares each argument.

Anything else in a marked block is an error, so a block is marked only when it can be checked.

Every ```bash block, marked or not, must run as written from the repository root with the venv on
``PATH`` (``source .venv/bin/activate``, getting_started.md): the first word of each command (after
``VAR=value`` assignments and ``sudo``/``env``; each side of ``|``, ``&&``, ``||``, ``;``, ``&``) is a
console script of setup.py, a file in the venv's ``bin/`` (bare or as ``.venv/bin/NAME``), a path
that exists in the repository (``./…``, ``.ci/run``) or one of :data:`SYSTEM_COMMANDS`; a page that
calls a tool by its bare name says how to put the venv on ``PATH`` before it does.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = "<!-- check: flags -->"
SCRIPTS = {  # console_scripts of setup.py: name -> module with main() (`oxygen`: entry() calls it)
    "oxygen_demo": "oxygen_ros.replay.demo",
    "bench": "oxygen_ros.bench.bench",
    "chaos_soak": "oxygen_ros.bench.soak",
    "gpu_check": "oxygen_ros.bench.gpu_check",
    "replay": "oxygen_ros.replay.replay",
    "bag_player": "oxygen_ros.bags.player",
    "record_sim_bag": "oxygen_ros.sim.record_bag",
    "record_demos": "oxygen_ros.sim.demos",
    "train": "oxygen_ros.train.train",
    "ingress_bench": "oxygen_ros.bench.ingress",
    "hostile_inputs": "oxygen_ros.ros.ingress.hostile",
    "closed_loop": "oxygen_ros.sim.closed_loop.run",
    "norm_stats": "oxygen_ros.stats.tool",
    "oxygen": "oxygen_ros.ros.cli.main",
    "evaluate": "oxygen_ros.evaluate.cli",
    "fake_robot": "oxygen_ros.sim.fake_robot.run",
}
ROS_SCRIPTS = ("oxygen_node", "aloha_sim", "scripted_policy")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def marked_blocks() -> list[tuple[str, int, str]]:
    """(page, line number of the fence, block text) for every marked block."""
    out = []
    for page in _pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            fence = lines[i + 1].strip() if i + 1 < len(lines) else ""
            assert fence == "```bash", f"{page.name}:{i + 1}: {MARK} must precede a ```bash block"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            out.append((str(page.relative_to(REPO)), i + 2, "\n".join(lines[i + 2 : end])))
    return out


def commands(block: str) -> list[list[str]]:
    """The block's command lines as argument lists (comments, continuations, env prefixes handled)."""
    joined, out = block.replace("\\\n", " "), []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        argv = shlex.split(line, comments=True)
        while argv and _ENV.match(argv[0]):
            argv = argv[1:]
        if argv:
            out.append(argv)
    return out


class _Parsed(Exception):
    pass


def _parse_flags(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the tool's ``main`` until its argparse parser has parsed ``argv``; fail on a parse error."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    main = importlib.import_module(module).main
    try:
        main(argv)
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{module} {shlex.join(argv)}: argparse refused the flags (exit {e.code})")
    pytest.fail(f"{module} {shlex.join(argv)}: main() returned without parsing flags")


def _ros_args(tool: str, argv: list[str]) -> None:
    from oxygen_ros.ros.params.node_config import ParamsFileError, load_node_config, node_specs
    from oxygen_ros.ros.params.specs import engine_specs, task_specs

    assert argv[:1] == ["--ros-args"], f"{tool}: expected --ros-args, got {argv}"
    params_file, overrides, rest = None, [], argv[1:]
    while rest:
        flag, value, rest = rest[0], rest[1] if len(rest) > 1 else None, rest[2:]
        assert value is not None, f"{tool}: {flag} needs a value"
        if flag == "--params-file":
            params_file = REPO / value
            assert params_file.is_file(), f"{tool}: parameter file {value} does not exist"
        elif flag == "-p":
            assert ":=" in value, f"{tool}: -p {value} must look like name:=value"
            overrides.append(value)
        elif flag not in ("-r", "--log-level"):
            pytest.fail(f"{tool}: unknown ROS argument {flag}")
    if tool != "oxygen_node":
        return
    try:  # the node's own checks on the file + overrides
        cfg = load_node_config(params_file, overrides)
    except ParamsFileError as e:
        pytest.fail(f"oxygen_node {shlex.join(argv)}: {e}")
    declared = {s.name for s in node_specs() + engine_specs()}
    for task in cfg.engine.tasks:
        declared |= {s.name for s in task_specs(task.name)}
    for item in overrides:
        name = item.split(":=", 1)[0]
        assert name in declared, f"oxygen_node: -p {name} is not a declared parameter"


def _launch_args(argv: list[str]) -> None:
    assert argv[:2] == ["launch", "oxygen_ros"] and len(argv) >= 3, f"ros2 {shlex.join(argv)}"
    path = REPO / "launch" / argv[2]
    assert path.is_file(), f"launch file {argv[2]} does not exist"
    tree = ast.parse(path.read_text())
    declared = {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "DeclareLaunchArgument"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }
    for item in argv[3:]:
        name = item.split(":=", 1)[0]
        assert ":=" in item and name in declared, f"{argv[2]}: launch argument {item!r} is not declared"


def check_command(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Check one command line (see the module docstring); fails the test on drift."""
    tool = argv[0].removeprefix(".venv/bin/")
    if tool == "make":
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        r = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True, env=env)
        assert r.returncode == 0, f"make -n {shlex.join(argv[1:])}: {r.stderr.strip()}"
    elif tool in SCRIPTS:
        _parse_flags(SCRIPTS[tool], argv[1:], monkeypatch)
    elif tool in ("python", "python3") and argv[1:2] == ["-m"] and argv[2].startswith("oxygen_ros."):
        _parse_flags(argv[2], argv[3:], monkeypatch)
    elif tool in ROS_SCRIPTS:
        _ros_args(tool, argv[1:])
    elif tool == "ros2":
        _launch_args(argv[1:])
    else:
        pytest.fail(f"{shlex.join(argv)}: not a command this test can check; leave its block unmarked")


BLOCKS = marked_blocks()


def test_the_guides_mark_their_commands() -> None:
    pages = {page for page, _, _ in BLOCKS}
    assert len(BLOCKS) >= 10 and "README.md" in pages, (len(BLOCKS), pages)


@pytest.mark.parametrize("page,line,block", BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_marked_command_block_matches_the_code(
    page: str, line: int, block: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmds = commands(block)
    assert cmds, f"{page}:{line}: marked block has no command"
    for argv in cmds:
        check_command(argv, monkeypatch)


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--no-such-flag"],
        ["bench", "--threads", "many"],
        ["make", "no-such-target"],
        ["oxygen_node", "--ros-args", "-p", "engine.no_such_parameter:=1"],
        ["oxygen_node", "--ros-args", "--params-file", "config/missing.yaml"],
        ["ros2", "launch", "oxygen_ros", "oxygen.launch.py", "no_such_arg:=1"],
        ["ros2", "topic", "echo", "/conversation/text"],
        ["oxygen", "lifecycle", "reboot"],
    ],
)
def test_the_checker_catches_drift(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises((pytest.fail.Exception, AssertionError)):
        check_command(argv, monkeypatch)


@pytest.mark.parametrize(
    "argv",
    [
        ["make", "test", "ROS_DISTRO=jazzy"],
        [".venv/bin/bench", "--threads", "1"],
        ["python", "-m", "oxygen_ros.replay.replay", "data/aloha_sim_sample", "--timing", "recorded"],
        ["oxygen_node", "--ros-args", "--params-file", "config/aloha.yaml", "-p", "model:=pi05-tiny"],
        ["ros2", "launch", "oxygen_ros", "oxygen.launch.py", "model:=pi05-tiny"],
        [".venv/bin/oxygen", "params", "set", "tasks.conversation.temperature", "0.7", "--node", "/robot/oxygen"],
    ],
)
def test_the_checker_accepts_current_commands(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    check_command(argv, monkeypatch)


# ------------------------------------------------------------------ every command of every bash block resolves
# Commands the guides may call that are not this project's: the system's, ROS 2's and the tools of other
# projects a guide points to (openpi's `uv run` in an openpi checkout, Docker, apt on the robot).
SYSTEM_COMMANDS = frozenset(
    {
        "apt",
        "apt-get",
        "cat",
        "cd",
        "colcon",
        "cp",
        "curl",
        "docker",
        "echo",
        "export",
        "git",
        "kill",
        "ls",
        "make",
        "mkdir",
        "mv",
        "nvidia-smi",
        "pip",
        "pip3",
        "python",
        "python3",
        "rm",
        "ros2",
        "sleep",
        "source",
        "tar",
        "uv",
        "wait",
    }
)
_PREFIXES = ("sudo", "env", "time", "nohup")
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&", "(", ")"})
VENV_BIN = Path(sys.executable).parent
PATH_LINE = "source .venv/bin/activate"


def bash_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first line, block text) of every ```bash block of a page's text."""
    lines, out, start = text.splitlines(), [], None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```bash":
            start = i + 1
        elif start is not None and line.strip() == "```":
            out.append((start + 1, "\n".join(lines[start:i])))
            start = None
    return out


def command_lines(block: str, first_line: int) -> list[tuple[int, str]]:
    """(line number, command) per command line of a block: ``\\`` continuations joined, comments and
    blank lines skipped."""
    out, pending, pending_line = [], "", 0
    for n, line in enumerate(block.splitlines(), first_line):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending_line = pending_line if pending else n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((pending_line, pending + line))
        pending = ""
    if pending:
        out.append((pending_line, pending))
    return out


def first_words(command: str) -> list[str]:
    """The program each simple command of a shell line runs: the first word after ``VAR=value``
    assignments and ``sudo``/``env``/``time``/``nohup``, on each side of ``|``, ``&&``, ``||``, ``;``
    and ``&``. Raises ValueError where the line is not valid shell quoting."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words, expect = [], True
    for token in lexer:
        if token in _SEPARATORS:
            expect = True
        elif expect and not (_ENV.match(token) or token in _PREFIXES):
            words.append(token)
            expect = False
    return words


def resolves(word: str) -> bool:
    """Whether ``word`` runs from the repository root with the venv on PATH (see the module docstring)."""
    if word.startswith(".venv/bin/"):
        name = word.removeprefix(".venv/bin/")
        return name in _console_scripts() or (VENV_BIN / name).is_file()
    if "/" in word:
        return (REPO / word).exists()
    return word in SYSTEM_COMMANDS or word in _console_scripts() or (VENV_BIN / word).is_file()


def unresolved_commands(page: str, text: str) -> list[str]:
    """One message per command of the page's ```bash blocks that does not resolve, naming the page,
    the line and the command; and one for a bare tool name used before the page puts the venv on
    PATH."""
    lines, errors = text.splitlines(), []
    tools = set(_console_scripts()) | {p.name for p in VENV_BIN.iterdir()} - SYSTEM_COMMANDS
    for first, block in bash_blocks(text):
        for line, command in command_lines(block, first):
            try:
                words = first_words(command)
            except ValueError as e:
                errors.append(f"{page}:{line}: `{command.strip()}`: not valid shell ({e})")
                continue
            for word in words:
                if not resolves(word):
                    errors.append(
                        f"{page}:{line}: `{command.strip()}`: {word!r} is not a console script of "
                        f"setup.py, a file in the venv ({VENV_BIN}), a path in the repository or a "
                        "system command of SYSTEM_COMMANDS in test/test_docs.py"
                    )
                elif word in tools and not any(PATH_LINE in ln for ln in lines[: line - 1]):
                    errors.append(
                        f"{page}:{line}: `{command.strip()}`: {word!r} runs only with the venv on "
                        f"PATH, and the page does not say `{PATH_LINE}` before it (or write "
                        f".venv/bin/{word})"
                    )
    return errors


@pytest.mark.parametrize("page", _pages(), ids=[p.name for p in _pages()])
def test_every_command_of_the_guides_runs_as_written(page: Path) -> None:
    errors = unresolved_commands(str(page.relative_to(REPO)), page.read_text())
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    "command,word",
    [
        ("frobnicate --fast", "frobnicate"),  # a bare command that exists nowhere
        ("replays data/aloha_sim_sample", "replays"),  # a misspelled console script
        ("make demo && frobnicate", "frobnicate"),
        ("cat notes.txt | frobnicate -x", "frobnicate"),
        ("sudo ROS_DOMAIN_ID=3 frobnicate", "frobnicate"),
        (".venv/bin/no_such_tool --help", ".venv/bin/no_such_tool"),
        ("./scripts/no_such_script.sh", "./scripts/no_such_script.sh"),
    ],
)
def test_the_resolver_names_a_command_that_does_not_exist(command: str, word: str) -> None:
    page = f"Intro.\n\n```bash\nmake setup\n{command}\n```\n"
    errors = unresolved_commands("docs/fake.md", page)
    assert len(errors) == 1 and errors[0].startswith(f"docs/fake.md:5: `{command}`: {word!r} is not"), errors


def test_the_resolver_wants_the_path_line_before_a_bare_tool() -> None:
    bare = "```bash\nreplay data/aloha_sim_sample\n```\n"
    errors = unresolved_commands("docs/fake.md", bare)
    assert len(errors) == 1 and "docs/fake.md:2:" in errors[0] and PATH_LINE in errors[0], errors
    assert unresolved_commands("docs/fake.md", f"`{PATH_LINE}` first.\n\n{bare}") == []


@pytest.mark.parametrize(
    "command",
    [
        "replay data/aloha_sim_sample --out out/r",  # console script, on PATH after the line
        ".venv/bin/oxygen_node --ros-args --params-file config/aloha.yaml",
        "ray start --head",  # a file of the venv's bin/
        'ROS_DOMAIN_ID=42 oxygen status --key "shadow*"',
        "sudo apt install ros-jazzy-ros-base python3-venv   # from apt",
        "git clone <this repo> oxygen_ros && cd oxygen_ros",
        ".ci/run",
        "cp -r /tmp/ckpt /tmp/nostats && rm /tmp/nostats/policy_*",
        'echo \'{"vision": {"num_heads": 2}}\' > /tmp/ckpt/oxygen_config.json',
    ],
)
def test_the_resolver_accepts_what_runs(command: str) -> None:
    assert unresolved_commands("docs/fake.md", f"{PATH_LINE}\n```bash\n{command}\n```\n") == []


def test_command_lines_join_continuations_and_keep_line_numbers() -> None:
    block = "# a comment\nreplay a \\\n    --out b\n\nbench --quick   # trailing comment"
    assert command_lines(block, 10) == [(11, "replay a      --out b"), (14, "bench --quick   # trailing comment")]
    assert first_words("A=1 B=2 sudo env C=3 make x | tee y && ./z; w & v") == ["make", "tee", "./z", "w", "v"]


def _console_scripts() -> dict[str, str]:
    """``name -> module`` of setup.py's console_scripts (read statically)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    entries = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and re.match(r"^\w+ = oxygen_ros\.[\w.]+:(main|entry)$", n.value)
    ]
    return {e.split(" = ")[0]: e.split(" = ")[1].split(":")[0] for e in entries}


def test_the_checked_tools_are_the_console_scripts_of_the_venv() -> None:
    """The guides call the tools by their console-script names (with the venv on PATH, as
    getting_started.md says): every name the checker accepts is an entry point of setup.py whose
    module exists, and is installed next to this interpreter (the venv's bin/)."""
    scripts = _console_scripts()
    assert set(SCRIPTS) | set(ROS_SCRIPTS) == set(scripts), set(SCRIPTS) ^ set(scripts) ^ set(ROS_SCRIPTS)
    for name, module in scripts.items():
        assert importlib.util.find_spec(module) is not None, (name, module)
        assert (Path(sys.executable).parent / name).exists(), (
            f"{name} is not installed in {Path(sys.executable).parent}"
        )


# ------------------------------------------------------------------ sample outputs (docs/_samples/refresh.py)
def _samples_module():
    spec = importlib.util.spec_from_file_location("refresh_samples", REPO / "docs" / "_samples" / "refresh.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sample_blocks() -> list[tuple[str, str, str]]:
    """(page, sample name, block text) of every ``<!-- sample: NAME -->`` block."""
    mod = _samples_module()
    return [(page.name, m[1], m[2]) for page in _pages() for m in mod.MARK.finditer(page.read_text())]


def _report_labels(text: str) -> list[str]:
    """The report's line labels (its first 18 columns, numbers and values masked) from 'replay of' on."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("replay of "))
    return ["replay of"] + [line[:18].rstrip() for line in lines[start + 1 :] if line[:18].strip()]


def test_every_sample_block_names_a_sample_the_script_makes() -> None:
    names = {name for _, name, _ in _sample_blocks()}
    assert names and names <= set(_samples_module().SAMPLES), names
    assert {p for p, n, _ in _sample_blocks() if n == "demo"} == {"README.md", "getting_started.md"}


@pytest.mark.slow
def test_the_demo_sample_has_the_structure_of_the_report_the_replay_prints_now(tmp_path) -> None:
    """The README / getting-started sample is a real `make demo` run (docs/_samples/refresh.py); the
    replay of the same bag with the same parameter file on pi05-tiny must print the same lines with
    the same labels — a line added, removed or renamed in the report fails here until the samples
    are refreshed."""
    from oxygen_ros.replay.replay import ReplayOptions, replay

    result = replay(
        ReplayOptions(
            bag=REPO / "data" / "aloha_sim_sample",
            out=tmp_path / "out",
            progress="off",
            show_text=False,
            plots=False,
            params=("model:=pi05-tiny", "num_threads:=1"),
        )
    )
    want = _report_labels(result.report)
    for page, name, block in _sample_blocks():
        if name == "demo":
            assert _report_labels(block) == want, (page, _report_labels(block), want)


def test_the_norm_stats_sample_is_what_norm_stats_prints(tmp_path, capsys) -> None:
    from oxygen_ros.stats.tool import main as norm_stats

    assert (
        norm_stats(
            [
                "data/aloha_sim_sample",
                "--params-file",
                str(REPO / "config" / "oxygen.yaml"),
                "--out",
                str(tmp_path),
                "--progress",
                "off",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.replace(str(tmp_path), "/tmp/stats").splitlines()
    block = next(b for _, n, b in _sample_blocks() if n == "norm_stats").splitlines()
    assert block[1:3] == out[:2] and block[-1] == out[-1], (block, out)
