"""Correctness of the π0.5 model core over explicit K/V views (pi05-tiny, fp32, CPU).

Every cached path (prefill → denoise, prefill → text decode) is compared with an uncached forward
of the whole sequence, on a batch of two rows with different valid lengths (row 0 has a masked
camera slot and a shorter prompt), so packing, padding and position bookkeeping are all exercised.
Each equality test also shows that the compared quantity is sensitive to what it should depend on.
"""

from __future__ import annotations

import pytest
import torch

from oxygen_ros.core.config import get_preset
from oxygen_ros.core.model.kv import DenseKVCache, SelfView, prefix_positions

TINY = get_preset("pi05-tiny")

H = TINY.action_horizon
A = TINY.action_dim
N_TOK = TINY.vision.num_tokens
IMAGE_MASKS = torch.tensor([[True, False, True], [True, True, True]])
PROMPT_LENS = (20, 31)
PAD_TO = 40


def make_inputs(seed: int = 0, pad_to: int = PAD_TO, prompt_lens=PROMPT_LENS, image_masks=IMAGE_MASKS):
    """Random pixels / prompt ids for a batch; prompt row ``b`` has ``prompt_lens[b]`` real tokens."""
    g = torch.Generator().manual_seed(seed)
    b = len(prompt_lens)
    s = TINY.vision.image_size
    pixels = torch.rand(b, len(TINY.image_slots), 3, s, s, generator=g) * 2 - 1
    tokens = torch.randint(4, TINY.vocab_size, (b, pad_to), generator=g)
    token_masks = torch.arange(pad_to)[None, :] < torch.tensor(prompt_lens)[:, None]
    tokens = torch.where(token_masks, tokens, torch.zeros_like(tokens))  # pad id 0 as the tokenizer does
    return pixels, image_masks[:b].clone(), tokens, token_masks


def new_cache(valid: torch.Tensor, extra: int = 0) -> DenseKVCache:
    c = TINY.vlm
    return DenseKVCache(c.depth, valid.shape[0], valid.shape[1] + extra, c.num_kv_heads, c.head_dim)


def unpacked_prefix(model, pixels, image_masks, tokens, token_masks, garbage: float = 0.0):
    """openpi's layout: [all image slots ‖ padded prompt] with holes; masked-slot and padding
    embeddings replaced by ``garbage``-scaled noise (they must be invisible)."""
    img = model.embed_images(pixels, image_masks)
    txt = model.vlm.embed(tokens)
    emb = torch.cat([img, txt], dim=1)
    valid = torch.cat([image_masks.repeat_interleave(N_TOK, dim=1), token_masks], dim=1)
    if garbage:
        g = torch.Generator().manual_seed(123)
        emb = torch.where(valid[..., None], emb, garbage * torch.randn(emb.shape, generator=g))
    return emb, valid


@pytest.fixture(scope="module")
def prefix(tiny_model):
    """Packed prefix of the standard ragged batch: (embeds, valid)."""
    with torch.no_grad():
        return tiny_model.embed_prefix(*make_inputs())


def test_batch_rows_really_differ(prefix):
    """Guard: the two rows have different valid lengths and row 0 is padded in the packed prefix."""
    _, valid = prefix
    n = valid.sum(-1).tolist()
    assert n == [2 * N_TOK + PROMPT_LENS[0], 3 * N_TOK + PROMPT_LENS[1]]
    assert valid.shape[1] == max(n) and not valid[0, -1] and valid[1].all()


# ---------------------------------------------------------------------------- 1. denoise vs joint
@pytest.mark.parametrize("times", [(1.0, 1.0), (0.7, 0.2), (0.05, 0.55)])
@torch.no_grad()
def test_denoise_over_cached_prefix_equals_joint_forward(tiny_model, prefix, times):
    """denoise_step over the prefilled DenseKVCache == one uncached joint MoT forward of
    [prefix ‖ action suffix] (≤ 1e-5 fp32), per row, at several flow times (also per-row times)."""
    m = tiny_model
    emb, valid = prefix
    cache = new_cache(valid)
    m.prefill(emb, valid, cache.prefill_view(valid))
    g = torch.Generator().manual_seed(1)
    x_t = torch.randn(2, H, A, generator=g)
    t = torch.tensor(times)
    v_cached = m.denoise_step(cache.denoise_view(H), x_t, t)
    v_joint = m.forward_joint(emb, valid, x_t, t)
    assert v_cached.dtype == torch.float32 and v_cached.shape == (2, H, A)
    assert (v_cached - v_joint).abs().max() <= 1e-5
    # Sensitivity: the velocity depends on t, on x_t and on the row's own prefix.
    other_t = m.forward_joint(emb, valid, x_t, 1.0 - t * 0.5)
    assert (other_t - v_joint).abs().max() > 1e-3
    other_x = m.forward_joint(emb, valid, x_t + 0.5, t)
    assert (other_x - v_joint).abs().max() > 1e-3
    emb2 = emb.clone()
    emb2[0, 5] += 1.0  # a valid image token of row 0
    v2 = m.forward_joint(emb2, valid, x_t, t)
    assert (v2[0] - v_joint[0]).abs().max() > 1e-4
    assert torch.equal(v2[1], v_joint[1])  # rows are independent


