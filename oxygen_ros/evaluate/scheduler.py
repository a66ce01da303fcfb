"""Episodes on Ray: one task per episode, at most ``workers`` at once, each with its resources.

Ray is the distributed engine (``ray.init()``): with no address it starts an embedded local
instance sized for ``workers`` episodes (nothing to start beforehand, gone when ``evaluate``
ends); with ``address`` (``'auto'``, or ``'ray://head:10001'``) it joins an existing cluster. Each
episode is a task reserving ``cpus`` CPUs and ``gpus`` GPUs (a fraction shares a GPU between
episodes; Ray sets ``CUDA_VISIBLE_DEVICES`` for the task), which runs the episode as a process
(:func:`oxygen_ros.evaluate.runner.run_episode`). On a cluster every node needs this package
installed and the bags / output folder at the same paths (a shared file system).

Failures are rows, never gaps: an episode whose process fails or times out is a row from the runner;
a task that Ray loses (its worker died) or that does not return within its time limit plus a margin
(cancelled with ``force=True``) is a row with ``status`` ``'failed'`` / ``'timed_out'`` made here.
Rows are handed to ``on_row`` as they finish (the caller saves each at once), so an interrupted
evaluation keeps every finished episode.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oxygen_ros.evaluate.episodes import Episode
from oxygen_ros.evaluate.runner import GRACE_S, PID_FILE, STOP_FILE, kill_episode_group, run_episode

__all__ = ["RayOptions", "embedded_ray_env", "run_episodes"]

BACKSTOP_S = 60.0
"""Seconds past an episode's own limit (and the SIGINT grace) before its Ray task is cancelled."""


class RayOptions:
    """Where and how episodes run.

    Args:
        address: ``None`` for an embedded local Ray instance, else a cluster address for
            ``ray.init(address=...)`` (``'auto'``: the cluster this machine belongs to).
        workers: episodes in flight at once (>= 1).
        cpus: CPUs reserved per episode (Ray ``num_cpus``, > 0).
        gpus: GPUs reserved per episode (Ray ``num_gpus``, >= 0; e.g. 0.5 = two per GPU).

    Raises:
        ValueError: a value out of range.
    """

    def __init__(self, address: str | None = None, workers: int = 2, cpus: float = 1.0, gpus: float = 0.0) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        if not cpus > 0 or gpus < 0:
            raise ValueError(f"--cpus-per-episode must be > 0 and --gpus-per-episode >= 0, got {cpus} and {gpus}")
        self.address, self.workers, self.cpus, self.gpus = address, int(workers), float(cpus), float(gpus)


def import_ray(embedded: bool = False) -> Any:
    """The ``ray`` module; for an ``embedded`` instance (no ``--address``) with its environment
    (:func:`embedded_ray_env`) set first — Ray reads ``RAY_AUTH_MODE`` when it is imported.

    Raises:
        ValueError: Ray is not installed (the robot's runtime requirements leave it out), saying
            what to install.
    """
    if embedded:
        embedded_ray_env()
    try:
        import ray
    except ImportError as exc:
        raise ValueError(
            f"evaluate runs its episodes on Ray, which is not installed here ({exc}); install "
            "it with `.venv/bin/pip install -r requirements-eval.txt` (or `make setup WITH_EVAL=1`)"
        ) from exc
    return ray


def embedded_ray_env() -> None:
    """Environment of the embedded Ray instance, where the user has not set it: no usage stats,
    and token authentication chosen explicitly (``RAY_AUTH_MODE=token``, Ray's own default for a
    new local instance). With the mode unset Ray enables the same token authentication but
    announces it with a WARNING on every start (ray ``_private/authentication/
    authentication_token_setup.py``, ``enable_token_auth_by_default``); an explicit mode is
    respected without one. ``RAY_AUTH_MODE=disabled`` in the environment still opts out.

    Ray reads the mode into its configuration when it is imported: set later, this process would
    talk to its own token-checking GCS without a token. So the mode is set only while Ray is not
    imported yet (otherwise Ray's default, with its warning, stays)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def _init_ray(opts: RayOptions) -> Any:
    ray = import_ray(embedded=not opts.address)
    on_sigterm = signal.getsignal(signal.SIGTERM)

    if opts.address:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=opts.address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(
            num_cpus=max(1, int(round(opts.workers * opts.cpus + 0.4999))),
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    if threading.current_thread() is threading.main_thread() and on_sigterm is not None:
        # ray.init installs its own SIGTERM handler (log and die); keep the caller's (evaluate's:
        # stop the running episodes with their nodes)
        signal.signal(signal.SIGTERM, on_sigterm)
    return ray


def _remote_episode(episode: Episode, out_dir: str, timeout_s: float, cwd: str) -> dict[str, Any]:
    """The Ray task body: run one episode as a process (see the runner)."""
    return run_episode(episode, Path(out_dir), timeout_s, cwd=cwd)


def _running_for(out_dir: Path) -> float | None:
    """Seconds since the episode's process started (its pid file), None before it started."""
    try:
        return time.time() - (out_dir / PID_FILE).stat().st_mtime
    except OSError:
        return None


