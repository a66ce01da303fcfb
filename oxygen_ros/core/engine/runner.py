"""Turns the engine's plans into tensor work on the paged K/V pool.

Prefill of a frame prefix into pool blocks (padded to its camera-count bucket), the action path
over the read-only prefix (S steps, frame constants precomputed), the prompt extension of newly
admitted language requests, and one batched decode step over any set of requests — each row at its
own position and length, reading its own block table (no K/V is copied when requests join or leave
a batch; with FlexAttention none is gathered per step either). Hot-path stages run through
:class:`~.compiled.Stage` (eager or ``torch.compile``); step tensors come from
:class:`~.step_buffers.StepBuffers`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..cache.block_pool import BlockTable
from ..cache.kv_pool import KVPool, PagedExtendView, to_device
from ..config import EngineConfig
from ..model.kv import DenoiseView
from ..model.sampling import sample_batch
from ..policy import EncodedObservation, Pi05Policy
from ..rtc.guidance import RTCGuide, integrate_guided
from .compiled import Stage
from .frame import FramePrefix
from .requests import LanguageRequest
from .step_buffers import DecodeBatch, StepBuffers
from .steps import decode_tokens, denoise_actions, denoise_step, prefill_prefix, prefix_scratch
from .streams import DeviceStreams

__all__ = ["Runner", "FramePrefix", "uses_flex"]


def uses_flex(cfg: EngineConfig, device: torch.device) -> bool:
    """Whether decode reads K/V through FlexAttention (else the gather reference): ``attention``
    ``flex``, or ``auto`` where it is a fused kernel (compiled, CUDA). Inductor's CPU flex template
    gave a wrong first decode step after a batch change (torch 2.13; see test_compiled), so a
    compiled CPU engine reads through the gather reference unless flex is asked for."""
    return cfg.attention == "flex" or (cfg.attention == "auto" and cfg.compile != "none" and device.type == "cuda")


class Runner:
    """Executes prefill / denoise / prompt extension / decode on one model and one pool."""

    def __init__(
        self,
        policy: Pi05Policy,
        pool: KVPool,
        streams: DeviceStreams,
        cfg: EngineConfig | None = None,
        rtc: bool = False,
    ) -> None:
        cfg = (cfg or EngineConfig()).validate()
        self.max_top_k = cfg.max_top_k  # sizes the sampler's top-k (not a live setting)
        self.policy = policy
        self.model = m = policy.model
        self.pool = pool
        self.streams = streams
        self.flex = uses_flex(cfg, pool.device)
        # compiled stages: one graph per bucket; FlexAttention reads fixed-width block tables
        self.static = cfg.static_shapes or cfg.compile != "none" or self.flex
        mc = policy.cfg
        width = pool.blocks.blocks_for(mc.max_prefix_len) + pool.blocks.blocks_for(cfg.max_request_tokens)
        self.buffers = StepBuffers(
            cfg.max_running_requests, width, pool.null_block, pool.device, self.static, self.flex
        )
        cams = len(mc.image_slots)
        mode = cfg.compile
        cuda = pool.device.type == "cuda"
        if mode != "none" and cuda:  # persistent tensors the compiled steps write: no copies under CUDA graphs
            for t in (pool.k, pool.v):
                torch._dynamo.mark_static_address(t)
        self.vision = Stage("vision", lambda px: m.vision(px).to(m.dtype), mode, cams, cuda)
        self.prefill_stage = Stage("prefill", lambda *a: prefill_prefix(m, *a), mode, cams, cuda)
        # CUDA: the whole S-step loop is one compiled / captured region; CPU: one step per call
        self.denoise_loop = pool.device.type == "cuda"
        # real-time chunking is tensor inputs of the one denoise stage (zero weights: the plain
        # flow), so a new delay or leftover never recompiles and RTC on or off is the same graph
        self.rtc = rtc
        fn = denoise_actions if self.denoise_loop else denoise_step
        self.denoise_stage = Stage("denoise", lambda *a: fn(m, *a), mode, cams, cuda)
        self.decode_stage = Stage("decode", lambda *a: decode_tokens(m, *a), mode, len(self.buffers.buckets), cuda)
        self._conds: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._plain: dict[int, RTCGuide] = {}

    @property
    def stages(self) -> list[Stage]:
        """The hot-path stages (for diagnostics: compiled or not, fallback reasons)."""
        return [self.vision, self.prefill_stage, self.denoise_stage, self.decode_stage]

    def compile_state(self) -> dict[str, object]:
        """``compiled_stages`` (comma-separated, or ``none``), and per compiled stage
        ``graphs_<stage>``, ``recompiles_<stage>`` (when any) and ``fallback_<stage>`` (the reason
        it runs eagerly, when it does)."""
        out: dict[str, object] = {"compiled_stages": ",".join(st.name for st in self.stages if st.compiled) or "none"}
        for st in self.stages:
            if st.mode != "none":
                out[f"graphs_{st.name}"] = st.graphs
            if st.recompiles:
                out[f"recompiles_{st.name}"] = st.recompiles
            if st.fallback_reason:
                out[f"fallback_{st.name}"] = st.fallback_reason
        return out

    def seal(self) -> None:
        """End of warm-up: every graph a stage compiles from now on is a counted recompile."""
        for st in self.stages:
            st.seal()

    # ------------------------------------------------------------------ prefix
    def masked(self, bucket: int, length: int) -> bool:
        """Whether prefill / denoise over a ``bucket``-long prefix with ``length`` valid tokens use
        a key mask. Always with static shapes: a prompt that fills ``max_token_len`` (or was cut to
        it) then runs the warmed graph, not a new one mid-run."""
        return self.static or bucket > length

    def prefix_bucket(self, cameras: int, prompt_tokens: int) -> int:
        """Padded prefix length: ``cameras * N + max_token_len`` (exact length without static shapes)."""
        mc = self.policy.cfg
        return cameras * mc.vision.num_tokens + (mc.max_token_len if self.static else prompt_tokens)

    @torch.inference_mode()
    def prefill(self, enc: EncodedObservation, frame_id: int, table: BlockTable) -> FramePrefix:
        """Prefill ``enc`` into ``table`` (which must be empty; blocks are allocated here).

        Raises:
            PoolExhausted: not enough free blocks (the scheduler's reserve prevents this).
        """
        m, dev = self.model, self.model.device
        t0 = time.perf_counter()
        cams = [i for i, on in enumerate(enc.image_masks[0].tolist()) if on]
        if cams:
            img = self.vision(to_device(enc.pixels[0, cams], dev))
            img = img.reshape(1, -1, img.shape[-1]).clone()  # a graph output must not be replayed over
        else:
            img = torch.zeros(1, 0, self.policy.cfg.vlm.width, dtype=m.dtype, device=dev)
        self.streams.sync()
        t1 = time.perf_counter()
        ids = enc.tokens[0][enc.token_masks[0]]
        n_txt = int(ids.numel())
        bucket = self.prefix_bucket(len(cams), n_txt)
        tok = torch.zeros(1, bucket - img.shape[1], dtype=torch.long)
        tok[0, :n_txt] = ids
        n = img.shape[1] + n_txt
        slots = table.append(n)
        slot_row = torch.full((1, bucket), self.pool.null_slot, dtype=torch.long)
        slot_row[0, :n] = torch.as_tensor(slots, dtype=torch.long)
        hidden = self.prefill_stage(
            self.pool.k,
            self.pool.v,
            self.pool.block_size,
            img,
            to_device(tok, dev),
            to_device(slot_row, dev),
            to_device(torch.tensor([n]), dev),
            self.masked(bucket, n),
        )
        hidden = hidden.clone()  # kept across frames: never a CUDA-graph output buffer
        self.streams.sync()
        t2 = time.perf_counter()
        return FramePrefix(
            frame_id, list(table.blocks), list(slots), hidden, {"vision": t1 - t0, "prefill": t2 - t1}, bucket=bucket
        )

    def prefill_new(self, enc: EncodedObservation, frame_id: int, table: BlockTable | None = None) -> FramePrefix:
        """:meth:`prefill` into ``table`` (default: a new, empty one); if the prefill raises, the
        blocks the table took are released (through a fence of the lanes) before the error goes on.

        Raises:
            PoolExhausted: not enough free blocks; whatever the model raised.
        """
        table = BlockTable(self.pool.blocks) if table is None else table
        try:
            return self.prefill(enc, frame_id, table)
        except BaseException:
            table.release(self.streams.fence())
            raise

    # ------------------------------------------------------------------ actions
    def time_conditions(self, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """adaRMS conditions ``[S, 1, W]`` and ``dt`` of the S steps (built once per engine)."""
        if num_steps not in self._conds:
            with torch.inference_mode():
                self._conds[num_steps] = self.model.time_conditions(num_steps, 1)
        return self._conds[num_steps]

    def plain_guide(self, num_steps: int) -> RTCGuide:
        """The guide of the plain flow on this runner's device: zero target, weights and gains over
        ``[1, H, action_dim]`` (built once per step count)."""
        if num_steps not in self._plain:
            mc = self.policy.cfg
            z = torch.zeros(num_steps, dtype=torch.float32)
            self._plain[num_steps] = RTCGuide(
                torch.zeros(1, mc.action_horizon, mc.action_dim), torch.zeros(1, mc.action_horizon, 1), z, z.clone()
            ).to(self.pool.device)
        return self._plain[num_steps]

    @torch.inference_mode()
    def actions_normalized(
        self, prefix: FramePrefix, noise: torch.Tensor, num_steps: int, guide: RTCGuide | None = None
    ) -> torch.Tensor:
        """``[1, H, action_dim]`` float32 normalised actions over the read-only prefix; a runner built
        with ``rtc`` takes the frame's ``guide`` (an inactive one: the plain flow), a plain runner
        its zero guide (:meth:`plain_guide`). A compiled result that is not finite where the eager
        one is falls back to eager for good (:meth:`~.compiled.Stage.checked`).

        Raises:
            ValueError: a guide missing on an RTC runner, or given to a plain one.
        """
        if (guide is not None) != self.rtc:
            raise ValueError("an RTC runner needs a guide every frame; a plain runner takes none")
        dev = self.pool.device
        read = torch.full((1, prefix.bucket), self.pool.null_slot, dtype=torch.long)
        read[0, : prefix.length] = prefix.slot_tensor
        conds, dt = self.time_conditions(num_steps)
        lengths, padded = to_device(torch.tensor([prefix.length]), dev), self.masked(prefix.bucket, prefix.length)
        noise, read = to_device(noise.to(torch.float32), dev), to_device(read, dev)
        if not noise.is_inference():  # like every later step's input: one denoise graph per shape,
            noise = noise.clone()  # not one for the first step and one for the rest (dispatch keys)
        guide = self.plain_guide(num_steps) if guide is None else guide.to(dev)
        if guide.vjp:  # the paper's form: a backward pass per step, eager
            k, v = prefix_scratch(self.pool.k, self.pool.v, self.pool.block_size, read, noise.shape[1])
            view = DenoiseView(k, v, lengths, noise.shape[1], padded).for_grad()
            with torch.inference_mode(False):
                cs = conds.clone()
            return integrate_guided(lambda x, i: self.model.denoise_step(view, x, None, cs[i]), noise, dt, guide)
        rtc = (guide.times, guide.gains, guide.target, guide.weights)
        pool = (self.pool.k, self.pool.v, self.pool.block_size)

        def run(stage: Callable[..., torch.Tensor]) -> torch.Tensor:
            if self.denoise_loop:
                return stage(*pool, read, lengths, noise, conds, dt, padded, *rtc)
            k, v = prefix_scratch(*pool, read, noise.shape[1])
            x = noise
            for i in range(num_steps):
                x = stage(
                    k, v, lengths, x, conds[i], dt, padded, guide.times[i], guide.gains[i], guide.target, guide.weights
                )
            return x

        return self.denoise_stage.checked(run, lambda x: int(not bool(torch.isfinite(x).all())))

    # ------------------------------------------------------------------ text
    def _extend_view(self, reqs: list[LanguageRequest], counts: list[int], valid: torch.Tensor) -> PagedExtendView:
        """View appending ``counts[i]`` tokens to request ``i`` (claims the slots in its table)."""
        states = [r.running_state for r in reqs]
        past_slots = [st.prefix.slots + st.table.slots for st in states]
        new_slots = [st.table.append(n) for st, n in zip(states, counts)]  # within the reserved blocks
        return PagedExtendView.from_lists(self.pool, past_slots, new_slots, valid)

    def _sample(self, reqs: list[LanguageRequest], logits: torch.Tensor) -> tuple[list[int], list[bool]]:
        """On-device sampling of one token per request (counter = tokens emitted so far); the
        per-row parameters travel in one non-blocking copy, the ids come back in one transfer."""
        dev = logits.device
        ints = to_device(torch.tensor([[r.top_k, r.sample_key, len(r.output_ids)] for r in reqs]), dev)
        temps = to_device(torch.tensor([r.temperature for r in reqs], dtype=torch.float32), dev)
        ids = sample_batch(
            logits,
            temps,
            ints[:, 0],
            ints[:, 1],
            ints[:, 2],
            self.max_top_k,
            greedy_only=all(r.temperature == 0 for r in reqs),
        ).tolist()
        return ids, [i >= 0 for i in ids]

    @torch.inference_mode()
    def start(self, reqs: list[LanguageRequest]) -> tuple[list[int], list[bool]]:
        """First token of newly admitted requests (each with its :class:`RequestState` attached).

        Requests with prompt ids run one batched causal extension over their prefix; the others
        take the LM head of their prefix's last valid hidden state (no forward).
        """
        toks: dict[int, tuple[int, bool]] = {}
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
            logits = self.model.decode_step(
                view, to_device(ids, self.model.device), to_device(valid, self.model.device)
            )
            for r, t, ok in zip(with_prompt, *self._sample(with_prompt, logits)):
                toks[r.id] = (t, ok)
        if without:
            hidden = torch.cat([r.running_state.prefix.last_hidden for r in without], 0)
            for r, t, ok in zip(without, *self._sample(without, self.model.logits(hidden))):
                toks[r.id] = (t, ok)
        return [toks[r.id][0] for r in reqs], [toks[r.id][1] for r in reqs]

    def decode_args(self, batch: DecodeBatch) -> tuple[object, ...]:
        """Arguments of the decode stage for ``batch`` (greedy-only shortcut only when eager, so
        a compiled decode has one graph per bucket)."""
        return (
            self.pool.k,
            self.pool.v,
            self.pool.block_size,
            self.flex,
            *batch.tensors(),
            self.max_top_k,
            batch.greedy_only and not self.decode_stage.compiled,
        )

    @torch.inference_mode()
    def decode(self, reqs: list[LanguageRequest]) -> tuple[list[int], list[bool]]:
        """One batched decode step: feed each request's pending token, sample the next.

        One host transfer of the ``B`` sampled ids. A compiled step that yields more non-finite
        rows than the eager step is replaced by eager for good (:meth:`~.compiled.Stage.checked`).
        """
        states = [r.running_state for r in reqs]
        batch = self.buffers.decode_batch(reqs, states)
        for st in states:
            st.table.advance(1)  # within the blocks reserved at admission
        args = self.decode_args(batch)
        ids = self.decode_stage.checked(
            lambda stage: stage(*args)[: batch.rows].tolist(), lambda ids: sum(i < 0 for i in ids)
        )
        return ids, [i >= 0 for i in ids]

    @torch.inference_mode()
    def warm_decode_buckets(self) -> list[int]:
        """Run the decode stage once per batch bucket on padding rows only (no request, writes
        only the null block) so every decode shape is compiled before the first real step."""
        sizes = self.buffers.buckets if self.static else [1]
        for b in sizes:
            self.decode_stage(*self.decode_args(self.buffers.padding_batch(b)))
        return sizes
