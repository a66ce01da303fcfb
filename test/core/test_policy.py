"""The single-request reference policy (``Pi05Policy``): actions, text, input checking (pi05-tiny, CPU).

Results are compared with uncached references computed straight from the model on openpi's
unpacked input layout, so the policy's packing, caching, normalisation and sampling are all covered.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oxygen_ros.core.model.sampling import SamplingParams
from oxygen_ros.core.policy import Pi05Policy
from oxygen_ros.core.processing import InvalidInputError, NonFiniteActionError
from oxygen_ros.core.prompt import PromptTooLongError
from oxygen_ros.core.types import NormStats, Observation

ROBOT_DIM = 14


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    """pi05-tiny with random weights (seed 0), identity stats of 14 dims. Not modified by tests."""
    return Pi05Policy.from_pretrained("pi05-tiny", device="cpu", dtype=torch.float32)


def make_obs(seed: int = 0, dim: int = ROBOT_DIM, instruction: str = "pick up the red cube", **images) -> Observation:
    """Base and left-wrist cameras of different sizes (right wrist missing), a random state."""
    rng = np.random.default_rng(seed)
    imgs = {
        "base_0_rgb": rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
        "left_wrist_0_rgb": rng.integers(0, 256, (30, 30, 3), dtype=np.uint8),
    }
    imgs.update(images)
    return Observation(images=imgs, state=rng.uniform(-0.8, 0.8, dim), instruction=instruction)


def noise_of(policy: Pi05Policy, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, policy.cfg.action_horizon, policy.cfg.action_dim, generator=g)


def unpacked(policy: Pi05Policy, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
    """openpi's prefix layout (all slots ‖ padded prompt, with holes) of an observation."""
    m, enc = policy.model, policy.encode_observation(obs)
    with torch.no_grad():
        emb = torch.cat([m.embed_images(enc.pixels, enc.image_masks), m.vlm.embed(enc.tokens)], dim=1)
    valid = torch.cat([enc.image_masks.repeat_interleave(enc.tokens_per_image, dim=1), enc.token_masks], dim=1)
    return emb, valid


# ------------------------------------------------------------------------------------ actions
def test_sample_actions_shape_dtype_determinism(policy):
    """[H, robot_dim] finite float32; same noise → identical chunk; different noise → different chunk."""
    obs = make_obs()
    a = policy.sample_actions(obs, noise_of(policy, 1))
    assert a.shape == (policy.cfg.action_horizon, ROBOT_DIM) and a.dtype == np.float32
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, policy.sample_actions(obs, noise_of(policy, 1)))
    assert np.abs(a - policy.sample_actions(obs, noise_of(policy, 2))).max() > 1e-3
    assert np.abs(a - policy.sample_actions(make_obs(seed=5), noise_of(policy, 1))).max() > 1e-4  # obs matters
    b = policy.sample_actions(obs)  # default noise from the global RNG
    assert b.shape == a.shape and np.isfinite(b).all()


def test_sample_actions_in_robot_units_match_uncached_reference(policy):
    """With non-identity stats of a 7-dim robot: actions == unnormalise(first 7 dims of Euler
    integration over uncached joint forwards on openpi's layout), (a + 1)/2·(q99 − q01 + 1e-6) + q01."""
    q01 = np.array([-3.0, 0.0, 10.0, -0.5, 1.0, 2.0, -100.0], np.float32)
    q99 = np.array([3.0, 0.1, 20.0, 0.5, 1.0, 4.0, 100.0], np.float32)  # dim 4 is zero-width
    stats = {
        "state": NormStats.identity(7),
        "actions": NormStats(mean=(q01 + q99) / 2, std=np.ones(7, np.float32), q01=q01, q99=q99),
    }
    pol = Pi05Policy(policy.model, policy.tokenizer, stats)
    obs = make_obs(seed=3, dim=7)
    noise = noise_of(pol, 3)
    got = pol.sample_actions(obs, noise, num_steps=5)
    m = pol.model
    emb, valid = unpacked(pol, obs)
    x = noise.clone()
    with torch.no_grad():
        for i in range(5):
            x = x - m.forward_joint(emb, valid, x, torch.tensor([1.0 - i / 5])) / 5
    x = x[0, :, :7].double().numpy()
    want = (x + 1) / 2 * (q99 - q01 + 1e-6) + q01
    want[:, 4] = q01[4]
    assert got.shape == (pol.cfg.action_horizon, 7)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.abs(got[:, 6]).max() > 1.0  # really in robot units, not normalised