@torch.no_grad()
def test_joint_forward_ignores_invalid_prefix_tokens_and_matches_openpi_layout(tiny_model, prefix):
    """The packed prefix (valid tokens first) gives the same velocity as openpi's unpacked layout
    (masked slot + prompt padding in the middle, positions = cumsum(mask) - 1), even when the
    invalid tokens hold large garbage: invalid keys are invisible."""
    m = tiny_model
    emb, valid = prefix
    pixels, im, tok, tm = make_inputs()
    x_t = torch.randn(2, H, A, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.4, 0.8])
    ref = m.forward_joint(emb, valid, x_t, t)
    for garbage in (0.0, 100.0):
        emb_u, valid_u = unpacked_prefix(m, pixels, im, tok, tm, garbage=garbage)
        assert (m.forward_joint(emb_u, valid_u, x_t, t) - ref).abs().max() <= 1e-5
    # Sensitivity: if the masked slot were treated as valid, row 0 would change.
    emb_u, valid_u = unpacked_prefix(m, pixels, im, tok, tm, garbage=1.0)
    valid_bad = valid_u.clone()
    valid_bad[0, N_TOK : 2 * N_TOK] = True
    assert (m.forward_joint(emb_u, valid_bad, x_t, t)[0] - ref[0]).abs().max() > 1e-4


@torch.no_grad()
def test_sample_actions_is_euler_over_denoise_steps(tiny_model, prefix):
    """sample_actions == explicit Euler from t=1 to 0 with dt=-1/S over uncached joint forwards."""
    m = tiny_model
    emb, valid = prefix
    cache = new_cache(valid)
    m.prefill(emb, valid, cache.prefill_view(valid))
    noise = torch.randn(2, H, A, generator=torch.Generator().manual_seed(3))
    steps = 4
    out = m.sample_actions(cache.denoise_view(H), noise, steps)
    x = noise.clone()
    for i in range(steps):
        t = torch.full((2,), 1.0 - i / steps)
        x = x - m.forward_joint(emb, valid, x, t) / steps
    assert (out - x).abs().max() <= 1e-5
    assert (m.sample_actions(cache.denoise_view(H), noise, steps + 1) - out).abs().max() > 1e-4


# ---------------------------------------------------------------------------- 2. text decode
def _decode_vs_recompute(m, emb, valid, steps: int, teacher: torch.Tensor | None, lm_reference):
    """Decode ``steps`` tokens from a prefilled cache (greedy, or feeding ``teacher`` tokens) and
    compare every step's logits with a full uncached recomputation. Returns (tokens, ref logits)."""
    b = valid.shape[0]
    cache = new_cache(valid, extra=steps)
    logits = m.logits(m.prefill(emb, valid, cache.prefill_view(valid)))
    fed = torch.zeros(b, 0, dtype=torch.long)
    refs = []
    for step in range(steps):
        ref = lm_reference(m, emb, valid, fed)
        refs.append(ref)
        diff = (logits - ref).abs().max()
        assert diff <= 1e-4, f"step {step}: logits differ by {diff}"
        assert torch.equal(logits.argmax(-1), ref.argmax(-1)), f"step {step}: greedy token differs"
        nxt = logits.argmax(-1) if teacher is None else teacher[:, step]
        fed = torch.cat([fed, nxt[:, None]], dim=1)
        one = torch.ones(b, 1, dtype=torch.bool)
        logits = m.decode_step(cache.extend_view(one), nxt[:, None], one)
    assert cache.lengths.tolist() == (valid.sum(-1) + steps).tolist()
    return fed, torch.stack(refs)


@torch.no_grad()
def test_greedy_decode_from_cache_equals_full_recomputation(tiny_model, prefix, lm_reference):
    """24 greedy tokens decoded from the prefix cache == greedy over full uncached recomputation of
    [prefix ‖ generated so far] at every step: same token ids, logits ≤ 1e-4 (batch of 2 ragged rows)."""
    emb, valid = prefix
    toks, _ = _decode_vs_recompute(tiny_model, emb, valid, 24, None, lm_reference)
    assert toks.shape == (2, 24)


