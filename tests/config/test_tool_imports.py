"""``tools.imports``: tools named by import path, and the errors that name the entry."""

from __future__ import annotations

import pytest

from langchain_ascend.config import ConfigError, load_config, read_config
from langchain_ascend.config.tool_imports import import_tools, split_path


def test_split_path_takes_colon_or_last_dot():
    assert split_path("a.b:c") == ("a.b", "c")
    assert split_path("a.b.c") == ("a.b", "c")


def test_imports_tools_and_functions():
    tools = import_tools(["json:dumps"])
    assert [t.name for t in tools] == ["dumps"]


@pytest.mark.parametrize("path,fragment", [
    ("no_such_module_xyz:tool", "cannot import module"),
    ("json:no_such_name", "has no 'no_such_name'"),
    ("json:JSONDecodeError", "not a tool or a function"),
])
def test_bad_import_names_the_entry(path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config({"tools": {"imports": ["json:dumps", path]}})
    assert "tools.imports[1]" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("imports", [["not a path"], [], "json:dumps"])
def test_malformed_imports_are_refused(imports):
    with pytest.raises(ConfigError) as info:
        read_config({"tools": {"imports": imports}})
    assert "tools.imports" in str(info.value)


def test_imports_count_as_the_tools_section_tools():
    parts = load_config({"tools": {"imports": ["json:dumps"], "timeout_ms": 100}})
    assert [t.name for t in parts.tools] == ["dumps"]
    assert parts.tool_executor is not None
