"""Store images upright: a file's EXIF orientation applied to its pixels when written.

TensorFlow's decoders ignore EXIF, so a phone photo tagged "rotate 90" reaches
the model on its side. ``write.exif``: ``ignore`` stores the file's bytes (as
TensorFlow then reads them), ``warn`` stores them too and counts the files
whose orientation (:mod:`tfshards.format.exif`) is 2..8, ``apply`` stores
those files upright: decoded, turned as Pillow's ``ImageOps.exif_transpose``
turns them, and re-encoded without EXIF. A file with orientation 1 or none is
stored byte for byte (its header is read, never its pixels).

Re-encoding: a JPEG stays a JPEG, saved with its own quantization tables and
chroma subsampling (the same quality, one more generation of loss); a PNG
stays a lossless PNG in its own mode. The ICC profile is kept. Pillow bundles
its encoders, so the bytes are a pure function of the file and the Pillow
version, which :func:`params` records (a new Pillow names a new shard version).
"""

from __future__ import annotations

import io
from typing import Any

from tfshards.errors import ConfigError, InputError
from tfshards.format import exif
from tfshards.format.pixels import pillow_said

MODES = ("ignore", "apply", "warn")


def check_mode(mode: str) -> str:
    """``mode`` when it is one of :data:`MODES`."""
    if mode not in MODES:
        raise ConfigError(
            f"exif: expected one of {MODES}, got {mode!r}", option="exif", valid=MODES
        )
    return mode


def params(mode: str) -> Any:
    """What the mode adds to the version's params: None for ``ignore`` (today's names hold)."""
    if mode == "ignore":
        return None
    if mode == "warn":
        return "warn"
    from importlib import metadata

    return {"encoder": f"pillow {metadata.version('pillow')}", "mode": "apply"}


def upright(data: bytes, turn: int) -> bytes:
    """``data`` (a JPEG or PNG whose EXIF orientation is ``turn``) re-encoded upright.

    Raises:
        InputError: Pillow cannot decode it (without ``path``; the writer adds the file's).
    """
    from PIL import Image, JpegImagePlugin, UnidentifiedImageError

    method = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_270,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(turn)
    if method is None:
        return data
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            kind, info = image.format, image.info
            options: dict[str, Any] = {}
            if info.get("icc_profile"):
                options["icc_profile"] = info["icc_profile"]
            if kind == "PNG" and "transparency" in info:
                options["transparency"] = info["transparency"]
            if kind == "JPEG":
                options["qtables"] = image.quantization  # type: ignore[attr-defined]
                options["subsampling"] = JpegImagePlugin.get_sampling(image)
            turned = image.transpose(method)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"cannot decode as an image to turn upright: {pillow_said(exc)}") from None
    out = io.BytesIO()
    if kind == "JPEG":
        if options["subsampling"] == -1:
            del options["subsampling"]
        turned.save(out, "JPEG", optimize=False, progressive=False, **options)
    else:
        turned.save(out, "PNG", optimize=False, **options)
    return out.getvalue()


def orient(data: bytes, mode: str, rel: str) -> tuple[bytes, int]:
    """The payload to store for file ``rel`` under ``mode``, and its EXIF orientation.

    Raises:
        InputError: under ``apply``, a file tagged 2..8 that Pillow cannot decode.
    """
    turn = exif.orientation(data)
    if mode != "apply" or turn == exif.UPRIGHT:
        return data, turn
    try:
        return upright(data, turn), turn
    except InputError as exc:
        raise InputError(str(exc), path=rel) from None
