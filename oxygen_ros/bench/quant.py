"""``bench quant``: what each weight format (the ``weights`` load option) costs in accuracy and buys in speed.

Per format, against the unquantized reference of the device (fp32 on a CPU, bf16 on CUDA):

* **actions** — max / mean absolute error of the normalised action chunk (same observation, same
  flow noise), on the parity checkpoint (LeRobot's tiny π0.5 in ``test/data/parity``) and on the
  preset's random weights (default ``pi05-small``), over ``--observations`` observations;
* **text** — greedy-token agreement: the fraction of the ``--decode-steps`` positions where the
  greedy token equals the reference's (same observation and prompt, EOS ignored so both decode
  every step), and the first position where they differ;
* **speed** (preset only) — each stage timed in pairs (reference and format alternately, the order
  swapped every repeat; eager; warm-up repeats excluded): ``vision``, ``prefill``, ``denoise`` (all
  S steps), ``decode`` (one step, one row, LM head included); the table gives each format's median
  and the median of the paired ratios format ÷ reference, and the "% of limit" of the stage
  (:func:`~.roofline.against_floor` on this device: the CPU probed now, a CUDA GPU from the table;
  the vision tower is never quantized, so its floor uses the reference's format).

Formats the device cannot run (fp8 and int4 on a CPU) appear as rows saying why. Writes
``results.json`` and ``results.md`` to ``--out`` and prints the Markdown.

    bench quant --threads 1                 # CPU: fp32 (reference), bf16, int8; fp8 / int4 say n/a
    bench quant --device cuda               # bf16 (reference), fp8, int8, int4
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.config import WEIGHT_FORMATS

if TYPE_CHECKING:
    import torch

    from ..core.policy import Pi05Policy
    from ..core.types import Observation

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "test" / "data" / "parity"
STAGES = ("vision", "prefill", "denoise", "decode")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench quant", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="pi05-small", help="random-weight preset for accuracy and speed")
    ap.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda if available)")
    ap.add_argument("--formats", nargs="+", choices=WEIGHT_FORMATS, help="default: every format")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--observations", type=int, default=3, help="observations for the action errors")
    ap.add_argument("--decode-steps", type=int, default=16, help="greedy decode steps compared")
    ap.add_argument("--steps", type=int, default=10, help="denoise steps S")
    ap.add_argument("--repeats", type=int, default=5, help="timed pairs per stage (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed pairs first")
    ap.add_argument("--parity", type=Path, default=PARITY, help="folder of the parity checkpoint and reference.npz")
    ap.add_argument("--no-speed", action="store_true", help="accuracy only")
    ap.add_argument("--out", type=Path, help="output folder (default out/bench/quant-<time>)")
    return ap.parse_args(argv)


# ------------------------------------------------------------------------------------------ inputs
def random_observation(policy: Pi05Policy, seed: int) -> Observation:
    """A synthetic observation: every camera slot, a state in [-1, 1], a fixed instruction."""
    import numpy as np

    from ..core.types import Observation

    rng = np.random.default_rng(seed)
    return Observation(
        images={s: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for s in policy.cfg.image_slots},
        state=rng.uniform(-1, 1, policy.normalizer.state_dim).astype(np.float32),
        instruction="pick up the red cube and put it in the bowl",
        stamp=float(seed),
    )


def parity_inputs(folder: Path) -> tuple[Path, list[Observation], torch.Tensor]:
    """The parity checkpoint copied to a temporary folder with the one line the loader asks for
    (SigLIP's head count, as ``test/core/test_parity.py``), its observation and its flow noise."""
    import numpy as np
    import torch

    from ..core.types import Observation

    ref = np.load(folder / "reference.npz")
    dst = Path(tempfile.mkdtemp(prefix="quant-parity-")) / "tiny_lerobot_pi05"
    shutil.copytree(folder / "tiny_lerobot_pi05", dst)
    dims = json.loads((dst / "tiny_model_dims.json").read_text())
    heads = dims["vision"]["num_attention_heads"]
    (dst / "oxygen_config.json").write_text(json.dumps({"vision": {"num_heads": heads}}))
    cams = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    obs = Observation(
        images={c: ref["images_u8"][i] for i, c in enumerate(cams)},
        state=ref["state"].copy(),
        instruction="pick up the red cube",
        stamp=1.0,
    )
    return dst, [obs], torch.from_numpy(ref["noise"])


def flow_noise(policy: Pi05Policy, seed: int) -> torch.Tensor:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, policy.cfg.action_horizon, policy.cfg.action_dim, generator=g)


