"""Reading a config (YAML file or dict) into a validated :class:`AgentConfig`, and the errors.

Every problem becomes one :class:`ConfigIssue` naming the key's dotted path, the file and line
(taken from the YAML node marks), what is wrong and what is allowed; all issues of a file are
reported together in one :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from langchain_ascend.config.schema import (
    AgentConfig,
    Section,
    known_paths,
    refusal_of,
    section_class,
)
from langchain_ascend.errors import LangChainAscendError

Source = str | os.PathLike[str] | dict[str, Any]
KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config.

    Attributes:
        path: Dotted key path (``"npu.memory.max_host_memry_mb"``; ``""`` for the whole file).
        message: What is wrong and what is allowed.
        file: The YAML file, or None for a dict config.
        line: 1-based line of the key in the file, when known.
    """

    path: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or "config"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.path or '<top level>'}: {self.message}"


class ConfigError(LangChainAscendError, ValueError):
    """The config file is missing, not YAML, not a mapping, or has unknown, misspelt,
    unsupported or badly valued keys. ``issues`` lists each problem (path, message, file,
    line); the message holds them all, one per line."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        if len(issues) == 1:
            text = str(issues[0])
        else:
            text = f"{len(issues)} problems in the config:\n" + "\n".join(
                f"  {issue}" for issue in issues)
        super().__init__(text)

    @classmethod
    def one(cls, message: str, *, path: str = "", file: str | None = None,
            line: int | None = None) -> ConfigError:
        """An error with a single issue."""
        return cls([ConfigIssue(path=path, message=message, file=file, line=line)])


@dataclass(frozen=True)
class RawConfig:
    """A parsed but not yet validated config: the data, where it came from, key lines."""

    data: Any
    file: str | None
    base_dir: Path | None
    lines: dict[KeyPath, int]


def read_raw(source: Source) -> RawConfig:
    """Parse ``source`` (a YAML path or a dict) without validating it.

    Raises:
        ConfigError: Missing file, unreadable file, invalid YAML, or a key given twice.
    """
    if isinstance(source, dict):
        return RawConfig(data=source, file=None, base_dir=None, lines={})
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError.one(
            f"the config must be a path to a YAML file or a dict, got {type(source).__name__}")
    path = Path(source)
    file = str(path)
    if not path.is_file():
        raise ConfigError.one("config file not found", file=file)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.one(f"cannot read the config file: {exc}", file=file) from exc
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError.one(f"not valid YAML: {problem}", file=file,
                              line=mark.line + 1 if mark else None) from exc
    except yaml.YAMLError as exc:
        raise ConfigError.one(f"not valid YAML: {exc}", file=file) from exc
    finally:
        loader.dispose()
    lines: dict[KeyPath, int] = {}
    duplicates: list[ConfigIssue] = []
    if node is not None:
        _index_lines(node, (), lines, duplicates, file)
    if duplicates:
        raise ConfigError(duplicates)
    return RawConfig(data=data, file=file, base_dir=path.resolve().parent, lines=lines)


def _index_lines(node: Any, path: KeyPath, lines: dict[KeyPath, int],
                 duplicates: list[ConfigIssue], file: str) -> None:
    """Record the line of every key (and list item) under ``node``; note keys given twice
    (YAML would silently keep the last)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = (*path, key)
            line = key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(ConfigIssue(
                    path=_dotted(child), file=file, line=line,
                    message="key given twice (YAML would silently keep the last one)"))
            seen.add(key)
            lines.setdefault(child, line)
            _index_lines(value_node, child, lines, duplicates, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _index_lines(item, (*path, i), lines, duplicates, file)


def _dotted(path: KeyPath) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")


def validate(raw: RawConfig) -> AgentConfig:
    """Validate parsed data against the schema.

    Raises:
        ConfigError: Not a mapping, or any key unknown, refused or badly valued (all listed).
    """
    if not isinstance(raw.data, dict):
        sections = ", ".join(AgentConfig.model_fields)
        raise ConfigError.one(
            f"the config must be a mapping of sections ({sections}), got "
            f"{type(raw.data).__name__}", file=raw.file, line=1 if raw.file else None)
    try:
        return AgentConfig.model_validate(raw.data)
    except ValidationError as exc:
        raise ConfigError(issues_of(exc, raw)) from None


def issues_of(exc: ValidationError, raw: RawConfig) -> list[ConfigIssue]:
    """One issue per key path; union alternatives of one key are merged."""
    merged: dict[KeyPath, list[str]] = {}
    for error in exc.errors(include_url=False):
        path, message = _describe(error)
        messages = merged.setdefault(path, [])
        if message not in messages:
            messages.append(message)
    issues = []
    for path, messages in merged.items():
        issues.append(ConfigIssue(path=_dotted(path), message="; or ".join(messages),
                                  file=raw.file, line=_line_of(path, raw.lines)))
    return issues


def _line_of(path: KeyPath, lines: dict[KeyPath, int]) -> int | None:
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _describe(error: Any) -> tuple[KeyPath, str]:
    """The key path an error belongs to (union branch names cut off) and a message."""
    loc: tuple[str | int, ...] = tuple(error["loc"])
    cls: type[Section] | None = AgentConfig
    path: list[str | int] = []
    for part in loc:
        if cls is None or not isinstance(part, str) or part not in cls.model_fields:
            if isinstance(part, int) or error["type"] == "extra_forbidden":
                path.append(part)
            break
        path.append(part)
        cls = section_class(cls.model_fields[part].annotation)
    if error["type"] == "extra_forbidden":
        parent = tuple(path[:-1])
        return tuple(path), _unknown_key(str(path[-1]), _section_at(parent), parent)
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        allowed = ", ".join(cls.model_fields) if cls is not None else ""
        message = (f"must be a mapping of keys ({allowed}), got "
                   f"{type(error['input']).__name__}")
    elif error["type"] != "value_error":
        message = f"{message}, got {error['input']!r}"
    return tuple(path), message


def _section_at(path: tuple[str | int, ...]) -> type[Section]:
    cls: type[Section] = AgentConfig
    for part in path:
        sub = section_class(cls.model_fields[str(part)].annotation)
        if sub is None:
            break
        cls = sub
    return cls


def _unknown_key(key: str, cls: type[Section], parent: tuple[str | int, ...]) -> str:
    """``unknown key``, a close known key (difflib), the keys allowed there, and the section
    a key of that name belongs to when it was put in the wrong one."""
    allowed = list(cls.model_fields)
    message = "unknown key"
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {close[0]!r}?"
        reason = refusal_of(cls, close[0])
        if reason:
            message += " (that key is recognised but not supported either)"
    else:
        prefix = ".".join(str(p) for p in parent)
        elsewhere = [p for p in known_paths() if p.rsplit(".", 1)[-1] == key
                     and p.rsplit(".", 1)[0] != prefix]
        if elsewhere:
            message += f"; {key!r} belongs at {' or '.join(elsewhere)}"
    return f"{message}; allowed here: {', '.join(allowed)}"
