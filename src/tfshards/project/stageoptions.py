"""A stage's options (:class:`tfshards.option.Option`) as a typer command, a DVC command, params.

The one place where the text DVC renders into a command (``${write.seed}``,
``${validate.fail_on_leakage}`` as ``true``/``True``/``false``,
``${train.split_seed}`` as ``None``) becomes values: :func:`parse_bool` and
:func:`optional_int`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

import typer

from tfshards.errors import ConfigError
from tfshards.option import Option

C = TypeVar("C")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("", "none", "null")
PARAMS = "params.yaml"  # DVC's default params file, beside dvc.yaml


def parse_bool(value: str, option: str) -> bool:
    """``true``/``false`` (and yes/no, on/off, 1/0, any case): DVC's ``${section.flag}``."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise typer.BadParameter(f"expected true or false, got {value!r}", param_hint=option)


def optional_int(value: str, option: str) -> int | None:
    """An ``INT|none`` option's value: None for ``none``/``null``/empty (DVC's ``None``)."""
    if value.strip().lower() in _NONE:
        return None
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected an integer or none, got {value!r}", param_hint=option
        ) from None


def parse_pairs(args: Sequence[str], option: str) -> dict[str, Any]:
    """``--name value`` words (DVC's rendering of a params mapping after ``--``) as a dict.

    A value is read as JSON when it is JSON (``3``, ``0.5``, ``true``), else
    kept as text; ``--name`` alone is ``True``; several values make a list.
    """
    out: dict[str, Any] = {}
    name = None
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            name = arg[2:].replace("-", "_")
            out[name] = True
        elif name is None:
            raise typer.BadParameter(
                f"expected --name value pairs after --, got {arg!r}", param_hint=option
            )
        else:
            value = _scalar(arg)
            current = out[name]
            out[name] = value if current is True else [*_listed(current), value]
    return out


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ----------------------------------------------------------------------------- typer


def _text(option: Option, unpacked: bool = False) -> str | None:
    """The metavar of an option given as text (DVC interpolates a value), else None.

    In a stage whose section DVC unpacks (``unpacked``), a ``bool`` param is a
    switch: DVC writes ``--flag`` for true and nothing for false.
    """
    if option.type is bool and option.param and not unpacked:
        return "BOOL"
    return "INT|none" if option.type == int | None else None


def _parameter(option: Option, unpacked: bool) -> inspect.Parameter:
    """``option`` as a typer-annotated keyword parameter."""
    kind = inspect.Parameter.KEYWORD_ONLY
    if option.argument:
        info: Any = typer.Argument(help=option.help)
        return inspect.Parameter(option.name, kind, annotation=Annotated[option.type, info])
    metavar = _text(option, unpacked)
    if metavar is None:
        info = typer.Option(help=option.help, hidden=option.hidden)
        return inspect.Parameter(
            option.name, kind, default=option.default, annotation=Annotated[option.type, info]
        )
    default = option.default
    shown = "none" if default is None else str(default).lower() if metavar == "BOOL" else default
    info = typer.Option(metavar=metavar, help=option.help)
    return inspect.Parameter(option.name, kind, default=shown, annotation=Annotated[str, info])


def _value(option: Option, given: Any, unpacked: bool) -> Any:
    """A parsed command-line value: text options through the one parser of each kind."""
    metavar = _text(option, unpacked)
    if metavar == "BOOL":
        return parse_bool(given, option.flag)
    if metavar == "INT|none":
        return optional_int(given, option.flag)
    return given


def command(
    options: Sequence[Option],
    body: Callable[[dict[str, Any]], None],
    *,
    name: str,
    doc: str,
    unpacked: bool = False,
    section: str | None = None,
) -> Callable[..., None]:
    """A function typer reads as a command with ``options``; it calls ``body`` with the values.

    ``section``: the stage's params section, checked first (:func:`stray_param`).

    The values are parsed (:func:`parse_bool`, :func:`optional_int`) and keyed by
    option name; an option whose default is a mapping takes the words after ``--``
    (:func:`parse_pairs`; the command needs ``allow_extra_args``). ``unpacked``:
    the stage's DVC command passes its section as ``${section}``
    (:func:`dvc_command`), so a ``bool`` param is a switch.
    """
    # A mapping option takes the words after `--` (its DVC command puts it last).
    mappings = [o for o in options if isinstance(o.default, Mapping)]
    assert len(mappings) <= 1, "one option at most takes the words after --"
    after = mappings[0] if mappings else None
    parameters = [_parameter(o, unpacked) for o in options if o is not after]
    if after is not None:
        context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        parameters.insert(0, context)

    def run(**given: Any) -> None:
        ctx = given.pop("ctx", None)
        stray = stray_param(section, options) if section is not None else None
        if stray:
            typer.echo(f"warning: {stray}", err=True)
        values = {o.name: _value(o, given[o.name], unpacked) for o in options if o is not after}
        if after is not None:
            values[after.name] = parse_pairs(ctx.args, after.flag)
        body(values)

    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


