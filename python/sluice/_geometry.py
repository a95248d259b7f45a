"""Annotations that follow their crops: boxes in source pixels mapped through a sample's
geometry (``images.geometry[i]``) into the pixels of the tensor the loader delivered."""

from __future__ import annotations

from typing import Any, Mapping, Tuple

__all__ = ["transform_boxes"]


def transform_boxes(
    boxes_xyxy: Any, geometry: Mapping[str, Any], min_size: float = 1.0
) -> Tuple[Any, Any]:
    """Maps boxes ``(x0, y0, x1, y1)`` in source image pixels into the output tensor's pixels.

    The format is corner coordinates, ``x0 <= x1`` and ``y0 <= y1`` (Pascal VOC's, and
    torchvision's ``"xyxy"``). COCO's ``(x, y, width, height)`` must be converted first
    (``x1 = x + width``): a box whose corners are out of order raises ``ValueError`` naming
    it rather than being mapped wrong.

    ``geometry`` is one row of ``images.geometry``: ``{"source": (h, w), "box": (x0, y0, x1,
    y1), "size": (h, w), "flip": bool}``: the crop box (source pixels, after EXIF orientation)
    was resampled to ``size`` and then mirrored left-right if ``flip``. A row whose pixel ops
    moved pixels (``rotate``, ``shear_x``, ``translate_y``, ``rand_augment``'s geometric ops,
    ...) also has ``"affine"``: ``[a, b, c, d, e, f]``, taking (x, y) to (a·x + b·y + c,
    d·x + e·y + f) after the crop and flip.

    Each box is scaled and shifted like the crop, mirrored with it, and clipped to the output;
    then, with an ``affine``, its four corners are mapped and the box becomes the one that
    encloses them, clipped again (torchvision's ``BoundingBoxes`` under ``affine`` and
    ``rotate``; erasing moves nothing).
    A box that leaves the crop, or keeps less than ``min_size`` pixels of width or height
    once clipped, is dropped. Returns ``(boxes, keep)``: a float32 array of the kept boxes
    (M×4) and a boolean array over the input boxes (N), so labels can follow
    (``labels[keep]``).

    Example, a detection batch::

        for images, labels in loader.epoch(e):
            for i, g in enumerate(images.geometry):
                boxes, keep = sluice.transform_boxes(images.fields["json"][i]["boxes"], g)
                classes = np.asarray(images.fields["json"][i]["classes"])[keep]
    """
    import numpy as np

    b = np.asarray(boxes_xyxy, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(
            f"transform_boxes: boxes must be N x 4 (x0, y0, x1, y1), got shape {b.shape}"
        )
    if not np.isfinite(b).all():
        raise ValueError("transform_boxes: a box has a coordinate that is not finite")
    wrong = np.flatnonzero((b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1]))
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"transform_boxes: box {i} {b[i].tolist()} has x1 < x0 or y1 < y0: boxes are "
            "(x0, y0, x1, y1) corners; convert COCO's (x, y, width, height) first"
        )
    x0, y0, x1, y1 = (float(v) for v in geometry["box"])
    out_h, out_w = (float(v) for v in geometry["size"])
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"geometry box {geometry['box']} is empty")
    sx, sy = out_w / (x1 - x0), out_h / (y1 - y0)
    out = np.empty_like(b)
    out[:, 0] = (b[:, 0] - x0) * sx
    out[:, 2] = (b[:, 2] - x0) * sx
    out[:, 1] = (b[:, 1] - y0) * sy
    out[:, 3] = (b[:, 3] - y0) * sy
    if geometry.get("flip"):
        left = out_w - out[:, 2]
        right = out_w - out[:, 0]
        out[:, 0], out[:, 2] = left, right
    _clip(out, out_w, out_h)
    affine = geometry.get("affine")
    if affine is not None:
        a, b_, c, d, e, f = (float(v) for v in affine)
        xs = out[:, [0, 2, 2, 0]]
        ys = out[:, [1, 1, 3, 3]]
        tx = a * xs + b_ * ys + c
        ty = d * xs + e * ys + f
        out = np.stack([tx.min(1), ty.min(1), tx.max(1), ty.max(1)], axis=1)
        _clip(out, out_w, out_h)
    keep = ((out[:, 2] - out[:, 0]) >= min_size) & ((out[:, 3] - out[:, 1]) >= min_size)
    return out[keep].astype(np.float32), keep


def _clip(boxes: Any, width: float, height: float) -> None:
    """Boxes (N×4, x0 y0 x1 y1) clipped to a width × height image, in place."""
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0.0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0.0, height)
