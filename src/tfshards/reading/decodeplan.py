"""Which decode path pays for a shard set: a pure function of the set's image sizes.

Two choices, each measured on the 2-core machine while others used it
(load average 3-7: single runs swing +-50%, so the rules rest on CPU per
record and on what the path cannot lose):

- Scaled JPEG decode (``tf.io.decode_jpeg(ratio=...)`` picked per image by a
  ``tf.cond`` and a ``switch_case``) skips most of the inverse DCT, but control
  flow in a ``tf.data`` function costs ~60-80 us per record (96 px JPEGs
  resized to 96: 320 us of CPU per record with the switch against 261 us
  without; in a batch graph of 128 unrolled images 1,900 us against 336 us).
  It pays only where the source is at least twice the target in both sides
  (512 px read at 224: 2.52-2.63 ms against 2.67-2.86 ms whole; a fixed
  ratio without the switch 2.35-2.38 ms); elsewhere the switch picks the full
  scale anyway, so leaving it out changes no pixel of an image of that size.
  In a batch graph (``per_record=False``) the switch costs most: 500 512 px
  JPEGs read at 224 a batch at a time took 9.2-12.1 s against 1.3 s record
  by record.
- Record by record (parse + decode in a parallel map, then batch) against a
  batch at a time (one ``parse_example`` per batch, one decode op per image in
  the batch's graph): the batch graph saves the per-record work of tf.data
  (a map call, a parse, an element), which is most of the cost of a tiny
  image, but its few large work items keep fewer threads busy, which costs
  more as the decode grows. On a quiet machine (5,000 JPEGs a size, batches
  of 128, medians of 7 interleaved epochs, wall against the usual reader):
  32 px 1.45x a batch at a time against 1.07x record by record, 48 px 1.29x
  against 1.03x, 64 px 1.04x against 0.93x; 96 px 0.90-1.05x against
  0.96-0.97x, 128 px 0.82x against 0.95x, 224 px 0.82x against 1.03x. So
  images of at most 64 x 64 pixels go a batch at a time, larger ones record
  by record (``BATCHED_UP_TO``). Under load (3.5-6.7 on 2 cores) two earlier
  runs had record by record at 1.29x and 1.00x at 32 px (batch 0.80x,
  1.18x), 0.53x and 0.97x at 96 px (0.56x, 0.80x), 0.92x and 0.63x at 224 px
  (0.53x, 0.50x), 1.55x and 0.98x for 512 px read at 224 (0.78x, 0.47x).
- ``tf.io.decode_jpeg`` against ``tf.io.decode_image`` (which sniffs the
  format of each image): the same pixels, and at 512 px 3.68 against 4.13 ms
  of CPU per image (11% less; 500 JPEGs in a parallel map, medians of 5
  rounds on a quiet machine); no difference at 96 px (243 against 244 us). A
  set uses it when its image statistics (``imagestats.json``, counted from the
  stored payloads as they were written) count JPEGs only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SCALED_FROM = 2  # the smallest source / target ratio (both sides) at which libjpeg scales (1/2)
BATCHED_UP_TO = 64 * 64  # the most pixels (height x width) of an image decoded a batch at a time
JPEG = "JPEG"  # the format name the image statistics count JPEGs under


@dataclass(frozen=True)
class DecodePlan:
    """How images are decoded: record by record or a batch at a time, with a scaled JPEG decode."""

    per_record: bool
    scaled: bool
    jpeg: bool = False  # every stored image is a JPEG: decode_jpeg, no format sniffing


def plan(
    *,
    source: tuple[int, int] | None,
    target: tuple[int, int] | None,
    per_record: bool | None = None,
    scaled_decode: bool = True,
    formats: Mapping[str, int] | None = None,
) -> DecodePlan:
    """The decode path for a set whose images are ``source`` (height, width) pixels.

    ``source``: the first image's size, or the stored size of a set written
    resized; None when unknown (no image decoded). ``target``: the size the
    images are resized to, None when they are not resized. ``per_record`` and
    ``scaled_decode`` are the caller's options: a ``per_record`` given wins;
    ``scaled_decode=False`` turns the scaled decode off. ``formats``: the
    stored images counted per format (None when the set has no statistics).

    Unless asked, a set is decoded a batch at a time when its images have at
    most ``BATCHED_UP_TO`` pixels and no scaled decode (whose per-image choice
    costs most in a batch graph), record by record otherwise.
    """
    scaled = (
        scaled_decode
        and target is not None
        and source is not None
        and source[0] >= SCALED_FROM * target[0]
        and source[1] >= SCALED_FROM * target[1]
    )
    tiny = source is not None and source[0] * source[1] <= BATCHED_UP_TO
    by_record = (not tiny or scaled) if per_record is None else per_record
    counts = dict(formats or {})
    jpeg = counts.pop(JPEG, 0) > 0 and not any(counts.values())
    return DecodePlan(per_record=by_record, scaled=scaled, jpeg=jpeg)
