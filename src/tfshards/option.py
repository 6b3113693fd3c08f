"""One option of a pipeline stage, defined once beside the stage's config.

:mod:`tfshards.project.stageoptions` turns a stage's tuple of :class:`Option`
into its typer command, its DVC command and its params.yaml section (with
comments), and the parsed values into the stage's config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """A stage option: its command-line form, where DVC takes it from, the config field it sets.

    Attributes:
        name: the Python name; ``--name-with-dashes`` on the command line.
        type: the value's type: ``int``, ``float``, ``str``, ``str | None``,
            ``bool`` or ``int | None``. A ``bool`` with a ``param`` is text
            (``--flag true``: DVC passes ``${stage.flag}``), else a switch
            (``--flag/--no-flag``); ``int | None`` is text, ``INT|none``.
        default: the command line's default, as a value of ``type``; also the
            params.yaml default. ``...``: the option must be given.
        help: the ``--help`` text.
        argument: a positional argument, not an ``--option``.
        param: where the DVC command takes the value: True for the stage's own
            params section (and params.yaml gets the key), ``"section.key"`` for
            another stage's param, False for none (a fixed path or the default).
        comment: the comment beside the key in params.yaml.
        field: the config field it sets (``run.workers``: a field of the config's
            ``run``); None: the command uses it itself (an output path, progress).
            Empty: the same as ``name``.
        convert: turns the command-line value into the field's value; a
            ``ValueError`` it raises is a config error naming the option.
        hidden: left out of ``--help``: an option kept only so that a params.yaml
            written for an older release still runs (its command says where it went).
    """

    name: str
    type: Any = str
    default: Any = None
    help: str = ""
    argument: bool = False
    param: bool | str = False
    comment: str | None = None
    field: str | None = ""
    convert: Callable[[Any], Any] | None = None
    hidden: bool = False

    @property
    def flag(self) -> str:
        """How the command line spells it: ``--num-shards``."""
        return "--" + self.name.replace("_", "-")

    @property
    def target(self) -> str | None:
        """The config field it sets, or None."""
        return self.name if self.field == "" else self.field


def zero_is_none(value: int) -> int | None:
    """0 on the command line (a params.yaml integer) stands for None."""
    return value or None