# ---------------------------------------------------------------------------------------- accuracy
def action_errors(
    ref: Pi05Policy, q: Pi05Policy, observations: list[Observation], noises: list[torch.Tensor]
) -> dict[str, float]:
    """Max and mean absolute error of ``q``'s normalised chunks against ``ref``'s, and the largest
    reference magnitude (the scale the error is read against)."""
    import numpy as np

    errs, scale = [], 0.0
    for obs, noise in zip(observations, noises):
        a = ref.sample_actions(obs, noise=noise.clone(), normalized=True)
        b = q.sample_actions(obs, noise=noise.clone(), normalized=True)
        errs.append(np.abs(b - a))
        scale = max(scale, float(np.abs(a).max()))
    e = np.concatenate([x.ravel() for x in errs])
    finite = bool(np.isfinite(e).all())
    return {"max_abs": float(e.max()), "mean_abs": float(e.mean()), "ref_max_abs": scale, "finite": finite}


def token_agreement(ref: Pi05Policy, q: Pi05Policy, obs: Observation, steps: int) -> dict[str, Any]:
    """Greedy decode of ``steps`` tokens from the observation's prefix (EOS ignored) by both
    policies: the fraction of equal positions, the first differing one (None: all equal) and how
    many distinct tokens the reference emitted."""
    eos = ref.eos_id, q.eos_id
    ref.eos_id = q.eos_id = -1
    try:
        a = ref.generate_text(obs, max_new_tokens=steps).token_ids
        b = q.generate_text(obs, max_new_tokens=steps).token_ids
    finally:
        ref.eos_id, q.eos_id = eos
    same = [x == y for x, y in zip(a, b)]
    first = next((i for i, s in enumerate(same) if not s), None)
    return {
        "agreement": sum(same) / max(len(same), 1),
        "first_difference": first,
        "steps": len(same),
        "distinct_ref_tokens": len(set(a)),  # 1: a constant sequence, a weak test of agreement
    }


# ------------------------------------------------------------------------------------------ speed
def stage_times(policy: Pi05Policy, obs: Observation, noise: torch.Tensor, steps: int, decode: int) -> dict[str, float]:
    """Seconds of each stage for one observation (decode: median of ``decode`` single-token steps,
    LM head included)."""
    import torch

    m = policy.model
    dev = m.device

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    enc = policy.encode_observation(obs)
    out: dict[str, float] = {}
    with torch.inference_mode():
        t0 = now()
        img = m.embed_images(enc.pixels, enc.image_masks)
        out["vision"] = now() - t0
        t0 = now()
        emb, valid = m.embed_prefix(enc.pixels, enc.image_masks, enc.tokens, enc.token_masks, image_embeds=img)
        cache = policy.new_cache(1, emb.shape[1] + decode)
        hidden = m.prefill(emb, valid, cache.prefill_view(valid))
        out["prefill"] = now() - t0
        t0 = now()
        m.sample_actions(cache.denoise_view(policy.cfg.action_horizon), noise.to(dev), steps)
        out["denoise"] = now() - t0
        tok = m.logits(hidden).argmax(-1, keepdim=True)
        one = torch.ones_like(tok, dtype=torch.bool)
        times = []
        for _ in range(decode):
            t0 = now()
            tok = m.decode_step(cache.extend_view(one), tok, one).argmax(-1, keepdim=True)
            times.append(now() - t0)
        out["decode"] = statistics.median(times)
    return out