def stray_param(section: str, options: Sequence[Option], path: str = PARAMS) -> str | None:
    """One line naming a key of ``section`` in the project's ``params.yaml`` (in the
    working directory, where DVC runs a stage) that no option of the stage has, with the
    closest option; None when every key is one. A misspelt key reaches no command, so the
    run goes on with the default: the line says so. Not a refusal: a section may also
    hold a user's own keys (``tfshards init`` merges into an existing ``train:``).
    """
    known = [o.name for o in options]
    stray = [key for key in _section_keys(path, section) if key not in known]
    if not stray:
        return None
    guesses = []
    for key in stray:
        close = difflib.get_close_matches(key, known, n=1)
        guesses += [f"{key} -> {close[0]}"] if close else []
    hint = f"; did you mean {', '.join(guesses)}?" if guesses else ""
    keys = ", ".join(f"{section}.{key}" for key in stray)
    what, it = ("is no option", "it") if len(stray) == 1 else ("are no options", "them")
    return f"{path}: {keys} {what} of `tfshards {section}`, so no command reads {it}{hint}"


def _section_keys(path: str, section: str) -> list[str]:
    """The keys of ``section`` in the YAML file at ``path``, as written ([] when the file
    or the section is absent or not readable: DVC itself says what is wrong with it).
    A merge key (``<<: *defaults``) stands for the keys it merges."""
    from tfshards.project import plainyaml

    doc = plainyaml.read(path)
    block = doc.get(section) if isinstance(doc, dict) else None
    return _keys(block) if isinstance(block, dict) else []


def _keys(block: dict[Any, Any]) -> list[str]:
    keys: list[str] = []
    for key, value in block.items():
        merged = value if key == "<<" else {key: None}
        for part in merged if isinstance(merged, list) else [merged]:
            if isinstance(part, dict):
                keys += [str(k) for k in part if str(k) not in keys]
    return keys


def config(cls: type[C], options: Sequence[Option], values: Mapping[str, Any], **extra: Any) -> C:
    """``cls`` made from the parsed ``values`` of the options that name a field, and ``extra``.

    A field ``run.workers`` sets ``workers`` of the ``run`` field's class.
    """
    fields: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for option in options:
        target = option.target
        if target is None:
            continue
        value = values[option.name]
        if option.convert is not None:
            try:
                value = option.convert(value)
            except ValueError as exc:
                raise ConfigError(f"{option.flag}: {exc}", option=option.name) from None
        head, _, tail = target.partition(".")
        if tail:
            nested.setdefault(head, {})[tail] = value
        else:
            fields[head] = value
    for head, parts in nested.items():
        fields[head] = dataclasses.replace(_default(cls, head), **parts)
    return cls(**fields, **extra)


def _default(cls: Any, name: str) -> Any:
    """The default value of dataclass ``cls``'s field ``name`` (a nested options value).

    Read from the field itself: ``typing.get_type_hints`` on a config with
    ``InitVar`` fields raises on Python 3.10.
    """
    (found,) = (f for f in dataclasses.fields(cls) if f.name == name)
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


# ----------------------------------------------------------------------------- DVC


def dvc_command(
    program: str,
    section: str,
    options: Sequence[Option],
    paths: Mapping[str, str],
    *,
    unpack: bool = False,
) -> str:
    """The stage's ``cmd``: ``program``, then each option DVC sets, in ``options`` order.

    An option in ``paths`` gets that fixed path; a param gets ``${section.key}``
    (an argument param the bare ``${section.key}``)
    (a mapping param goes last, after ``--``, for DVC to unpack into ``--key value``
    words). With ``unpack`` the stage's own params are all passed as ``${section}``:
    DVC unpacks it into ``--key value`` words, each through ``shlex.quote``.
    """
    words, last = [program], []
    for o in options:
        if o.name in paths:
            words.append(paths[o.name] if o.argument else f"{o.flag} {paths[o.name]}")
        elif isinstance(o.param, str):
            words.append(f"{o.flag} ${{{o.param}}}")
        elif o.param and not unpack:
            if o.argument:
                words.append(f"${{{section}.{o.name}}}")
            elif isinstance(o.default, Mapping):
                last.append(f"-- ${{{section}.{o.name}}}")
            else:
                words.append(f"{o.flag} ${{{section}.{o.name}}}")
    if unpack:
        words.append(f"${{{section}}}")
    return " ".join(words + last)


def params(options: Sequence[Option], values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The stage's params section: its own params' defaults, or ``values`` where given."""
    given = values or {}
    return {o.name: _param(given.get(o.name, o.default)) for o in options if o.param is True}


def comments(options: Sequence[Option]) -> dict[str, str]:
    """The comment beside each key of the stage's params section."""
    return {o.name: o.comment for o in options if o.param is True and o.comment}


def _param(value: Any) -> Any:
    """A default as params.yaml holds it (a tuple: ``none`` or ``flip,crop``)."""
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return dict(value) if isinstance(value, Mapping) else value