def test_missing_slot_equals_none_slot_and_policy_is_deterministic(policy):
    """A camera slot left out of the dict and the same slot given as None are the same masked slot:
    identical actions and text; repeated calls give identical results."""
    obs = make_obs()
    obs_none = make_obs(right_wrist_0_rgb=None)
    noise = noise_of(policy, 4)
    a = policy.sample_actions(obs, noise)
    np.testing.assert_array_equal(a, policy.sample_actions(obs_none, noise))
    np.testing.assert_array_equal(a, policy.sample_actions(obs, noise))
    t = policy.generate_text(obs, max_new_tokens=6)
    assert t == policy.generate_text(obs_none, max_new_tokens=6) == policy.generate_text(obs, max_new_tokens=6)


def test_prompt_padding_amount_does_not_change_results(policy):
    """The same observation under a larger max_token_len (more prompt padding) gives the same
    first-token logits, text and actions: text starts at the last valid prefix token."""
    big = Pi05Policy(policy.model, policy.tokenizer, policy.norm_stats)
    big.prompt.max_len = policy.cfg.max_token_len + 37
    obs = make_obs(seed=6)
    e1, e2 = policy.encode_observation(obs), big.encode_observation(obs)
    assert e2.tokens.shape[1] == e1.tokens.shape[1] + 37 and e1.prefix_len == e2.prefix_len
    with torch.no_grad():
        l1 = policy.model.logits(policy.prefill(e1)[1])
        l2 = big.model.logits(big.prefill(e2)[1])
    assert (l1 - l2).abs().max() <= 1e-5
    assert policy.generate_text(obs, max_new_tokens=5) == big.generate_text(obs, max_new_tokens=5)
    noise = noise_of(policy, 6)
    np.testing.assert_allclose(policy.sample_actions(obs, noise), big.sample_actions(obs, noise), atol=1e-5)


