"""Turns the engine's plans into tensor work on the paged K/V pool.

Prefill of a frame prefix into pool blocks, the action path over the read-only prefix, the
prompt extension of newly admitted language requests, and one batched decode step over any set of
requests — each row at its own position and length, reading its own block tables (no K/V is
copied when requests join or leave a batch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..cache.block_pool import BlockTable
from ..cache.kv_pool import KVPool, PagedDecodeView, PagedExtendView, PagedPrefillView, paged_denoise_view
from ..model.sampling import SamplingParams, sample_rows
from ..policy import EncodedObservation, Pi05Policy
from .requests import LanguageRequest
from .streams import DeviceStreams


@dataclass
class FramePrefix:
    """A prefilled observation prefix held in pool blocks.

    ``blocks`` carry one reference for the frame itself plus one per language request using it.
    ``slots[i]`` is the pool slot of the token at position ``i`` (``slot_tensor``: the same as a
    CPU int64 tensor); ``last_hidden`` is ``[1, W]``.
    """

    frame_id: int
    blocks: list[int]
    slots: list[int]
    last_hidden: torch.Tensor
    stage_times: dict[str, float] = field(default_factory=dict)
    slot_tensor: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.slot_tensor = torch.as_tensor(self.slots, dtype=torch.long)  # built once, shared

    @property
    def length(self) -> int:
        """Valid prefix tokens."""
        return len(self.slots)

class Runner:
    """Executes prefill / denoise / prompt extension / decode on one model and one pool."""

    DECODE_SLACK = 16  # spare columns of a stacked decode batch (steps before it is rebuilt)

    def __init__(self, policy: Pi05Policy, pool: KVPool, streams: DeviceStreams) -> None:
        self.policy = policy
        self.model = policy.model
        self.pool = pool
        self.streams = streams
        self._plan: tuple[tuple[int, ...], torch.Tensor, int] | None = None  # decode rows of the batch

    def release_scratch(self) -> None:
        """Drop the cached stacked decode rows (the frame's scratch; rebuilt on the next step)."""
        self._plan = None

    # ------------------------------------------------------------------ prefix
    @torch.inference_mode()
    def prefill(self, enc: EncodedObservation, frame_id: int, table: BlockTable) -> FramePrefix:
        """Prefill ``enc`` into ``table`` (which must be empty; blocks are allocated here).

        Raises:
            PoolExhausted: not enough free blocks (the scheduler's reserve prevents this).
        """
        m = self.model
        t0 = time.perf_counter()
        img = m.embed_images(enc.pixels, enc.image_masks)
        self.streams.sync()
        t1 = time.perf_counter()
        emb, valid = m.embed_prefix(enc.pixels, enc.image_masks, enc.tokens, enc.token_masks, image_embeds=img)
        slots = table.append(int(valid.sum()))
        hidden = m.prefill(emb, valid, PagedPrefillView(self.pool, valid, [slots]))
        self.streams.sync()
        t2 = time.perf_counter()
        return FramePrefix(frame_id, list(table.blocks), list(slots), hidden,
                           {"vision": t1 - t0, "prefill": t2 - t1})

    # ------------------------------------------------------------------ actions
    @torch.inference_mode()
    def actions(self, prefix: FramePrefix, noise: torch.Tensor, num_steps: int) -> np.ndarray:
        """Action chunk ``[H, robot_dim]`` (robot units) over the read-only prefix.

        Raises:
            NonFiniteActionError: the model produced NaN/inf.
        """
        view = paged_denoise_view(self.pool, [prefix.slot_tensor], self.model.cfg.action_horizon)
        x = self.model.sample_actions(view, noise.to(self.model.device), num_steps)
        return self.policy.normalizer.unnormalize_actions(x[0].float().cpu().numpy())

    # ------------------------------------------------------------------ text
    @staticmethod
    def _row(r: LanguageRequest) -> torch.Tensor:
        """The request's slot row: its prefix slots, then every slot reserved for its own tokens
        (all its blocks are reserved at admission). Built once per request; a batch step only
        slices these rows, so joining or leaving a batch copies nothing."""
        row = r.runtime.get("row")
        if row is None:
            table = r.runtime["table"]
            own = torch.as_tensor([table.slot(j) for j in range(table.capacity)], dtype=torch.long)
            row = r.runtime["row"] = torch.cat([r.runtime["prefix"].slot_tensor, own])
        return row

    def _extend_view(self, reqs: list[LanguageRequest], counts: list[int], valid: torch.Tensor) -> PagedExtendView:
        """View appending ``counts[i]`` tokens to request ``i`` (claims the slots in its table)."""
        rows = [self._row(r) for r in reqs]
        past = [r.runtime["prefix"].length + r.runtime["table"].num_tokens for r in reqs]
        for r, n in zip(reqs, counts):
            r.runtime["table"].advance(n)  # within the blocks reserved at admission
        lengths = [p + n for p, n in zip(past, counts)]
        width = max(lengths)
        read = torch.stack([row[:width] if row.numel() >= width else F.pad(row, (0, width - row.numel()))
                            for row in rows])
        new = torch.cat([row[p:p + n] for row, p, n in zip(rows, past, counts)])
        return PagedExtendView(self.pool, read, torch.as_tensor(lengths), torch.as_tensor(past), new, valid)

    def _sample(self, reqs: list[LanguageRequest], logits: torch.Tensor) -> tuple[list[int], list[bool]]:
        params = [SamplingParams(r.temperature, r.top_k, r.seed) for r in reqs]
        gens = [r.runtime.get("generator") for r in reqs]
        return sample_rows(logits, params, gens)

    @torch.inference_mode()
    def start(self, reqs: list[LanguageRequest]) -> tuple[list[int], list[bool]]:
        """First token of newly admitted requests (each with ``runtime['prefix']`` and an own
        ``runtime['table']`` already reserved).

        Requests with prompt ids run one batched causal extension over their prefix; the others
        take the LM head of their prefix's last valid hidden state (no forward).
        """
        toks: dict[int, int] = {}
        oks: dict[int, bool] = {}
        with_prompt = [r for r in reqs if r.prompt_ids]
        without = [r for r in reqs if not r.prompt_ids]
        if with_prompt:
            width = max(len(r.prompt_ids) for r in with_prompt)
            ids = torch.zeros(len(with_prompt), width, dtype=torch.long)
            valid = torch.zeros(len(with_prompt), width, dtype=torch.bool)
            for i, r in enumerate(with_prompt):
                ids[i, : len(r.prompt_ids)] = torch.as_tensor(r.prompt_ids)
                valid[i, : len(r.prompt_ids)] = True
            view = self._extend_view(with_prompt, [len(r.prompt_ids) for r in with_prompt], valid)
            logits = self.model.decode_step(view, ids, valid.to(self.model.device))
            t, ok = self._sample(with_prompt, logits)
            for r, ti, oi in zip(with_prompt, t, ok):
                toks[r.id], oks[r.id] = ti, oi
        if without:
            hidden = torch.cat([r.runtime["prefix"].last_hidden for r in without], 0)
            t, ok = self._sample(without, self.model.logits(hidden))
            for r, ti, oi in zip(without, t, ok):
                toks[r.id], oks[r.id] = ti, oi
        return [toks[r.id] for r in reqs], [oks[r.id] for r in reqs]

    @torch.inference_mode()
    def decode(self, reqs: list[LanguageRequest]) -> tuple[list[int], list[bool]]:
        """One batched decode step: feed each request's pending token, sample the next.

        The batch's slot rows are stacked once and reused for the following steps while the
        batch is unchanged (with ``DECODE_SLACK`` spare columns); a step then only computes the
        new positions.
        """
        ids = torch.as_tensor([[r.pending] for r in reqs], dtype=torch.long)
        past = [r.runtime["prefix"].length + r.runtime["table"].num_tokens for r in reqs]
        key = tuple(r.id for r in reqs)
        if self._plan is None or self._plan[0] != key or max(past) >= self._plan[2]:
            width = max(past) + 1 + self.DECODE_SLACK
            rows = [self._row(r) for r in reqs]
            read = torch.stack([row[:width] if row.numel() >= width else F.pad(row, (0, width - row.numel()))
                                for row in rows]).to(self.pool.device)
            self._plan = (key, read, width)
        for r in reqs:
            r.runtime["table"].advance(1)  # within the blocks reserved at admission
        view = PagedDecodeView(self.pool, self._plan[1], torch.as_tensor(past))
        valid = torch.ones(len(reqs), 1, dtype=torch.bool, device=self.model.device)
        logits = self.model.decode_step(view, ids, valid)
        return self._sample(reqs, logits)
