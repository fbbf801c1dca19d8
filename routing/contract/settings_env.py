"""keylane's settings and their ``KEYLANE_*`` environment variables: building
:class:`~keylane.routing.contract.settings.Settings` from the environment with each problem
named by its variable (:func:`load_settings`, :class:`InvalidSettings`), a setting's
variable (:func:`env_var`), and the variables that make a child process build the same
settings (:func:`settings_environ`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr, ValidationError

from .errors import ConfigError
from .settings import Settings


def settings_environ(settings: Settings) -> dict[str, str]:
    """``KEYLANE_*`` variables that make a child process build exactly ``settings``."""
    env: dict[str, str] = {}
    for name, field in type(settings).model_fields.items():
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, list):
            value = json.dumps([v.model_dump() if isinstance(v, BaseModel) else v for v in value])
        var = f"KEYLANE_{name.upper()}"
        if isinstance(field.validation_alias, AliasChoices):
            var = str(field.validation_alias.choices[0])
        env[var] = str(value)
    return env


def env_var(name: str) -> str:
    """The environment variable of the setting ``name``."""
    return f"KEYLANE_{name.upper()}"


class InvalidSettings(ConfigError):
    """Settings that cannot work: each problem names the setting's environment variable
    (``problems``: setting name or None for a rule across settings, and what is wrong),
    so a command line can name its option too (:meth:`describe`)."""

    def __init__(self, problems: list[tuple[str | None, str]]) -> None:
        self.problems = problems
        super().__init__(self.describe({}))

    def describe(self, flags: Mapping[str, str]) -> str:
        """The message, naming each setting by its option in ``flags`` (setting name ->
        ``--option``) and its environment variable."""
        lines = []
        for field, text in self.problems:
            if field is None:
                lines.append(text)
                continue
            flag = flags.get(field)
            lines.append(f"{f'{flag} / ' if flag else ''}{env_var(field)}: {text}")
        return "invalid settings: " + "; ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment, with explicit overrides (e.g. CLI flags);
    :class:`InvalidSettings` says what is wrong, by environment variable."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        raise InvalidSettings([_problem(error) for error in exc.errors()]) from None
    except ValueError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


#: What a person reads for pydantic's error types.
_PLAIN = {
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "greater_than": "must be more than {gt}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "literal_error": "must be {expected}",
}


def _problem(error: Any) -> tuple[str | None, str]:
    """One pydantic error as (setting name, what is wrong, with the value given unless
    the setting is a secret)."""
    loc = error.get("loc") or ()
    field = str(loc[0]) if loc and str(loc[0]) in Settings.model_fields else None
    template = _PLAIN.get(error.get("type", ""))
    context = error.get("ctx") or {}
    try:
        text = template.format(**context) if template else str(error.get("msg", ""))
    except (KeyError, IndexError):
        text = str(error.get("msg", ""))
    text = text.removeprefix("Value error, ")
    secret = field is not None and "Secret" in str(Settings.model_fields[field].annotation)
    if field is not None and not secret and "input" in error:
        text += f" (got {error['input']!r})"
    return field, text