def check_resources(ray: Any, opts: RayOptions) -> None:
    """Refuse per-episode resources no node can give (the tasks would wait for ever).

    Raises:
        ValueError: more CPUs or GPUs per episode than the Ray instance has.
    """
    have = ray.cluster_resources()
    for name, want in (("CPU", opts.cpus), ("GPU", opts.gpus)):
        if want > 0 and want > have.get(name, 0.0):
            raise ValueError(
                f"each episode asks for {want:g} {name} but the Ray instance has "
                f"{have.get(name, 0.0):g}; lower --{name.lower()}s-per-episode"
            )


def _lost_row(episode: Episode, status: str, error: str, wall_s: float) -> dict[str, Any]:
    return {
        "episode": episode.id,
        "kind": episode.kind,
        **episode.columns,
        "status": status,
        "error": error,
        "exit_code": None,
        "wall_s": round(wall_s, 2),
    }


def run_episodes(
    episodes: Sequence[Episode],
    out_root: Path,
    opts: RayOptions,
    timeout_s: float,
    on_row: Callable[[dict[str, Any]], None],
    progress: bool = True,
    skipped: int = 0,
) -> None:
    """Run ``episodes`` on Ray, calling ``on_row(row)`` in the caller's thread as each one ends.

    Args:
        episodes: what to run (already without the finished ones).
        out_root: episodes write into ``out_root / episode.id``.
        opts: Ray address, concurrency and per-episode resources.
        timeout_s: each episode's wall-clock limit, seconds.
        on_row: receives every episode's row, exactly once.
        progress: show a progress bar over episodes (tqdm, on stderr).
        skipped: episodes already finished (the bar starts there).

    Raises:
        KeyboardInterrupt: after stopping the episodes still running (their rows are not made).
        ImportError: Ray is not installed.
        ValueError: the per-episode resources exceed the Ray instance's (nothing was run).
    """
    if not episodes:
        return
    from tqdm import tqdm

    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / STOP_FILE).unlink(missing_ok=True)  # an earlier interrupted run's

    ray = _init_ray(opts)
    try:
        check_resources(ray, opts)
    except ValueError:
        ray.shutdown()
        raise
    task = ray.remote(_remote_episode).options(num_cpus=opts.cpus, num_gpus=opts.gpus, max_retries=0)
    cwd = os.getcwd()
    pending = list(episodes)
    running: dict[Any, tuple[Episode, float]] = {}
    counts = {"ok": 0, "failed": 0}
    bar = tqdm(
        total=skipped + len(episodes),
        initial=skipped,
        unit="episode",
        desc="evaluate",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        while pending or running:
            while pending and len(running) < opts.workers:
                ep = pending.pop(0)
                ref = task.remote(ep, str(out_root / ep.id), timeout_s, cwd)
                running[ref] = (ep, time.monotonic())
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            now = time.monotonic()
            rows = []
            for ref in done:
                ep, t0 = running.pop(ref)
                try:
                    rows.append(ray.get(ref))
                except Exception as exc:  # the worker died or the task raised
                    rows.append(_lost_row(ep, "failed", f"{type(exc).__name__}: {exc}"[:500], now - t0))
            for ref, (ep, _) in list(running.items()):
                ran = _running_for(out_root / ep.id)  # from its start, not from the submission
                if ran is not None and ran > timeout_s + GRACE_S + BACKSTOP_S:
                    ray.cancel(ref, force=True)
                    kill_episode_group(out_root / ep.id)
                    del running[ref]
                    rows.append(
                        _lost_row(
                            ep,
                            "timed_out",
                            f"the episode did not return within {ran:.0f} s of its start; its task was cancelled",
                            ran,
                        )
                    )
            for row in rows:
                counts["ok" if row["status"] == "ok" else "failed"] += 1
                on_row(row)
                bar.update(1)
                bar.set_postfix(counts, refresh=False)
    except KeyboardInterrupt:
        # Local episodes are interrupted directly (SIGINT to their process group: closed_loop stops
        # its nodes and reports), so their tasks return by themselves; then SIGKILL what is left.
        # Cancelling a task while it completes can abort Ray's core worker (task_manager.cc "Tried
        # to complete task that was not pending"), so only a cluster's episodes, which these
        # signals cannot reach, are cancelled.
        (out_root / STOP_FILE).write_text("interrupted\n")  # first: see runner.STOP_FILE
        for ep, _ in running.values():
            kill_episode_group(out_root / ep.id, signal.SIGINT)
        if opts.address:
            for ref in running:
                ray.cancel(ref)
        ray.wait(list(running), num_returns=len(running), timeout=GRACE_S + 10.0)
        for ref, (ep, _) in running.items():
            if opts.address:
                ray.cancel(ref, force=True)
            kill_episode_group(out_root / ep.id)
        raise
    finally:
        bar.close()
        ray.shutdown()
