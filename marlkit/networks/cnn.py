from __future__ import annotations

import torch
from torch import nn

from marlkit.config import ConfigError, ModelConfig
from marlkit.networks.base import ACTIVATIONS, Encoder, as_float, init_linear
from marlkit.registry import register_model
from marlkit.spec import is_channels_last

MIN_SIDE = 7

# (smallest image side, convolutions as (out channels, kernel, stride)): the first row whose side
# fits is used. From 36 pixels up, Nature-DQN's kernels and strides (the first stride-4 layer
# shrinks the image at once); below, 3x3 kernels that keep the resolution longer, so that a 13x13
# view ends at 4x4, not 0x0. Widths are half Nature-DQN's: a CPU pays for every channel in every
# step and every epoch (docs/benchmarks.md, "Convolutions for small images and CPUs": a seventh of
# the FLOPs on MAgent2 battle's 13x13 views, learning level with the full-width stack there).
LAYOUTS = [
    (36, [(16, 8, 4), (32, 4, 2), (32, 3, 1)]),
    (28, [(16, 5, 2), (32, 3, 2), (32, 3, 1)]),
    (13, [(16, 3, 2), (32, 3, 1)]),
    (MIN_SIDE, [(16, 3, 1), (32, 3, 1)]),
]


def conv_layout(height: int, width: int) -> list[tuple[int, int, int]]:
    """Convolutions for an image of ``height x width``; raises ConfigError below ``MIN_SIDE``."""
    side = min(height, width)
    for smallest, layers in LAYOUTS:
        if side >= smallest:
            return layers
    raise ConfigError(f"{height}x{width} is smaller than the {MIN_SIDE}x{MIN_SIDE} the packaged 'cnn' needs")


def _given_convs(convs) -> list[tuple[int, int, int]]:
    if not isinstance(convs, list) or not convs or not all(
            isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(n, int) and n > 0 for n in c) for c in convs):
        raise ConfigError(f"kwargs.convs={convs!r} must be a list of [out channels, kernel, stride] "
                          "triples of positive integers, e.g. [[32, 3, 2], [64, 3, 1]]")
    return [tuple(c) for c in convs]


@register_model("cnn")
class CNN(Encoder):
    """Convolutions for images ``[C, H, W]`` or ``[H, W, C]``, then one dense layer; uint8 pixels
    are scaled to [0, 1].

    The layout is read from the shape (the channel axis is the short one: ``(13, 13, 5)`` is
    channels-last, ``(4, 84, 84)`` channels-first); ``kwargs: {channels_last: true|false}``
    decides when the shape cannot. Kernels and strides follow the image size (``LAYOUTS``): from
    Nature-DQN's 8/4, 4/2, 3/1 at 36x36 and up, down to two 3x3 convolutions at 7x7.
    ``kwargs: {convs: [[32, 3, 2], [64, 3, 1]]}`` replaces the layout by these convolutions (out
    channels, kernel, stride); ``kwargs: {channels: [16, 32, 32]}`` sets the widths of the layout's
    convolutions (one each; a CPU pays for every channel in every step and every epoch).

    The convolutions run in channels-last memory (NHWC): oneDNN's CPU kernels are faster there on
    these small images than in NCHW (docs/benchmarks.md), and ``[H, W, C]`` observations are in it
    already.
    """

    spec_kwargs = ("channels_last",)
    update_bound = True

    def __init__(self, input_shape: tuple[int, ...], cfg: ModelConfig):
        super().__init__()
        input_shape = tuple(int(n) for n in input_shape)
        if len(input_shape) != 3:
            raise ConfigError(f"model 'cnn' needs images [C, H, W] or [H, W, C], got shape {input_shape}; "
                              "use model 'mlp' (it flattens any shape)")
        self.channels_last = bool(cfg.kwargs.get("channels_last", is_channels_last(input_shape)))
        c, h, w = (input_shape[2], *input_shape[:2]) if self.channels_last else input_shape
        try:
            layers = conv_layout(h, w) if cfg.kwargs.get("convs") is None else None
        except ConfigError as exc:
            raise ConfigError(f"model 'cnn' cannot take shape {input_shape} "
                              f"({'channels-last' if self.channels_last else 'channels-first'}): {exc}; "
                              "use model 'mlp', or set kwargs.channels_last if the layout was misread") from None
        layers = layers or _given_convs(cfg.kwargs["convs"])
        widths = cfg.kwargs.get("channels")
        if widths is not None:
            if len(widths) != len(layers) or not all(isinstance(n, int) and n > 0 for n in widths):
                raise ConfigError(f"model 'cnn': kwargs.channels={widths!r} must give {len(layers)} positive widths, "
                                  f"one per convolution of its layout for {h}x{w} images "
                                  f"({[out for out, _, _ in layers]} by default)")
            layers = [(n, kernel, stride) for n, (_, kernel, stride) in zip(widths, layers)]
        act = ACTIVATIONS[cfg.activation]
        convs: list[nn.Module] = []
        for out, kernel, stride in layers:
            convs += [nn.Conv2d(c, out, kernel, stride=stride), act()]
            c = out
        self.conv = nn.Sequential(*convs, nn.Flatten()).to(memory_format=torch.channels_last)
        try:
            with torch.no_grad():
                flat = self.conv(torch.zeros(1, input_shape[2] if self.channels_last else input_shape[0], h, w)).shape[1]
        except RuntimeError:
            raise ConfigError(f"model 'cnn': the convolutions {layers} leave nothing of a {h}x{w} image; "
                              "use fewer, smaller or less strided ones (kwargs.convs)") from None
        width = cfg.hidden_sizes[-1] if cfg.hidden_sizes else 512
        self.head = nn.Sequential(init_linear(nn.Linear(flat, width)), act())
        self.out_dim = width

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        # the layout changes before the dtype: moving uint8 pixels is a quarter of moving floats,
        # and the float conversion keeps the layout (half the time of the other order); under
        # autocast, pixels go straight to its dtype, which the first convolution would cast them to
        device = x.device.type
        pixels = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
        x = as_float(x.contiguous(memory_format=torch.channels_last), pixels)
        return self.head(self.conv(x))
