"""Options declared once and shared by commands: a group is added to each command's signature and handed to it
parsed, as one typed argument, so a flag's name, type, range and parsing live in one place.

    RUN = OptionGroup(SHARED_OPTIONS, "run", lambda values, others: parse_run_options(values))

    @RUN.add(defaults={"device": "cpu"})
    def fleet(instances: int = typer.Option(2, "--instances"), *, run: RunOptions) -> None: ...

A command may give a shared option another default or help text (``defaults``, ``helps``) or leave some out
(``without``: they are parsed at their defaults); the flag itself stays the group's.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any


@dataclass(frozen=True)
class SharedOption:
    name: str  # the parameter's name (a settings field's, where the flag is named otherwise)
    annotation: Any
    default: Any
    option: Any  # the typer.Option declaration (flag, range, help)

    @property
    def flag(self) -> str:
        """The flag as ``--help`` shows it first, for one-line errors naming it."""
        return flag_name(self.option)


@dataclass(frozen=True)
class OptionGroup:
    options: tuple[SharedOption, ...]
    argument: str  # the command's keyword argument that receives the parsed group
    parse: Callable[[dict[str, Any], dict[str, Any]], Any]  # (the group's values, the command's others) -> parsed
    before_keywords: bool = False  # listed before the command's own keyword-only options (else after all of them)

    def __post_init__(self) -> None:
        names = [option.name for option in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"an option group declares a name twice: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)

    def default(self, name: str) -> Any:
        return next(option.default for option in self.options if option.name == name)

    def add(
        self,
        defaults: dict[str, Any] | None = None,
        helps: dict[str, str] | None = None,
        without: Iterable[str] = (),
        settings: type | None = None,
        panels: dict[str, str] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator adding the group's options to a command. ``settings``: the dataclass the command fills,
        whose field defaults become the options' defaults (declared there once); ``defaults`` and ``helps`` change
        an option's default or help text for this command only, ``panels`` the ``--help`` panel it shows in;
        ``without`` leaves options out (parsed at their defaults)."""
        defaults = {**(settings_defaults(settings, self.names) if settings else {}), **(defaults or {})}
        helps, panels, left_out = helps or {}, panels or {}, set(without)
        unknown = (set(defaults) | set(helps) | set(panels) | left_out) - set(self.names)
        if unknown:
            raise ValueError(f"no shared option named {', '.join(sorted(unknown))}")

        def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
            own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != self.argument]
            added = []
            for option in self.options:
                if option.name in left_out:
                    continue
                declared = copy.copy(option.option)
                if option.name in helps:
                    declared.help = helps[option.name]
                if option.name in panels:
                    declared.rich_help_panel = panels[option.name]
                added.append(
                    inspect.Parameter(
                        option.name,
                        inspect.Parameter.KEYWORD_ONLY,
                        default=defaults.get(option.name, option.default),
                        annotation=Annotated[option.annotation, declared],
                    )
                )

            @functools.wraps(command)
            def command_with_group(**values: Any) -> Any:
                group = {o.name: values.pop(o.name) if o.name not in left_out else o.default for o in self.options}
                return command(**values, **{self.argument: self.parse(group, values)})

            if self.before_keywords:
                keyword = [p for p in own if p.kind == inspect.Parameter.KEYWORD_ONLY]
                positional = [p for p in own if p.kind != inspect.Parameter.KEYWORD_ONLY]
                parameters = [*positional, *added, *keyword]
            else:
                parameters = [*own, *added]
            # inspect (and so typer) reads __signature__, which a function's declared type does not name
            command_with_group.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
            command_with_group.__annotations__ = {p.name: p.annotation for p in parameters}
            return command_with_group

        return decorate


def from_settings(settings: type | tuple[type, ...], declarations: Mapping[str, Any]) -> tuple[SharedOption, ...]:
    """Shared options, in ``declarations``' order, whose type and default are the settings dataclass's fields of
    the same names (declared there once); each declaration is the flag (``Flag.annotated(...)`` or a
    ``typer.Option``), or a whole :class:`SharedOption` where the settings hold the value in another form.
    Of several settings the first with a field of that name gives it (the command line's form ahead of the parsed
    one). The parameter is named as the field, whatever its flag (``request_timeout_s``: ``--request-timeout``)."""
    classes = settings if isinstance(settings, tuple) else (settings,)
    found: dict[str, tuple[Any, Any]] = {}  # a field's type and default by its name
    for one in classes:
        hints = typing.get_type_hints(one)
        for name, default in settings_defaults(one, declarations).items():
            found.setdefault(name, (hints[name], default))
    options = []
    for name, declared in declarations.items():
        if isinstance(declared, SharedOption):
            options.append(declared)
        elif name not in found:
            names = " or ".join(one.__name__ for one in classes)
            raise ValueError(f"{names} has no field {name!r} with a default for an option")
        else:
            options.append(SharedOption(name, *found[name], declared))
    return tuple(options)


def flag_name(option: Any) -> str:
    """The first flag a ``typer.Option`` declares (``Annotated`` style carries it as its default)."""
    names = [option.default, *(option.param_decls or ())]
    return next(name for name in names if isinstance(name, str) and name.startswith("-"))


def settings_defaults(settings: type, names: Iterable[str]) -> dict[str, Any]:
    """The defaults a settings dataclass gives the fields named like options (a field without one gives none)."""
    wanted = set(names)
    return {f.name: f.default for f in fields(settings) if f.name in wanted and f.default is not MISSING}
