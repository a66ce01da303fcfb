"""Input/output processing of the π0.5 policy: images, state/action normalisation, errors.

numpy, with PyTorch's bilinear resampling for images (no OpenCV, no ROS: the core runs on a bare
PyTorch stack). Follows openpi: ``src/openpi/shared/image_tools.py``
(``resize_with_pad``), ``src/openpi/transforms.py`` (quantile ``Normalize``/``Unnormalize``) and the
π0.5 image slots of ``src/openpi/models/model.py``. The prompt tokenizer lives in
:mod:`oxygen_ros.core.prompt` and is re-exported here (``PromptTokenizer``, ``PromptTooLongError``,
``format_template``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from oxygen_ros.core.types import NormStats

QUANTILE_EPS = 1e-6  # openpi's epsilon in the quantile (q01/q99) normalisation
_FLOAT_TOL = 0.01  # float images may overshoot [0, 1] by this much (resampling); clipped


class InvalidInputError(ValueError):
    """An observation (image, state, prompt) is unusable; the message says which part and why."""


class NonFiniteActionError(RuntimeError):
    """The model produced NaN/inf actions; nothing may be sent to the robot."""


# ----------------------------------------------------------------------------------------- images


def _check_image(image: Any, name: str) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise InvalidInputError(f"{name}: expected a numpy array, got {type(image).__name__}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise InvalidInputError(f"{name}: expected an HWC RGB image of shape [H, W, 3], got shape {image.shape}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise InvalidInputError(f"{name}: empty image of shape {image.shape}")
    if image.dtype == np.uint8:
        return image
    if image.dtype not in (np.float16, np.float32, np.float64):
        raise InvalidInputError(f"{name}: dtype {image.dtype} is not supported (uint8 in [0, 255] or float in [0, 1])")
    if not np.isfinite(image).all():
        raise InvalidInputError(f"{name}: float image contains NaN or inf")
    lo, hi = float(image.min()), float(image.max())
    if lo < -_FLOAT_TOL or hi > 1 + _FLOAT_TOL:
        hint = " (looks like 0..255: pass uint8 or divide by 255)" if hi > 1.5 else ""
        raise InvalidInputError(f"{name}: float image values must be in [0, 1], got [{lo:.4g}, {hi:.4g}]{hint}")
    return image


def _check_size(size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise InvalidInputError(f"image size must be a positive int, got {size!r}")


def _resize_bilinear(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """``[H, W, 3]`` uint8 or float32 → ``[h, w, 3]`` of the same dtype (bilinear, half-pixel
    centres, no antialiasing; uint8 stays uint8 with rounding)."""
    t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
    with torch.inference_mode():
        out = F.interpolate(t, size=(h, w), mode="bilinear", align_corners=False, antialias=False)
    return out[0].permute(1, 2, 0).numpy()


def resize_with_pad(image: np.ndarray, size: int, *, name: str = "image") -> np.ndarray:
    """Resize keeping the aspect ratio, pad to ``size``×``size`` with black, map to [-1, 1].

    Follows openpi ``image_tools.resize_with_pad``: ``ratio = max(W / size, H / size)``, resized
    dims ``int(dim / ratio)`` (at least 1), padding ``(size - resized) // 2`` on top/left and the rest
    on bottom/right. Bilinear resampling with half-pixel centres (``F.interpolate``, as LeRobot's
    π0.5 does; within one intensity level of OpenCV's ``INTER_LINEAR``); a uint8 image is resampled
    in uint8 with rounding, as openpi does. Black padding becomes -1. Note: like LeRobot this does
    not antialias when downscaling, whereas openpi's PIL/JAX resizers do; the difference is
    sub-pixel smoothing only.

    Args:
        image: ``[H, W, 3]`` RGB, uint8 in [0, 255] or float16/32/64 in [0, 1].
        size: output side in pixels (224 for π0.5).
        name: used in error messages (e.g. the camera slot).

    Returns:
        ``[size, size, 3]`` float32 in [-1, 1] (uint8 ``x`` maps to ``x / 255 * 2 - 1``).

    Raises:
        InvalidInputError: not an ``[H, W, 3]`` array, empty, unsupported dtype, non-finite floats,
            or float values outside [0, 1] by more than 0.01.
    """
    _check_size(size)
    img = _check_image(image, name)
    h, w = img.shape[:2]
    if img.dtype != np.uint8:
        img = img.astype(np.float32)
    ratio = max(w / size, h / size)
    rh, rw = max(1, min(size, int(h / ratio))), max(1, min(size, int(w / ratio)))
    if (rh, rw) != (h, w):
        img = _resize_bilinear(img, rh, rw)
    if img.dtype == np.uint8:
        content = img.astype(np.float32) * np.float32(2.0 / 255.0) - np.float32(1.0)
    else:
        content = np.clip(img, 0.0, 1.0) * np.float32(2.0) - np.float32(1.0)
    out = np.full((size, size, 3), -1.0, dtype=np.float32)
    top, left = (size - rh) // 2, (size - rw) // 2
    out[top : top + rh, left : left + rw] = content
    return out


def prepare_images(
    images: dict[str, np.ndarray | None], slots: tuple[str, ...], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Build the model's image batch for one observation (π0.5 slot semantics).

    Args:
        images: slot name -> ``[H, W, 3]`` image (see :func:`resize_with_pad`) or ``None``.
        slots: slot names in model order, e.g. ``("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")``.
        size: model image side in pixels.

    Returns:
        ``pixels``: ``[len(slots), 3, size, size]`` float32 CHW in [-1, 1]; a missing/``None`` slot is
        all -1 (black). ``mask``: ``[len(slots)]`` bool, False for missing slots.

    Raises:
        InvalidInputError: a key of ``images`` is not in ``slots`` (named), an image is invalid
            (named by slot), or no slot has an image.
    """
    if not isinstance(images, dict):
        raise InvalidInputError(f"images must be a dict slot -> image, got {type(images).__name__}")
    _check_size(size)
    unknown = sorted(set(images) - set(slots))
    if unknown:
        raise InvalidInputError(f"unknown image slot(s) {unknown}; expected some of {list(slots)}")
    pixels = np.full((len(slots), 3, size, size), -1.0, dtype=np.float32)
    mask = np.zeros(len(slots), dtype=bool)
    for i, slot in enumerate(slots):
        img = images.get(slot)
        if img is None:
            continue
        pixels[i] = resize_with_pad(img, size, name=f"image {slot!r}").transpose(2, 0, 1)
        mask[i] = True
    if not mask.any():
        raise InvalidInputError(f"no image given: at least one of {list(slots)} is required")
    return pixels, mask


# ---------------------------------------------------------------------------------- normalisation


def _check_stats(stats: NormStats, what: str) -> tuple[np.ndarray, np.ndarray]:
    q01 = np.asarray(stats.q01, dtype=np.float64).reshape(-1)
    q99 = np.asarray(stats.q99, dtype=np.float64).reshape(-1)
    if q01.shape != q99.shape or q01.size == 0:
        raise ValueError(f"{what} norm stats: q01 {q01.shape} and q99 {q99.shape} must be 1-D of one non-zero length")
    bad = np.flatnonzero(~np.isfinite(q01) | ~np.isfinite(q99) | (q99 < q01))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what} norm stats invalid at index {i}: q01={q01[i]!r}, q99={q99[i]!r} "
            "(need finite values with q01 <= q99)"
        )
    return q01, q99


