"""``tfshards show``: one record of a version, its image as PNG, or a contact sheet of many."""

from __future__ import annotations

import itertools
import warnings
from typing import Annotated, Any

import typer

from tfshards.cli._common import one_line_errors

SIDES = ("all", "train", "val")


def _value(kind: str, values: list[Any]) -> str:
    """A feature's values as one short line: bytes by size and head, numbers as they are."""
    if kind != "bytes":  # numpy scalars as plain numbers: 0.1, not np.float32(0.1)
        plain = [v.item() if hasattr(v, "item") else v for v in values]
        return str(plain if len(plain) != 1 else plain[0])[:120]
    shown = []
    for value in values[:3]:
        text = bytes(value)
        try:
            decoded: str | None = text.decode("utf-8")
        except UnicodeDecodeError:
            decoded = None
        printable = decoded is not None and decoded.isprintable() and len(text) <= 80
        shown.append(repr(decoded) if printable else f"<{len(text):,} bytes>")
    return ", ".join(shown) + (f" (+{len(values) - 3} more)" if len(values) > 3 else "")


_PNG_HELP = (
    "Write the record's image here as PNG: a new file, or a PNG show wrote (any other file "
    "is refused, never replaced)."
)
_SHEET_HELP = (
    "Write a contact sheet PNG of --count images here (of --label, --side): a new file, or a "
    "PNG show wrote."
)


@one_line_errors
def show_command(
    manifest: Annotated[
        str, typer.Argument(help="The version's manifest.json (path or fsspec URL).")
    ],
    record: Annotated[
        str | None,
        typer.Argument(
            help="A listed path (relative to the listing's root), or SHARD:INDEX where SHARD "
            "is a shard's name or number. Without it: a contact sheet (--sheet).",
            show_default=False,
        ),
    ] = None,
    png: Annotated[str | None, typer.Option(help=_PNG_HELP)] = None,
    sheet: Annotated[str | None, typer.Option(help=_SHEET_HELP)] = None,
    label: Annotated[
        str | None, typer.Option(help="Only this label's records on the sheet.")
    ] = None,
    side: Annotated[
        str,
        typer.Option(
            help="all | train | val: only one side of the split (--val-fraction, --seed)."
        ),
    ] = "all",
    count: Annotated[int, typer.Option(min=1, max=1000, help="Images on the sheet.")] = 100,
    columns: Annotated[int, typer.Option(min=1, help="Images per row of the sheet.")] = 10,
    val_fraction: Annotated[
        float, typer.Option(help="The split's validation share, as train.val_fraction.")
    ] = 0.2,
    seed: Annotated[int, typer.Option(help="The split's seed, as train.split_seed.")] = 0,
    feature: Annotated[
        str | None, typer.Option(help="The image feature. Default: the manifest's.")
    ] = None,
) -> None:
    """Print one record of a version, write its image, or draw a contact sheet of many.

    With RECORD: its shard and place, listed path, label and every feature
    (bytes by size), read through the index files without TensorFlow; --png
    writes its image. Without RECORD, --sheet draws --count images in shard
    order, of one --label and one --side of the split if asked, as a grid
    of 96 px cells a person can open (or `dvc plots` shows).
    """
    from tfshards.reading import sheet as sheets
    from tfshards.reading.lookup import Version
    from tfshards.shardset import layout
    from tfshards.shardset.manifest import load
    from tfshards.storage import open_url

    if record is not None and (sheet is not None or label is not None):
        raise typer.BadParameter(
            "--sheet and --label draw a contact sheet of many records: give them without "
            "RECORD (--png writes one record's image)"
        )
    if record is None and png is not None:  # with --sheet it was left unwritten, unsaid
        raise typer.BadParameter("--png writes one record's image: give a RECORD with it")
    version = Version(load(manifest))
    for option, url in (("--png", png), ("--sheet", sheet)):
        if url is not None:  # a file there fails validate
            layout.refuse_in_version(url, option, read=version.manifest.directory)
    image = feature or str(version.manifest.params.get("image_feature", "image"))
    if record is not None:
        _print_record(version, record, image, png)
        return
    if sheet is None:
        raise typer.BadParameter("give a RECORD, or --sheet FILE for a contact sheet")
    shards = _side(version.manifest, side, val_fraction, seed)
    chosen = (
        version.of_label(label, shards)
        if label is not None
        else (version.read(s, i) for s in shards for i in range(s.records))
    )
    picked = [
        (r.path, sheets.image_bytes(r.features, image)) for r in itertools.islice(chosen, count)
    ]
    unshown: list[str] = []
    _save(open_url, sheet, sheets.contact_sheet(picked, columns, unshown=unshown), "--sheet")
    typer.echo(f"{len(picked)} image{'s' if len(picked) != 1 else ''} -> {sheet}")
    for line in unshown:
        typer.echo(f"warning: left as an empty cell: {line}", err=True)


