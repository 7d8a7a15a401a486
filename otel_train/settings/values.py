"""Settings values: how each setting's raw value (an argument or an environment
variable's text) is checked and parsed, and the error a bad one raises.

Each parser takes ``(name, value)`` and returns the parsed value or raises
:class:`ConfigError` with the accepted values; ``Settings.resolve`` adds where the value
came from.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A setting has a value otel-train does not accept."""


def choice(*allowed: str) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else None
        if text not in allowed:
            raise ConfigError(f"must be one of {', '.join(repr(a) for a in allowed)}")
        return str(text)

    return parse


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise ConfigError("must be a boolean (true/false, 1/0, yes/no, on/off)")


def int_range(lo: int, hi: int) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        try:
            number = int(value.strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"must be an integer from {lo} to {hi}") from None
        if isinstance(value, float) and value != number:
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        if not lo <= number <= hi:
            raise ConfigError(f"must be an integer from {lo} to {hi}")
        return number

    return parse


def float_range(lo: float, hi: float) -> Callable[[str, Any], float]:
    def parse(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}")
        try:
            number = float(value.strip()) if isinstance(value, str) else float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}") from None
        if not lo <= number <= hi:  # also rejects NaN
            raise ConfigError(f"must be a number from {lo:g} to {hi:g}")
        return number

    return parse


def optional_float(lo: float, hi: float) -> Callable[[str, Any], float | None]:
    number = float_range(lo, hi)

    def parse(name: str, value: Any) -> float | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        return number(name, value)

    return parse


def seconds_or(*words: str, lo: float, hi: float) -> Callable[[str, Any], float | str]:
    """Seconds from ``lo`` to ``hi``, or one of ``words`` (as given, lowercased)."""
    number = float_range(lo, hi)

    def parse(name: str, value: Any) -> float | str:
        if isinstance(value, str) and value.strip().lower() in words:
            return value.strip().lower()
        try:
            return number(name, value)
        except ConfigError:
            shown_words = ", ".join(f"'{w}'" for w in words)
            raise ConfigError(f"must be {shown_words} or seconds from {lo:g} to {hi:g}") from None

    return parse


def optional_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError("must be a string")
    text = value.strip()
    if len(text) > 2048:
        raise ConfigError("must be at most 2048 characters")
    return text or None


def identifier(name: str, value: Any) -> str:
    text = optional_str(name, value)
    if text is None:
        raise ConfigError("must be a non-empty string")
    return text


_HOST = re.compile(r"[A-Za-z0-9._:%-]+")  # names, IPv4, IPv6 (with a zone): ASCII only


def host(name: str, value: Any) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not _HOST.fullmatch(text) or len(text) > 255:
        raise ConfigError("must be a host name or IP address, for example '127.0.0.1'")
    return text


def endpoint(name: str, value: Any) -> str | None:
    text = optional_str(name, value)
    if text is not None and not text.startswith(("http://", "https://")):
        raise ConfigError("must be a URL starting with http:// or https://")
    return text


MAX_PROFILE_STEPS = 1000


def _parse_range(value: Any) -> tuple[int, int] | None:
    if isinstance(value, str):
        first, sep, last = value.strip().partition("-")
        if not _digits(first) or (sep and not _digits(last)):
            return None
        a = int(first)
        return a, int(last) if sep else a
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


def _digits(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit()


def step_range(name: str, value: Any) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off")):
        return None
    steps = _parse_range(value)
    if steps is None or not 0 <= steps[0] <= steps[1] <= 10**12:
        raise ConfigError("must be a step range FIRST-LAST (e.g. '10-12'), one step, or 'off'")
    if steps[1] - steps[0] >= MAX_PROFILE_STEPS:
        raise ConfigError(f"must cover at most {MAX_PROFILE_STEPS} steps (e.g. '10-12')")
    return steps


def snapshot_mode(name: str, value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if text in ("off", "oom"):
        return str(text)
    steps = _parse_range(text) if isinstance(text, str) else None
    if steps is None or not 0 <= steps[0] <= steps[1] <= 10**12:
        raise ConfigError("must be 'off', 'oom' or a step range FIRST-LAST (e.g. '10-12')")
    return f"{steps[0]}-{steps[1]}"


def directory(name: str, value: Any) -> str:
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip() or len(text) > 4096 or "\0" in text:
        raise ConfigError("must be a directory path (a non-empty string)")
    return text.strip()


def run_directory(name: str, value: Any) -> str:
    """'off', or a directory path (run_dir)."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return "off"
    try:
        return directory(name, value)
    except ConfigError:
        raise ConfigError("must be 'off' or a directory path (a non-empty string)") from None


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
