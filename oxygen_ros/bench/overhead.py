"""``bench overhead``: what the engine adds to one action chunk, against the single-request policy.

The same weights, observations and flow noise through two paths, each repetition timing both in
an order that alternates, so that load drift on a shared machine hits both alike:

* **policy** — ``Pi05Policy.sample_actions`` (raw observation in, chunk out; the contiguous-cache
  reference, LeRobot ``predict_action_chunk``'s structure);
* **engine** — ``Engine.submit_observation`` + ``Engine.step`` with no language request (the
  serial schedule: encode, prefill into pool blocks, denoise over the paged prefix, chunk out,
  the frame's bookkeeping).

Per path the stage times too: vision + prefill, denoise, and the rest (preprocessing and
tokenising; for the engine also its frame bookkeeping).
The first ``--warmup`` repetitions are excluded; figures are medians; the ratio is engine ÷ policy
(per repetition, then the median). Writes ``results.json`` and ``results.md`` to ``--out``.

    bench overhead --preset pi05-small --threads 1          # the engine's own cost on the CPU
    bench overhead --preset pi05-small -p static_shapes=true  # with the prompt padded to its bucket
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

# torch and the model load after the command line is checked (a bad flag answers at once)
from ..core.config import COMPILE_MODES, EngineConfig, TaskConfig
from .workload import LAYOUTS

if TYPE_CHECKING:
    import torch

    from ..core.engine.engine import Engine
    from ..core.policy import Pi05Policy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of ``bench overhead``."""
    ap = argparse.ArgumentParser(prog="bench overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="pi05-small", help="model preset (default pi05-small)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    ap.add_argument("--compile", default="none", choices=list(COMPILE_MODES), help="engine.compile (default none)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--repeats", type=int, default=10, help="measured repetitions (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="repetitions excluded at the start (default 2)")
    ap.add_argument("--steps", type=int, default=10, help="denoise steps S")
    ap.add_argument("--layout", default="aloha", choices=list(LAYOUTS), help="cameras and image sizes")
    ap.add_argument(
        "-p", dest="params", action="append", default=[], metavar="FIELD=VALUE", help="an EngineConfig field"
    )
    ap.add_argument("--out", type=Path, help="output folder (default out/bench/overhead-<time>)")
    ap.add_argument("--overwrite", action="store_true", help="write into an --out folder that already holds files")
    a = ap.parse_args(argv)
    if a.out is not None and a.out.is_dir() and any(a.out.iterdir()) and not a.overwrite:
        ap.error(
            f"--out {a.out} already holds files (an earlier run's results); choose another --out or add --overwrite"
        )
    if a.repeats < 1 or a.warmup < 0 or a.steps < 1 or a.threads < 1:
        ap.error("--repeats, --steps, --threads must be >= 1 and --warmup >= 0")
    fields = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
    for item in a.params:
        name = item.split("=", 1)[0]
        if "=" not in item or name not in fields:
            ap.error(f"-p {item!r}: expected FIELD=VALUE with FIELD one of EngineConfig's fields")
    return a


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Measure both paths (module doc); returns every sample, the medians and the ratio."""
    import torch

    from ..core.engine.engine import Engine
    from ..core.policy import Pi05Policy, frame_noise
    from .workload import observations

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    policy = Pi05Policy.from_pretrained(a.preset, device=a.device)
    extra = {k: _value(v) for k, v in (item.split("=", 1) for item in a.params)}
    cfg = EngineConfig(
        compile=a.compile,
        num_denoise_steps=a.steps,
        max_running_requests=1,
        tasks=(TaskConfig("conversation", "{text}", max_new_tokens=4),),
        **extra,
    )
    engine = Engine(policy, cfg)
    engine.warmup()
    mc = policy.cfg
    obs = observations(a.layout, a.warmup + a.repeats, seed=0)
    samples: dict[str, list[dict[str, float]]] = {"policy": [], "engine": []}
    for i, o in enumerate(obs):
        noise = frame_noise(cfg.seed, i, mc.action_horizon, mc.action_dim)
        for path in ("policy", "engine") if i % 2 == 0 else ("engine", "policy"):
            row = _policy_frame(policy, o, noise, a.steps) if path == "policy" else _engine_frame(engine, o)
            if i >= a.warmup:
                samples[path].append(row)
    med = {p: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for p, rows in samples.items()}
    ratios = [e["total"] / p["total"] for e, p in zip(samples["engine"], samples["policy"])]
    return {
        "preset": a.preset,
        "threads": a.threads,
        "compile": a.compile,
        "engine_config": extra,
        "median_s": med,
        "ratio_engine_over_policy": statistics.median(ratios),
        "ratios": ratios,
        "samples": samples,
    }


def _policy_frame(policy: Pi05Policy, o: Any, noise: torch.Tensor, steps: int) -> dict[str, float]:
    """One chunk through the policy path, with its stage times (seconds)."""
    t0 = time.perf_counter()
    enc = policy.encode_observation(o)
    t1 = time.perf_counter()
    cache, _ = policy.prefill(enc)
    t2 = time.perf_counter()
    x = policy.sample_actions_normalized(cache, noise, steps)[0].float().cpu().numpy()
    t3 = time.perf_counter()
    policy.normalizer.unnormalize_actions(x)
    t4 = time.perf_counter()
    return {"total": t4 - t0, "vision_prefill": t2 - t1, "denoise": t3 - t2, "other": (t1 - t0) + (t4 - t3)}


def _engine_frame(engine: Engine, o: Any) -> dict[str, float]:
    """One chunk through the engine (submit + step), with its stage times (seconds)."""
    t0 = time.perf_counter()
    engine.submit_observation(o)
    r = engine.step()
    t1 = time.perf_counter()
    if r.action is None:
        raise RuntimeError(f"the engine produced no chunk: {r.error}")
    m = r.metrics
    vp = m.vision + m.prefill
    return {"total": t1 - t0, "vision_prefill": vp, "denoise": m.denoise, "other": t1 - t0 - vp - m.denoise}


def markdown(res: dict[str, Any]) -> str:
    """The results as a Markdown table (milliseconds)."""
    med = res["median_s"]
    rows = ["| stage | policy ms | engine ms |", "|---|---|---|"]
    for k in ("vision_prefill", "denoise", "other", "total"):
        rows.append(f"| {k} | {1e3 * med['policy'][k]:.1f} | {1e3 * med['engine'][k]:.1f} |")
    head = (
        f"{res['preset']}, {res['threads']} thread(s), compile {res['compile']}, "
        f"engine {res['engine_config'] or 'defaults'}: engine ÷ policy = {res['ratio_engine_over_policy']:.3f}"
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Console entry (``bench overhead …``): measure, print the table, write ``--out``."""
    a = parse_args(argv)
    import torch

    from .env import environment, finish_environment

    out = a.out or Path("out") / "bench" / time.strftime("overhead-%Y%m%d-%H%M%S")
    env = environment(torch.device(a.device), torch.float32)
    res = run(a)
    res["environment"] = finish_environment(env)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    text = markdown(res)
    (out / "results.md").write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


__all__ = ["main", "markdown", "parse_args", "run"]
