"""Plain metavars in ``--help``: ``--shape TEXT``, ``--max-jobs INTEGER``, ``tune KERNEL``.

Typer 0.29 labels values by their Python annotation (``<str>``, ``<list[str]>``, ``<bool>`` on a
flag and on ``--help``) and a required argument as ``{kernel}``. :func:`plain_metavars` gives every
parameter that names no metavar of its own click's plain one, once, on the built command tree
(Typer vendors its own click, so parameters are recognised by their attributes).
"""

from __future__ import annotations

from typing import Any

_LABELS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": "BOOLEAN", "Path": "PATH"}


def _label(param: Any) -> str:
    """TEXT, INTEGER, NUMBER, PATH or the choices, from the parameter's annotation."""
    bare = str(param.bare_type()) if hasattr(param, "bare_type") else "str"
    inner = bare.removeprefix("list[").removesuffix("]")
    choices = getattr(getattr(param, "type_descriptor", None), "choices", None)
    if choices:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in choices) + "]"
    return _LABELS.get(inner, "TEXT" if "str" in inner else inner.upper())


def _plain(param: Any) -> None:
    if param.metavar is not None:
        return
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""
    elif param.param_type_name == "argument":
        name = (param.name or "arg").upper()
        param.metavar = name
        shown = name if param.required else f"[{name}]"
        label = _label(param)
        # the usage line: KERNEL, not {kernel}; the arguments table: TEXT, not <str> (attributes of
        # this one parameter object)
        param._usage_display_name = lambda: shown
        param.display_type_rich = lambda ctx: label
    else:
        param.metavar = _label(param)


def plain_metavars(command: Any) -> Any:
    """Set click-style metavars on ``command`` and every sub-command; returns ``command``."""
    help_option = command.get_help_option(command.context_class(command))  # built once, then cached
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        _plain(param)
    for sub in (getattr(command, "commands", None) or {}).values():
        plain_metavars(sub)
    return command