@torch.no_grad()
def test_teacher_forced_decode_from_cache_equals_full_recomputation(tiny_model, prefix, lm_reference):
    """Feeding a fixed random token sequence (random weights make greedy repeat one token, a weak
    test), cached decode logits == uncached recomputation at all 24 positions (≤ 1e-4); the logits
    really change from step to step, and a reference that counted padding in the positions (an
    off-by-gap bug) would be caught."""
    m = tiny_model
    emb, valid = prefix
    teacher = torch.randint(4, TINY.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4))
    _, refs = _decode_vs_recompute(m, emb, valid, 24, teacher, lm_reference)
    assert (refs[1:] - refs[:-1]).abs().amax(dim=(1, 2)).min() > 1e-2
    assert len(set(refs[:, 0].argmax(-1).tolist())) > 3
    # Control: positions counted over the padded width give different logits for row 0.
    p = valid.shape[1]
    fed = teacher[:, :5]
    emb_all = torch.cat([emb, m.vlm.embed(fed)], dim=1)
    pos = torch.cat([(valid.long().cumsum(-1) - 1).clamp_min(0), p + torch.arange(5)[None].expand(2, -1)], dim=1)
    q = torch.arange(p + 5)
    keys = torch.cat([valid, torch.ones(2, 5, dtype=torch.bool)], dim=1)
    allowed = keys[:, None, :] & ((q[None, :] <= q[:, None]) | (q[None, :] < p))[None]
    wrong = m.logits(m.runner([m.vlm], [emb_all], [None], SelfView(pos, allowed))[0][:, -1])
    right = lm_reference(m, emb, valid, fed)
    assert (wrong[0] - right[0]).abs().max() > 1e-3
    assert (wrong[1] - right[1]).abs().max() <= 1e-4  # row 1 has no padding: same positions


@torch.no_grad()
def test_ragged_multi_token_extend_equals_recomputation(tiny_model, prefix, lm_reference):
    """A continuation prompt appended in ONE extend call with different valid counts per row
    (row 0: 3 of 5 tokens), then single-token steps: logits at each row's last valid token ==
    uncached recomputation (≤ 1e-4)."""
    m = tiny_model
    emb, valid = prefix
    cont = torch.randint(4, TINY.vocab_size, (2, 5), generator=torch.Generator().manual_seed(5))
    cvalid = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    cache = new_cache(valid, extra=5 + 3)
    m.prefill(emb, valid, cache.prefill_view(valid))
    logits = m.decode_step(cache.extend_view(cvalid), cont, cvalid)
    fed = [cont[0, :3].tolist(), cont[1].tolist()]
    for step in range(3):
        for r in range(2):
            ref = lm_reference(m, emb[r : r + 1], valid[r : r + 1], torch.tensor([fed[r]]))
            assert (logits[r] - ref[0]).abs().max() <= 1e-4, (step, r)
        nxt = logits.argmax(-1)
        for r in range(2):
            fed[r].append(int(nxt[r]))
        one = torch.ones(2, 1, dtype=torch.bool)
        logits = m.decode_step(cache.extend_view(one), nxt[:, None], one)
    assert cache.lengths.tolist() == [int(valid[0].sum()) + 3 + 3, int(valid[1].sum()) + 5 + 3]


# ---------------------------------------------------------------------------- 3. cache is read-only
@torch.no_grad()
def test_prefix_kv_unchanged_by_actions_and_text_decode(tiny_model, prefix):
    """The prefix K/V (every layer, the valid slots) is bit-identical before and after
    sample_actions and after text decoding from the same cache; decode writes only after the prefix."""
    m = tiny_model
    emb, valid = prefix
    n = valid.sum(-1).tolist()
    cache = new_cache(valid, extra=6)
    m.prefill(emb, valid, cache.prefill_view(valid))
    before_k = [k.clone() for k in cache.k]
    before_v = [v.clone() for v in cache.v]
    assert all(float(k[r, : n[r]].abs().max()) > 0 for k in before_k for r in range(2))  # really written
    noise = torch.randn(2, H, A, generator=torch.Generator().manual_seed(6))
    assert torch.isfinite(m.sample_actions(cache.denoise_view(H), noise, TINY.num_denoise_steps)).all()
    assert cache.lengths.tolist() == n
    for li in range(TINY.vlm.depth):  # the whole buffer: the action path writes nothing
        assert torch.equal(cache.k[li], before_k[li]) and torch.equal(cache.v[li], before_v[li]), li
    tok = torch.tensor([[7], [9]])
    one = torch.ones(2, 1, dtype=torch.bool)
    for _ in range(6):
        tok = m.decode_step(cache.extend_view(one), tok, one).argmax(-1, keepdim=True)
    for li in range(TINY.vlm.depth):
        for r in range(2):
            assert torch.equal(cache.k[li][r, : n[r]], before_k[li][r, : n[r]]), (li, r)
            assert torch.equal(cache.v[li][r, : n[r]], before_v[li][r, : n[r]]), (li, r)
            new = cache.k[li][r, n[r] : n[r] + 6]
            assert float(new.abs().min(dim=-1).values.max()) > 0  # decode wrote right after the prefix
    assert cache.lengths.tolist() == [n[0] + 6, n[1] + 6]


