"""The co-training objective runs the attention patterns inference runs: its flow loss equals
the one computed from the uncached reference forward (prefix + action chunk, no text), and its
text loss equals the cross-entropy of the cached prefill + token-by-token decode the engine runs.
The text tokens never leak into the action tokens, the prefix never sees either."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.types import Observation
from oxygen_ros.train.objective import Batch, co_training_loss, sample_flow_time


def _obs(i: int, instruction: str) -> Observation:
    rng = np.random.default_rng(40 + i)
    imgs = {"base_0_rgb": rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)}
    if i % 2:
        imgs["left_wrist_0_rgb"] = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    return Observation(images=imgs, state=rng.uniform(-1, 1, 14).astype(np.float32), instruction=instruction)


@pytest.fixture(scope="module")
def setup():
    policy = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", seed=3)
    cfg = policy.cfg
    encs = [policy.encode_observation(_obs(i, ins)) for i, ins in enumerate(["pick", "pick up the red cube now"])]
    tok = policy.prompt
    texts = [
        (tok.tokenize_continuation("Question: where?\nAnswer: "), tok.tokenize_continuation("back left")),
        (tok.tokenize_continuation("Memory: "), tok.tokenize_continuation("holding")),
    ]
    t_len = max(len(h) + len(a) + 1 for h, a in texts)
    text = torch.zeros(2, t_len, dtype=torch.long)
    valid = torch.zeros(2, t_len, dtype=torch.bool)
    target = torch.zeros(2, t_len, dtype=torch.bool)
    for j, (head, ans) in enumerate(texts):
        ids = head + ans + [policy.eos_id]
        text[j, : len(ids)] = torch.tensor(ids)
        valid[j, : len(ids)] = True
        target[j, len(head) : len(ids)] = True
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        pixels=torch.cat([e.pixels for e in encs]),
        image_masks=torch.cat([e.image_masks for e in encs]),
        tokens=torch.cat([e.tokens for e in encs]),
        token_masks=torch.cat([e.token_masks for e in encs]),
        actions=torch.randn(2, cfg.action_horizon, cfg.action_dim, generator=g),
        action_dims=14,
        text=text,
        text_valid=valid,
        text_target=target,
    )
    noise = torch.randn(2, cfg.action_horizon, cfg.action_dim, generator=g)
    return policy, encs, batch, noise, sample_flow_time(2, g)


def test_flow_loss_equals_the_reference_forward_without_text(setup):
    policy, _, batch, noise, t = setup
    m = policy.model
    with torch.no_grad():
        parts = co_training_loss(m, batch, noise, t)
        emb, valid = m.embed_prefix(batch.pixels, batch.image_masks, batch.tokens, batch.token_masks)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * batch.actions
        v = m.forward_joint(emb, valid, x_t, t)
    want = F.mse_loss(v[..., :14], (noise - batch.actions)[..., :14])
    torch.testing.assert_close(parts.flow, want, rtol=1e-5, atol=1e-6)
    # the text tokens are invisible to the chunk: other text, same flow loss
    other = Batch(**{**batch.__dict__, "text": torch.roll(batch.text, 1, dims=1)})
    with torch.no_grad():
        torch.testing.assert_close(co_training_loss(m, other, noise, t).flow, parts.flow, rtol=1e-5, atol=1e-6)


def test_text_loss_equals_cached_prefill_and_decode(setup):
    policy, encs, batch, noise, t = setup
    m = policy.model
    with torch.no_grad():
        parts = co_training_loss(m, batch, noise, t)
    losses, hits = [], []
    for j, enc in enumerate(encs):
        cache, _ = policy.prefill(enc, extra_capacity=batch.text.shape[1])
        ids = batch.text[j][batch.text_valid[j]]
        target = batch.text_target[j][batch.text_valid[j]]
        with torch.inference_mode():
            for i in range(len(ids) - 1):
                one = ids[None, i : i + 1]
                ok = torch.ones_like(one, dtype=torch.bool)
                logits = m.decode_step(cache.extend_view(ok), one, ok)
                if target[i + 1]:
                    losses.append(F.cross_entropy(logits, ids[None, i + 1]))
                    hits.append(float(logits.argmax(-1)[0] == ids[i + 1]))
    torch.testing.assert_close(parts.text, torch.stack(losses).mean(), rtol=1e-5, atol=1e-5)
    assert float(parts.text_accuracy) == pytest.approx(float(np.mean(hits)))


def test_a_few_steps_fit_one_batch(setup):
    """The loss goes down when trained on one batch (gradients reach every part that matters)."""
    _, _, batch, noise, t = setup
    model = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", seed=4).model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        parts = co_training_loss(model, batch, noise, t)
        opt.zero_grad()
        parts.loss.backward()
        opt.step()
        first = first if first is not None else (float(parts.flow), float(parts.text))
    assert float(parts.flow) < 0.5 * first[0] and float(parts.text) < 0.5 * first[1]
    assert model.vision.parameters().__next__().grad is not None


def test_flow_time_is_openpis_beta():
    g = torch.Generator().manual_seed(0)
    t = sample_flow_time(20000, g)
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    # Beta(1.5, 1) has mean 0.6: scaled by 0.999 and shifted by 0.001
    assert float(t.mean()) == pytest.approx(0.6 * 0.999 + 0.001, abs=0.01)


def test_wrong_action_shape_is_refused(setup):
    policy, _, batch, noise, t = setup
    with pytest.raises(ValueError, match="actions/noise"):
        co_training_loss(policy.model, batch, noise[:, :3], t)
