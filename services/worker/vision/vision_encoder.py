"""One image's embeddings through the family's own `get_image_features`, checked on the way in and out.

The tensors are what the family's processor gives for the image alone (Idefics3: `pixel_values`
`[1, tiles, 3, H, W]` and `pixel_attention_mask` `[1, tiles, H, W]`; Qwen2-VL: `pixel_values`
`[patches, dim]` and `image_grid_thw` `[1, 3]`), so transformers' encoder computes exactly what its
`generate` would: the SigLIP tiles and pixel-shuffle connector, or the vision transformer and merger.
"""

from __future__ import annotations

import dataclasses

import torch

from ztgi.common.messages.images import EncodedImage
from ztgi.services.worker.layers.transformers_module import TransformersModule
from ztgi.services.worker.vision.raw_tensors import image_tensors

IDEFICS3_TYPES = ("idefics3", "smolvlm")
QWEN2_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")  # the same image inputs, rows and positions
MODEL_TYPES = (*IDEFICS3_TYPES, *QWEN2_VL_TYPES)


class ImageError(ValueError):
    """An image its request sent cannot be encoded: that request fails, the others go on."""


@dataclasses.dataclass(frozen=True)
class VisionEncoder:
    """The multimodal model's vision side (`model.model` of the image-text-to-text model) and the facts
    the engine needs about it: the placeholder token, and for Qwen2-VL the patch merge (mrope)."""

    model_type: str
    multimodal: TransformersModule  # Idefics3Model / Qwen2VLModel: holds get_image_features
    image_token_id: int
    dtype: torch.dtype
    device: torch.device
    spatial_merge_size: int | None = None  # Qwen2-VL: positions come from the grid (`MropePositions`)

    @property
    def uses_mrope(self) -> bool:
        return self.spatial_merge_size is not None

    def encode(self, image: EncodedImage) -> torch.Tensor:
        """`[num_tokens, hidden]` in the model's dtype; ImageError for bad tensors, an encoder
        failure, or a row count other than the image's `num_tokens`."""
        tensors = self._checked(image)
        try:
            rows = self._features(tensors)
        except Exception as exc:  # noqa: BLE001 -- any encoder failure is this image's, not the worker's
            raise ImageError(f"the vision encoder failed on the image at [{image.start}, {image.end}): "
                             f"{type(exc).__name__}: {exc}") from exc
        if rows.shape[0] != image.num_tokens:
            raise ImageError(f"the image at [{image.start}, {image.end}) encodes to {rows.shape[0]} rows but its "
                             f"span holds {image.num_tokens} image tokens")
        return rows.to(self.dtype)

    def grid(self, image: EncodedImage) -> tuple[int, int, int]:
        """Qwen2-VL: the image's (temporal, height, width) patch grid, before the merge."""
        thw = self._checked(image)["image_grid_thw"]
        t, h, w = (int(v) for v in thw[0])
        return t, h, w

    def _checked(self, image: EncodedImage) -> dict[str, torch.Tensor]:
        try:
            tensors = image_tensors(image)
            if self.model_type in QWEN2_VL_TYPES:
                _check_qwen2_vl(tensors)
            else:
                _check_idefics3(tensors)
        except ValueError as exc:
            raise ImageError(f"the image at [{image.start}, {image.end}): {exc}") from None
        return tensors

    def _features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        on_device = {name: tensor.to(self.device) for name, tensor in tensors.items()}
        if self.model_type in QWEN2_VL_TYPES:
            out = self.multimodal.get_image_features(on_device["pixel_values"], on_device["image_grid_thw"],
                                                     return_dict=True)
        else:
            out = self.multimodal.get_image_features(on_device["pixel_values"], on_device["pixel_attention_mask"])
        return out.pooler_output[0]


def _check_idefics3(tensors: dict[str, torch.Tensor]) -> None:
    pixels, mask = _named(tensors, "pixel_values", "pixel_attention_mask")
    if pixels.dtype != torch.float32 or pixels.dim() != 5 or pixels.shape[0] != 1 or pixels.shape[2] != 3:
        raise ValueError(f"`pixel_values` must be float32 [1, tiles, 3, H, W], got {_describe(pixels)}")
    if mask.dim() != 4 or list(mask.shape) != [1, pixels.shape[1], *pixels.shape[3:]]:
        raise ValueError(f"`pixel_attention_mask` must be [1, {pixels.shape[1]}, {pixels.shape[3]}, "
                         f"{pixels.shape[4]}] for `pixel_values` {list(pixels.shape)}, got {_describe(mask)}")
    if mask.dtype.is_floating_point:
        raise ValueError(f"`pixel_attention_mask` must be bool or integer, got {mask.dtype}")


def _check_qwen2_vl(tensors: dict[str, torch.Tensor]) -> None:
    pixels, thw = _named(tensors, "pixel_values", "image_grid_thw")
    if pixels.dtype != torch.float32 or pixels.dim() != 2:
        raise ValueError(f"`pixel_values` must be float32 [patches, dim], got {_describe(pixels)}")
    if thw.dtype != torch.int64 or list(thw.shape) != [1, 3] or int(thw.min()) < 1:
        raise ValueError(f"`image_grid_thw` must be int64 [1, 3] of positive sizes, got {_describe(thw)}")
    if int(thw.prod()) != pixels.shape[0]:
        raise ValueError(f"`image_grid_thw` {thw[0].tolist()} makes {int(thw.prod())} patches but `pixel_values` "
                         f"has {pixels.shape[0]}")


def _named(tensors: dict[str, torch.Tensor], *names: str) -> list[torch.Tensor]:
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ValueError(f"missing tensors {missing} (given: {sorted(tensors)})")
    return [tensors[name] for name in names]


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"
