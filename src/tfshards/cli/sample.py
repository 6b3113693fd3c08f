"""``tfshards sample``: write sample image trees to try the pipeline on."""

from __future__ import annotations

from typing import Annotated

import typer

from tfshards.cli._common import default_workers, one_line_errors

sample_app = typer.Typer(
    help="Write sample image trees (ImageFolder layout) to try the pipeline on.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

OutDir = Annotated[
    str, typer.Argument(help="Folder (or fsspec URL) to write into; created if missing.")
]


@sample_app.command("digits")
@one_line_errors
def digits_command(out_dir: OutDir) -> None:
    """Write the bundled 1,797 handwritten digits (UCI's, as scikit-learn's load_digits
    has them) as OUT_DIR/<digit>/<id>.png.

    Grayscale 8x8 PNGs (native size, 0..16 scaled to 0..255), ten labels "0".."9",
    no download. The same bytes on every run.
    """
    from tfshards.project.sample import write_digits

    n = write_digits(out_dir)
    typer.echo(f"wrote {n} digit images in 10 labels -> {out_dir}")


@sample_app.command("synthetic")
@one_line_errors
def synthetic_command(
    out_dir: OutDir,
    count: Annotated[int, typer.Option("--count", help="Number of images.", min=1)] = 1000,
    size: Annotated[int, typer.Option("--size", help="Width and height in pixels.", min=8)] = 96,
    fmt: Annotated[
        str, typer.Option("--format", help="Image format: jpeg (quality 90) or png.")
    ] = "jpeg",
    classes: Annotated[
        int, typer.Option("--classes", help="Number of classes (label folders 00, 01, ...).")
    ] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the whole tree.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Processes to render with. Default: all cores.", min=1),
    ] = None,
) -> None:
    """Write COUNT deterministic synthetic images as OUT_DIR/<class>/<index>.jpg.

    Image i has class i % CLASSES; its background hue encodes the class, and
    shapes and noise (drawn from numpy's default_rng([SEED, i])) make JPEG sizes
    realistic: about 4 KB at 96 px and 70 KB at 512 px. The same arguments give
    the same bytes on every run and with any --workers.
    """
    from tfshards.project.sample import write_synthetic

    n_workers = workers or default_workers()
    n = write_synthetic(
        out_dir, count, size, fmt=fmt, classes=classes, seed=seed, workers=n_workers, progress=True
    )
    typer.echo(f"wrote {n} synthetic {size}x{size} {fmt} images in {classes} classes -> {out_dir}")
