"""Any image Pillow opens as the 8-bit pixels TensorFlow's decoders give: grey or RGB.

Grey modes (``1``, ``L``, ``LA``, 16-bit grey, and a 16-bit grey + alpha PNG,
which Pillow opens as RGBA) stay grey; colour modes become RGB (an alpha
channel is dropped). 16-bit samples become 8-bit the way TensorFlow's
``decode_png(dtype=uint8)`` does: the high byte (libpng's strip-16, ``v >>
8``; 32895 -> 128, 255 -> 0). Pillow reads 16-bit colour PNGs that way
itself; 16-bit grey (modes ``I;16*``) and mode ``I`` (taken as 16-bit samples,
0..65535) are shifted here. Mode ``F`` (float pixels, which no TensorFlow
decoder reads, so no scale to match) and anything else with no 8-bit grey or
RGB form are refused, naming the mode.
"""

from __future__ import annotations

import re
from typing import Any

from tfshards.errors import InputError

# Pillow names its input in some errors: for bytes in memory, an address that differs in
# every process (a reject reason holding it made the manifest differ from run to run).
_MEMORY_FILE = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>")

_GREY = ("1", "L", "LA")
_GREY_16 = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # shifted to their high byte
_COLOUR = ("RGB", "RGBA", "RGBX", "RGBa", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")
_PNG_GREY = (0, 4)  # IHDR colour types: grey, grey + alpha (16-bit: Pillow opens it as RGBA)


def eight_bit(image: Any, data: bytes, *, doing: str) -> Any:
    """``image`` (a loaded Pillow image of the encoded ``data``) as 8-bit ``L`` or ``RGB``.

    Raises:
        InputError: a mode with no such conversion (``F``, ``I`` outside 0..65535,
            others), saying it cannot ``doing`` it (``"resize"``: "cannot resize an
            image of mode F ...").
    """
    from PIL import Image

    mode = image.mode
    if mode in _GREY:
        return image.convert("L")
    if mode in _COLOUR:
        if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 25 and data[25] in _PNG_GREY:
            return image.getchannel(0)  # a 16-bit grey + alpha PNG, R = G = B
        return image.convert("RGB")
    if mode in _GREY_16:
        import numpy as np

        samples = np.asarray(image)
        if mode == "I" and samples.size and (samples.min() < 0 or samples.max() > 0xFFFF):
            raise InputError(
                f"cannot {doing} an image of mode I: expected 16-bit samples 0..65535, "
                f"found {samples.min()}..{samples.max()}"
            )
        return Image.fromarray((samples >> 8).astype(np.uint8))
    if mode == "F":
        raise InputError(
            f"cannot {doing} an image of mode F (float pixels): no TensorFlow decoder reads "
            "one, so there is no 8-bit scale to match; store it as 8- or 16-bit"
        )
    raise InputError(
        f"cannot {doing} an image of mode {mode}: expected 8-bit grey or colour, "
        f"16-bit grey or integer (I, 0..65535) pixels"
    )


def pillow_said(exc: BaseException) -> str:
    """What Pillow's error ``exc`` says, without the address of the bytes it read."""
    return _MEMORY_FILE.sub("", str(exc)).strip() or type(exc).__name__
