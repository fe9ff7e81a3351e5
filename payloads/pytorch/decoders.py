"""CPU JPEG decoders, one interface: encoded bytes -> HxWx3 uint8 RGB array.

benchmarks/input_pipeline.py measures each one available (docs/benchmarks.md#jpeg-decoders has the figures);
`auto` takes the fastest one installed, in the order those measurements gave. Only Pillow and
torchvision are payload requirements; simplejpeg and PyTurboJPEG are used when present. Whatever the
decoder, a file that is not a JPEG (prepare keeps PNGs lossless) or that it refuses (CMYK) goes to
Pillow, which reads every format the data preparation writes.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image

# Fastest first, as measured by benchmarks/input_pipeline.py (docs/benchmarks.md#jpeg-decoders).
PREFERENCE = ("simplejpeg", "turbojpeg", "torchvision", "pillow")
CHOICES = ("auto",) + tuple(sorted(PREFERENCE))
JPEG_MAGIC = b"\xff\xd8"


class DecodeError(Exception):
    """The bytes are not an image any decoder here can read."""


def pillow(data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds for damaged data
        raise DecodeError(f"{type(e).__name__}: {e}") from None


def _simplejpeg() -> Callable[[bytes], np.ndarray]:
    import simplejpeg

    return lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB")


def _turbojpeg() -> Callable[[bytes], np.ndarray]:
    import os

    from turbojpeg import TJPF_RGB, TurboJPEG

    tj = TurboJPEG(os.environ.get("TURBOJPEG_LIB") or None)  # the library path, where not a system one
    return lambda data: tj.decode(data, pixel_format=TJPF_RGB)


def _torchvision() -> Callable[[bytes], np.ndarray]:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: bytes) -> np.ndarray:
        t = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return t.permute(1, 2, 0).contiguous().numpy()

    return decode


_FACTORIES = {"simplejpeg": _simplejpeg, "turbojpeg": _turbojpeg, "torchvision": _torchvision, "pillow": lambda: pillow}


def available() -> list[str]:
    """The decoders that load here, fastest first."""
    found = []
    for name in PREFERENCE:
        try:
            _FACTORIES[name]()
        except Exception:  # noqa: BLE001 - missing module or missing shared library
            continue
        found.append(name)
    return found


def resolve(name: str) -> str:
    """`auto` -> the fastest decoder installed; a named one must load, or the error names the fix."""
    if name == "auto":
        return available()[0]
    if name not in _FACTORIES:
        raise ValueError(f"unknown decoder {name!r}: choose one of {', '.join(CHOICES)}")
    try:
        _FACTORIES[name]()
    except Exception as e:  # noqa: BLE001
        raise ValueError(
            f"decoder {name!r} does not load here ({type(e).__name__}: {e}): install it "
            f"(pip install {'pyturbojpeg and libturbojpeg0' if name == 'turbojpeg' else name}) "
            "or pass --decoder auto"
        ) from None
    return name


def make(name: str) -> Callable[[bytes], np.ndarray]:
    """A decode function for `name` (resolved): JPEGs by it, everything else (and what it refuses) by Pillow."""
    fast = _FACTORIES[resolve(name)]()
    if fast is pillow:
        return pillow

    def decode(data: bytes) -> np.ndarray:
        if data[:2] == JPEG_MAGIC:
            try:
                return fast(data)
            except Exception:  # noqa: BLE001 - CMYK, progressive oddities, damage: Pillow decides
                pass
        return pillow(data)

    return decode