class Normalizer:
    """Quantile normalisation of state and actions (openpi ``transforms.Normalize`` /
    ``Unnormalize`` with ``use_quantiles=True``, as π0.5 uses).

    ``normalize_state``: ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1``.
    ``unnormalize_actions``: ``(a + 1) / 2 * (q99 - q01 + 1e-6) + q01``.

    Zero-width dimensions (``q99 == q01``, e.g. a joint that never moved in the training data):
    the state maps to **-1**, the value openpi and LeRobot give for ``x == q01`` -- the only value
    that dimension ever had in training, so the model sees what it was trained on; any other
    reading would otherwise blow up to ±1e6. Actions of such a dimension map to ``q01`` exactly.

    Args:
        state: stats of the robot state (``[state_dim]``).
        actions: stats of the robot actions (``[robot_action_dim]``).

    Raises:
        ValueError: stats are not 1-D, contain non-finite values, or have ``q99 < q01``.
    """

    def __init__(self, state: NormStats, actions: NormStats) -> None:
        self._s_q01, s_q99 = _check_stats(state, "state")
        self._a_q01, a_q99 = _check_stats(actions, "actions")
        self._s_width = s_q99 - self._s_q01
        self._a_width = a_q99 - self._a_q01
        self._s_zero = self._s_width == 0
        self._a_zero = self._a_width == 0

    @property
    def state_dim(self) -> int:
        """Robot state dimension."""
        return int(self._s_q01.size)

    @property
    def action_dim(self) -> int:
        """Robot action dimension (a prefix of the model's padded action dimension)."""
        return int(self._a_q01.size)

    @classmethod
    def identity(cls, dim_state: int, dim_action: int) -> Normalizer:
        """Stats with q01 = -1, q99 = 1 (identity up to the 1e-6 epsilon), for random-weight checkpoints."""
        return cls(NormStats.identity(dim_state), NormStats.identity(dim_action))

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Normalise a robot state.

        Args:
            state: ``[state_dim]`` real values in robot units.

        Returns:
            ``[state_dim]`` float32, ~[-1, 1] for in-distribution values (not clipped; the prompt
            tokenizer clips when binning).

        Raises:
            InvalidInputError: wrong shape/length, non-numeric, a NaN/inf entry (index named), or a
                value so far out of range that the result overflows float32.
        """
        try:
            x = np.asarray(state, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"state must be numeric, got {type(state).__name__}: {e}") from None
        if x.ndim != 1 or x.size != self.state_dim:
            raise InvalidInputError(f"state must have shape [{self.state_dim}], got {list(x.shape)}")
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            raise InvalidInputError(f"state[{int(bad[0])}] is not finite ({x[bad[0]]!r}); non-finite at {bad.tolist()}")
        with np.errstate(over="ignore", invalid="ignore"):
            y = (x - self._s_q01) / (self._s_width + QUANTILE_EPS) * 2.0 - 1.0
            y = np.where(self._s_zero, -1.0, y).astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(y))
        if bad.size:
            raise InvalidInputError(f"state[{int(bad[0])}]={x[bad[0]]!r} is too far outside its q01/q99 range")
        return y

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Map model actions back to robot units.

        Args:
            actions: ``[H, model_action_dim]`` model output (normalised, model_action_dim >= action_dim).

        Returns:
            ``[H, action_dim]`` float32 robot actions (first ``action_dim`` columns), always finite.

        Raises:
            ValueError: not 2-D or fewer columns than ``action_dim``.
            NonFiniteActionError: any NaN/inf in ``actions`` (also in padded columns: it means the
                model diverged) or in the result.
        """
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] < self.action_dim:
            raise ValueError(f"actions must have shape [H, >= {self.action_dim}], got {list(a.shape)}")
        bad = np.argwhere(~np.isfinite(a))
        if bad.size:
            t, d = (int(v) for v in bad[0])
            raise NonFiniteActionError(
                f"model produced non-finite actions ({bad.shape[0]} values), first at step {t}, dim {d}: {a[t, d]!r}"
            )
        a = a[:, : self.action_dim]
        with np.errstate(over="ignore", invalid="ignore"):
            y = (a + 1.0) / 2.0 * (self._a_width + QUANTILE_EPS) + self._a_q01
            y = np.where(self._a_zero, self._a_q01, y).astype(np.float32)
        if not np.isfinite(y).all():
            raise NonFiniteActionError("unnormalised actions overflow float32")
        return y

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot actions → normalised model space, the inverse of :meth:`unnormalize_actions`:
        ``(a - q01) / (q99 - q01 + 1e-6) * 2 - 1``; zero-width dimensions map to -1.

        Args:
            actions: ``[H, action_dim]`` finite actions in robot units (before any action-space
                conversion: what :meth:`unnormalize_actions` returns).

        Returns:
            ``[H, action_dim]`` float32.

        Raises:
            ValueError: wrong shape or a non-finite value.
        """
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.action_dim or not np.isfinite(a).all():
            raise ValueError(f"actions must be finite [H, {self.action_dim}], got {list(a.shape)}")
        y = (a - self._a_q01) / (self._a_width + QUANTILE_EPS) * 2.0 - 1.0
        return np.where(self._a_zero, -1.0, y).astype(np.float32)


__all__ = [
    "InvalidInputError",
    "NonFiniteActionError",
    "QUANTILE_EPS",
    "resize_with_pad",
    "prepare_images",
    "Normalizer",
]