def paired_speed(
    ref: Pi05Policy, q: Pi05Policy, obs: Observation, noise: torch.Tensor, a: argparse.Namespace
) -> dict[str, Any]:
    """Stage medians of both policies and the median of the paired ratios q ÷ ref."""
    runs: dict[str, list[dict[str, float]]] = {"ref": [], "q": []}
    decode = min(a.decode_steps, 8)
    for r in range(a.warmup + a.repeats):
        order = [("ref", ref), ("q", q)] if r % 2 == 0 else [("q", q), ("ref", ref)]
        for key, pol in order:
            t = stage_times(pol, obs, noise, a.steps, decode)
            if r >= a.warmup:
                runs[key].append(t)
    return {
        "ref_s": {s: statistics.median(t[s] for t in runs["ref"]) for s in STAGES},
        "s": {s: statistics.median(t[s] for t in runs["q"]) for s in STAGES},
        "ratio": {s: statistics.median(x[s] / y[s] for x, y in zip(runs["q"], runs["ref"])) for s in STAGES},
    }


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the parameters occupy (a quantized tensor subclass: the sum of its inner tensors)."""
    total = 0
    for p in model.parameters():
        flatten: Callable[[], tuple[list[str], Any]] | None = getattr(p, "__tensor_flatten__", None)
        if flatten is None:
            total += p.nbytes
        else:
            total += sum(getattr(p, n).nbytes for n in flatten()[0])
    return total


def percent_of_limit(
    policy: Pi05Policy, spec: Any, fmt: str, obs: Observation, steps: int, s: dict[str, float]
) -> dict[str, float | None]:
    """Each stage's "% of limit" (:func:`~.roofline.against_floor`) for ``fmt`` weights; the vision
    tower is never quantized, so its floor is computed with the model's float format."""
    import torch

    from .roofline import Workload, against_floor

    enc = policy.encode_observation(obs)
    cams = int(enc.image_masks.sum())
    prefix = enc.prefix_len
    w = Workload(
        cameras=cams,
        prompt_tokens=prefix - cams * policy.cfg.vision.num_tokens,
        horizon=policy.cfg.action_horizon,
        steps=steps,
        batch=1,
        tokens=8,
        context=prefix + 8,
    )
    measured = [{"stage": "prefill", "median": s["prefill"]}, {"stage": "denoise", "median": s["denoise"]}]
    measured.append({"stage": "decode", "batch": 1, "median": s["decode"]})
    rows = against_floor(policy.cfg, spec, fmt, w, measured)
    float_fmt = "fp32" if policy.model.dtype == torch.float32 else "bf16"
    rows += against_floor(policy.cfg, spec, float_fmt, w, [{"stage": "vision", "median": s["vision"]}])
    names = {"vision": "vision", "prefill": "prefill", "decode + head": "decode"}
    out: dict[str, float | None] = {}
    for r in rows:
        key = "denoise" if r["stage"].startswith("denoise") else names.get(r["stage"], r["stage"])
        out[key] = r["pct_of_limit"]
    return out