def _print_record(version: Any, record: str, image: str, png: str | None) -> None:
    """One record's place, path, label and features; its image written to ``png`` if given."""
    from tfshards.reading import sheet as sheets
    from tfshards.storage import open_url

    found = version.find(record)
    path, label = _one_line(found.path), _one_line(str(found.label))
    typer.echo(f"{found.shard}:{found.index}  {path}  label {label}")
    for name, (kind, values) in sorted(found.features.items()):
        typer.echo(f"  {name} ({kind}): {_value(kind, values)}")
    said = _image_line(found.features.get(image))
    if said:
        typer.echo(f"  {image}: {said}")
    if png is not None:
        data = sheets.to_png(sheets.image_bytes(found.features, image), found.path)
        _save(open_url, png, data, "--png")
        typer.echo(f"image -> {png}")


def _one_line(text: str) -> str:
    """``text`` as is when printable, else as a Python string literal: a path holding a
    line break printed the record's header over two lines."""
    return text if text.isprintable() else repr(text)


def _image_line(feature: Any) -> str:
    """What an image payload's header says (format, size, channels, EXIF orientation); ""
    when the feature holds no bytes."""
    from tfshards.format import exif
    from tfshards.format.imageheader import UNKNOWN, read_header

    if feature is None or feature[0] != "bytes" or not feature[1]:
        return ""
    data = bytes(feature[1][0])
    head = read_header(data)
    if head.format == UNKNOWN:
        return "no known image format by its first bytes"
    return (
        f"{head.format} {head.width} x {head.height}, {head.channels} channels by its header, "
        f"EXIF orientation {exif.orientation(data)}"
    )


def _side(manifest: Any, side: str, val_fraction: float, seed: int) -> list[Any]:
    """The shards of ``side`` (all, train or val) of the split; one line when there is none."""
    if side not in SIDES:
        raise typer.BadParameter(
            f"expected one of {', '.join(SIDES)}, got {side!r}", param_hint="--side"
        )
    if not 0.0 <= val_fraction < 1.0:
        raise typer.BadParameter(
            f"expected a share in [0, 1), got {val_fraction}", param_hint="--val-fraction"
        )
    shards = _split_side(manifest, side, val_fraction, seed)
    if not shards:
        raise typer.BadParameter(
            f"the {side} side holds no shard at --val-fraction {val_fraction}",
            param_hint="--side",
        )
    return shards


def _split_side(manifest: Any, side: str, val_fraction: float, seed: int) -> list[Any]:
    if side == "all":
        return list(manifest.shards)
    from tfshards.shardset.split import SplitWarning, split

    with warnings.catch_warnings():  # how close the split came is train's and validate's to say
        warnings.simplefilter("ignore", SplitWarning)
        chosen = split(manifest, val_fraction, seed)
    return list(chosen.train if side == "train" else chosen.val)


def _save(open_url: Any, url: str, data: bytes, option: str) -> None:
    """Publish ``data`` at ``url`` whole (a temp file renamed), replacing only a PNG that
    show wrote: a raw JPEG given as --png was turned into a PNG in place, and a full disk
    left a cut file.

    Raises:
        ConfigError: something else is there (one line naming it and the option).
    """
    from tfshards import atomicfile
    from tfshards.errors import ConfigError
    from tfshards.reading import sheet as sheets

    fs, path = open_url(url)
    if fs.exists(path):
        found = "a folder" if fs.isdir(path) else "a file show did not write"
        if found == "a folder" or not sheets.made_here(_head(fs, path)):
            raise ConfigError(
                f"{url}: expected a new file or a PNG that show wrote, found {found}: pass "
                f"another {option} or remove it",
                option=option.removeprefix("--"),
            )
    atomicfile.write_atomic(fs, path, [data])


_HEAD_BYTES = 16 << 20  # read of an existing PNG, for its chunks before its pixels


def _head(fs: Any, path: str) -> bytes:
    return bytes(fs.cat_file(path, start=0, end=_HEAD_BYTES))
