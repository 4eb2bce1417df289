"""Which MLX device a rerun or a recording computes on, refused by name when this build lacks it.

MLX's own refusal of a GPU it does not have reads "[default_stream] Cannot get gpu stream
without gpu backend", which names neither the option nor what to do.
"""

from __future__ import annotations

import mlx.core as mx


class DeviceError(ValueError):
    pass


def gpu_available() -> bool:
    return bool(mx.metal.is_available())


def device_of(name: str) -> mx.Device:
    """`cpu`, or `gpu` where this MLX build has one (Metal); anything else is refused by name."""
    if name == "cpu":
        return mx.Device(mx.cpu)
    if name == "gpu":
        if not gpu_available():
            raise DeviceError("device 'gpu' was asked for, but this MLX build has no GPU (it is a CPU-only build): use --device cpu")
        return mx.Device(mx.gpu)
    raise DeviceError(f"device must be 'cpu' or 'gpu', not {name!r}")