# ------------------------------------------------------------------------------------ text
@pytest.mark.parametrize("prompt", ["", "Describe the scene:"])
def test_generate_text_matches_uncached_greedy_reference(policy, lm_reference, prompt):
    """Greedy generate_text (with and without a continuation prompt) == greedy decoding by full
    uncached recomputation of [openpi-layout prefix ‖ continuation ‖ generated] at every step."""
    obs = make_obs(seed=7)
    n = 12
    gen = policy.generate_text(obs, prompt=prompt, max_new_tokens=n)
    assert gen.finish_reason == "length" and len(gen.token_ids) == n
    assert gen.text == policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    emb, valid = unpacked(policy, obs)
    ids = policy.prompt.tokenize_continuation(prompt) if prompt else []
    assert bool(prompt) == bool(ids)
    start = len(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = lm_reference(policy.model, emb, valid, torch.tensor([ids], dtype=torch.long))
            ids.append(int(logits.argmax(-1)))
    assert gen.token_ids == ids[start:]


def test_continuation_prompt_changes_the_text(policy):
    """The continuation prompt is really used: different prompts give different first tokens here."""
    obs = make_obs(seed=7)
    firsts = {
        policy.generate_text(obs, prompt=p, max_new_tokens=1).token_ids[0]
        for p in ("", "Describe the scene:", "What is the robot holding?", "Task done?")
    }
    assert len(firsts) >= 2


def test_max_new_tokens_and_bad_arguments(policy):
    """Exactly max_new_tokens tokens with finish_reason "length"; max_new_tokens < 1 and bad
    sampling parameters raise ValueError."""
    obs = make_obs()
    for n in (1, 4):
        g = policy.generate_text(obs, max_new_tokens=n)
        assert len(g.token_ids) == n and g.finish_reason == "length"
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.generate_text(obs, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        policy.generate_text(obs, greedy=False, sampling=SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_k"):
        policy.generate_text(obs, greedy=False, sampling=SamplingParams(temperature=1.0, top_k=-2))


def test_temperature_sampling_is_reproducible_with_a_seed(policy):
    """temperature > 0 with a seed: same seed → same tokens; other seed → other tokens; top_k=1 and
    temperature 0 reduce to greedy."""
    obs = make_obs()

    def sample(**kw):
        return policy.generate_text(obs, max_new_tokens=16, greedy=False, sampling=SamplingParams(**kw)).token_ids

    a = sample(temperature=1.0, seed=3)
    assert a == sample(temperature=1.0, seed=3)
    assert a != sample(temperature=1.0, seed=4)
    assert len(set(a)) > 3  # really sampled (greedy repeats one token with random weights)
    greedy = policy.generate_text(obs, max_new_tokens=16).token_ids
    assert sample(temperature=1.0, top_k=1, seed=3) == greedy
    assert sample(temperature=0.0, seed=3) == greedy
    assert a != greedy


def test_stop_ids_and_eos_end_generation(policy):
    """A stop id ends decoding before that token (finish "stop", the stop token excluded); EOS does
    the same with finish "eos"; the tokens before it are unchanged."""
    obs = make_obs()
    kw = dict(max_new_tokens=16, greedy=False, sampling=SamplingParams(temperature=1.0, seed=3))
    full = policy.generate_text(obs, **kw).token_ids
    k = next(i for i, t in enumerate(full) if i >= 3 and t not in full[:i])
    stop = full[k]
    g = policy.generate_text(obs, stop_ids=(stop, 999_999), **kw)
    assert g.token_ids == full[:k] and g.finish_reason == "stop"
    assert g.text == policy.tokenizer.decode(full[:k], skip_special_tokens=True)
    eos_pol = Pi05Policy(policy.model, policy.tokenizer, policy.norm_stats)
    eos_pol.eos_id = stop  # pretend this token is EOS
    g = eos_pol.generate_text(obs, **kw)
    assert g.token_ids == full[:k] and g.finish_reason == "eos"
    g = policy.generate_text(obs, stop_ids=(full[0],), **kw)
    assert g.token_ids == [] and g.finish_reason == "stop" and g.text == ""


# ------------------------------------------------------------------------------------ errors
BAD_OBSERVATIONS = {
    "nan_state": (
        lambda o: setattr(o, "state", np.where(np.arange(ROBOT_DIM) == 3, np.nan, o.state)),
        r"state\[3\] is not finite",
    ),
    "wrong_state_length": (lambda o: setattr(o, "state", o.state[:-1]), rf"state must have shape \[{ROBOT_DIM}\]"),
    "unknown_slot": (
        lambda o: o.images.__setitem__("top_cam", o.images["base_0_rgb"]),
        r"unknown image slot\(s\) \['top_cam'\]",
    ),
    "no_image": (lambda o: o.images.clear(), "no image given"),
    "all_slots_none": (lambda o: o.images.update({k: None for k in o.images}), "no image given"),
    "float_image_out_of_range": (
        lambda o: o.images.__setitem__("base_0_rgb", np.full((20, 20, 3), 2.0, np.float32)),
        r"base_0_rgb.*must be in \[0, 1\]",
    ),
    "grey_image": (lambda o: o.images.__setitem__("base_0_rgb", np.zeros((20, 20), np.uint8)), r"\[H, W, 3\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_OBSERVATIONS))
def test_bad_observation_raises_invalid_input(policy, case):
    """Unusable observations raise InvalidInputError naming the problem, for actions and for text."""
    edit, match = BAD_OBSERVATIONS[case]
    obs = make_obs()
    edit(obs)
    with pytest.raises(InvalidInputError, match=match):
        policy.sample_actions(obs, noise_of(policy, 0))
    with pytest.raises(InvalidInputError, match=match):
        policy.generate_text(obs, max_new_tokens=2)


def test_prompt_one_token_over_the_limit_raises(policy):
    """A prompt of exactly max_token_len tokens works; one token more raises PromptTooLongError
    (an InvalidInputError) giving the count and the limit."""
    limit = policy.cfg.max_token_len
    state = make_obs().state
    norm = policy.normalizer.normalize_state(state)

    def length(instr: str) -> int:
        text = policy.prompt.format_prompt(instr, norm)
        return 1 + len(policy.tokenizer.encode(text, add_special_tokens=False))

    words = []
    while length(" ".join(words)) < limit:
        words.append("a")
    at_limit = " ".join(words)
    assert length(at_limit) == limit and length(at_limit + " a") == limit + 1
    obs = make_obs(instruction=at_limit)
    assert policy.encode_observation(obs).token_masks.sum() == limit
    assert np.isfinite(policy.sample_actions(obs, noise_of(policy, 0))).all()
    over = make_obs(instruction=at_limit + " a")
    with pytest.raises(PromptTooLongError, match=rf"{limit + 1} tokens, max_len is {limit}"):
        policy.sample_actions(over, noise_of(policy, 0))
    with pytest.raises(InvalidInputError):
        policy.generate_text(over, max_new_tokens=2)


@pytest.mark.parametrize("dim", [0, 31])
def test_non_finite_model_output_raises_never_returns_nan(dim):
    """NaN in the action head (a robot dim, or a padded model dim beyond the robot's) raises
    NonFiniteActionError instead of returning actions; NaN logits end text with finish "error"."""
    pol = Pi05Policy.from_pretrained("pi05-tiny", device="cpu", dtype=torch.float32)
    obs = make_obs()
    assert np.isfinite(pol.sample_actions(obs, noise_of(pol, 0))).all()
    with torch.no_grad():
        pol.model.action_out_proj.bias[dim] = float("nan")
    with pytest.raises(NonFiniteActionError):
        pol.sample_actions(obs, noise_of(pol, 0))
    with torch.no_grad():
        pol.model.vlm.norm.weight[0] = float("nan")
    g = pol.generate_text(obs, max_new_tokens=4)
    assert g.finish_reason == "error" and g.token_ids == []