# ------------------------------------------------------------------------------------------ report
def _f(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def markdown(doc: dict[str, Any]) -> str:
    """The accuracy table and the speed table."""
    st = doc["settings"]
    lines = [
        f"### bench quant — {st['device_name']}, torch {st['torch']}, torchao {st['torchao']}, "
        f"{st['threads']} thread(s); reference {st['reference']}",
        "",
        "| weights | parity ckpt: action max / mean abs err | parity: greedy tokens equal | "
        f"{st['preset']}: action max / mean abs err | {st['preset']}: greedy tokens equal | weight MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['weights']} | n/a: {r['error']} | | | | |")
            continue
        cells = [r["weights"]]
        for src in ("parity", "preset"):
            acc = r[src]
            e, t = acc["actions"], acc["tokens"]
            first = "" if t["first_difference"] is None else f" (first differs at {t['first_difference']})"
            distinct = f", {t['distinct_ref_tokens']} distinct"
            cells += [f"{e['max_abs']:.2e} / {e['mean_abs']:.2e}", f"{100 * t['agreement']:.0f} %{first}{distinct}"]
        cells.append(f"{r['weight_mb']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    speed = [r for r in doc["rows"] if r.get("speed")]
    if speed:
        lines += [
            "",
            f"Speed, {st['preset']}, {st['device_name']} ({doc.get('limit_device') or 'no roofline figures'}), "
            f"S = {st['steps']}, paired ({st['repeats']} pairs after {st['warmup']} warm-up), eager: "
            "stage ms (format ÷ reference, median of pairs; % of limit)",
            "",
            "| weights | " + " | ".join(STAGES) + " |",
            "|---|" + "---|" * len(STAGES),
        ]
        for r in speed:
            sp, pct = r["speed"], r.get("pct_of_limit", {})
            cells = [f"{1e3 * sp['s'][s]:.2f} (×{sp['ratio'][s]:.2f}; {_f(pct.get(s), '.1f')} %)" for s in STAGES]
            lines.append(f"| {r['weights']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """Console entry (``bench quant …``); 0 on success, 2 on a bad environment."""
    a = parse_args(argv)
    import torch

    from ..core.model.quantize import WeightFormatError, check_weight_format
    from ..core.policy import Pi05Policy
    from .roofline import device_spec

    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench quant: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    ref_fmt = "bf16" if device.type == "cuda" else "fp32"
    formats = [f for f in (a.formats or WEIGHT_FORMATS) if f != ref_fmt]
    out = a.out or Path("out/bench") / f"quant-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        from importlib.metadata import version

        torchao_version = version("torchao")
    except ImportError:  # PackageNotFoundError is an ImportError: the quantized rows will say so
        torchao_version = "absent"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    settings = {
        "preset": a.preset,
        "device": str(device),
        "device_name": name,
        "torch": torch.__version__,
        "torchao": torchao_version,
        "threads": torch.get_num_threads(),
        "reference": ref_fmt,
        "steps": a.steps,
        "repeats": a.repeats,
        "warmup": a.warmup,
        "decode_steps": a.decode_steps,
        "observations": a.observations,
    }
    t_start = time.perf_counter()
    folder, p_obs, p_noise = parity_inputs(a.parity)
    refs = {
        "parity": Pi05Policy.from_pretrained(folder, device=device, weights=ref_fmt),
        "preset": Pi05Policy.from_pretrained(a.preset, device=device, weights=ref_fmt),
    }
    inputs = {
        "parity": (p_obs, [p_noise]),
        "preset": (
            [random_observation(refs["preset"], i) for i in range(a.observations)],
            [flow_noise(refs["preset"], i) for i in range(a.observations)],
        ),
    }
    spec = None if a.no_speed else device_spec(device.type, name)

    def _source(src: str) -> str | Path:
        return folder if src == "parity" else a.preset

    rows: list[dict[str, Any]] = []
    for fmt in [ref_fmt, *formats]:
        row: dict[str, Any] = {"weights": fmt}
        try:
            check_weight_format(fmt, device)
        except WeightFormatError as e:
            rows.append({**row, "error": str(e).split(": ", 1)[-1].split(";")[0]})
            continue
        for src, ref in refs.items():
            try:
                q = ref if fmt == ref_fmt else Pi05Policy.from_pretrained(_source(src), device=device, weights=fmt)
            except (WeightFormatError, ImportError) as e:  # e.g. torchao absent, int4 widths that do not divide
                row = {"weights": fmt, "error": str(e)}
                break
            obs, noises = inputs[src]
            row[src] = {
                "actions": action_errors(ref, q, obs, noises),
                "tokens": token_agreement(ref, q, obs[0], a.decode_steps),
            }
            if src == "preset":
                row["weight_mb"] = weight_bytes(q.model) / 2**20
                if not a.no_speed:
                    row["speed"] = paired_speed(ref, q, obs[0], noises[0], a)
                    if spec is not None:
                        row["pct_of_limit"] = percent_of_limit(q, spec, fmt, obs[0], a.steps, row["speed"]["s"])
        rows.append(row)
        print(f"bench quant: {fmt} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    shutil.rmtree(folder.parent, ignore_errors=True)
    doc = {
        "schema": "oxygen_ros.bench.quant/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "settings": settings,
        "limit_device": None if spec is None else f"% of limit on {spec.name}: {spec.note}",
        "rows": rows,
        "duration_s": time.perf_counter() - t_start,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    (out / "results.md").write_text(md)
    print(md)
    print(f"bench quant: wrote {out / 'results.json'}, results.md")
    return 0


__all__ = ["action_errors", "main", "markdown", "paired_speed", "percent_of_limit", "stage_times", "token_agreement"]