# ---------------------------------------------------------------------------- 4. masking / last token
@torch.no_grad()
def test_masked_camera_slot_is_invisible(tiny_model):
    """Different pixels in a masked slot (image_mask False) → bit-identical prefix embeddings,
    prefill hidden / first-token logits and actions; the same change in an unmasked slot changes them."""
    m = tiny_model
    pixels, im, tok, tm = make_inputs()
    noise = torch.randn(2, H, A, generator=torch.Generator().manual_seed(7))

    def run(px, image_embeds=None):
        emb, valid = m.embed_prefix(px, im, tok, tm, image_embeds=image_embeds)
        cache = new_cache(valid)
        hidden = m.prefill(emb, valid, cache.prefill_view(valid))
        # the packed tail of a shorter row holds leftovers by design: compare the valid tokens only
        return emb[valid], m.logits(hidden), m.sample_actions(cache.denoise_view(H), noise, 3)

    base = run(pixels)
    masked = pixels.clone()
    masked[0, 1] = torch.rand_like(masked[0, 1]) * 2 - 1  # row 0, slot 1 is masked
    for a, b in zip(base, run(masked)):
        assert torch.equal(a, b)
    # Even if the masked slot's tokens were computed (as openpi does on a blank image), they are dropped.
    img = m.embed_images(pixels, im)
    img[0, N_TOK : 2 * N_TOK] = 50.0 * torch.randn(N_TOK, TINY.vlm.width)
    for a, b in zip(base, run(pixels, image_embeds=img)):
        assert torch.equal(a, b)
    unmasked = pixels.clone()
    unmasked[0, 0] = masked[0, 1]  # row 0, slot 0 is valid
    changed = run(unmasked)
    assert (changed[1][0] - base[1][0]).abs().max() > 1e-4
    assert (changed[2][0] - base[2][0]).abs().max() > 1e-4
    assert torch.equal(changed[2][1], base[2][1])


@torch.no_grad()
def test_text_starts_from_last_valid_prefix_token(tiny_model, lm_reference):
    """The first-token logits do not depend on the padding amount: the same prompt padded to 25 or
    64 tokens gives identical logits (batch of 1), and ≤ 1e-5 when the row is padded inside a batch
    with a longer row; prefill's hidden == the uncached openpi-layout forward at the last VALID token
    (the last padded position gives something else)."""
    m = tiny_model
    logits = []
    for pad in (25, 64):
        px, im, tok, tm = make_inputs(seed=8, pad_to=pad, prompt_lens=(20,))
        emb, valid = m.embed_prefix(px, im, tok, tm)
        logits.append(m.logits(m.prefill(emb, valid, new_cache(valid).prefill_view(valid))))
    assert torch.equal(logits[0], logits[1])
    # Inside a batch with a longer second row (row 0 gets trailing padding in the packed prefix).
    px, im, tok, tm = make_inputs(seed=8, pad_to=25, prompt_lens=(20,))
    px2, im2, tok2, tm2 = make_inputs(seed=9, pad_to=25, prompt_lens=(25,), image_masks=IMAGE_MASKS[1:])
    emb, valid = m.embed_prefix(
        torch.cat([px, px2]), torch.cat([im, im2]), torch.cat([tok, tok2]), torch.cat([tm, tm2])
    )
    assert not valid[0].all()
    batched = m.logits(m.prefill(emb, valid, new_cache(valid).prefill_view(valid)))
    assert (batched[0] - logits[0][0]).abs().max() <= 1e-5
    # Against the uncached, unpacked forward (padding AND a masked slot inside the sequence).
    px, im, tok, tm = make_inputs(seed=8, pad_to=64, prompt_lens=(20,))
    emb_u, valid_u = unpacked_prefix(m, px, im, tok, tm)
    ref = lm_reference(m, emb_u, valid_u, torch.zeros(1, 0, dtype=torch.long))
    assert (ref - logits[1]).abs().max() <= 1e-5
    h = m.runner(
        [m.vlm],
        [emb_u],
        [None],
        SelfView(prefix_positions(valid_u), valid_u[:, None, :].expand(-1, valid_u.shape[1], -1)),
    )[0]
    emb_p, valid_p = m.embed_prefix(px, im, tok, tm)
    hidden = m.prefill(emb_p, valid_p, new_cache(valid_p).prefill_view(valid_p))
    last_valid = int(torch.nonzero(valid_u[0])[-1])
    assert (hidden[0] - h[0, last_valid]).abs().max() <= 1e-5
    assert (hidden[0] - h[0, -1]).abs().max() > 1e-3  # the last padded slot is a different state
