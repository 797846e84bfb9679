"""Docs that must stay true: the kbench.api table, the case keys of every op, the Records example, shell completion."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from click.testing import CliRunner

import kbench.api as api
from kbench.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DOC = ROOT / "docs" / "writing-a-plugin.md"

_spec = importlib.util.spec_from_file_location("case_keys", ROOT / "scripts" / "case_keys.py")
case_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(case_keys)


def _api_table_names() -> list[str]:
    text = PLUGIN_DOC.read_text(encoding="utf-8")
    start = text.index("| group | names in `kbench.api` |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    return [name for row in rows for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row.split("|")[2])]


def test_the_api_table_names_every_stable_name_once():
    names = _api_table_names()
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert sorted(names) == sorted(api.SURFACE)


def test_the_records_example_uses_only_the_api_and_runs(tmp_path):
    text = PLUGIN_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Records"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 9)]
    imports = re.findall(r"^\s*(?:from (\S+) import|import (\S+))", code, re.M)
    assert imports and all((a or b) in ("kbench", "kbench.api") for a, b in imports), imports
    committed = ROOT / "results" / "cpu-amd-epyc-2c" / "decode-cpu.json"
    code = code.replace('"results/m/attention-....json"', repr(str(committed)))
    printed = []
    exec(compile(code, "writing-a-plugin.md", "exec"), {"print": lambda *a: printed.append(a)})
    assert printed and all(len(p) >= 2 for p in printed)


def test_the_case_key_tables_of_docs_suites_are_the_ops_parameters():
    from kbench.plugins import PluginManager

    registry = PluginManager(load_entry_points=False).registry
    text = (ROOT / "docs" / "suites.md").read_text(encoding="utf-8")
    assert case_keys.current_block(text) == case_keys.generated_block(registry), \
        "docs/suites.md is out of date: python scripts/case_keys.py --write"
    # every key a suite may use is in the table of its op, and every op has a table
    for op in registry.ops.values():
        table = case_keys.op_table(op)
        for key in [p.name for p in op.parameters] + list(op.aliases) + list(op.list_params):
            assert f"| `{key}` |" in table, (op.name, key)
        assert f"#### `{op.name}`" in text


def test_shell_completion_as_the_readme_says():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'eval "$(_KBENCH_COMPLETE=bash_source kbench)"' in readme
    script = CliRunner().invoke(cli, [], prog_name="kbench", env={"_KBENCH_COMPLETE": "bash_source"})
    assert "_kbench_completion" in script.output and "complete -o nosort -F _kbench_completion kbench" in script.output
    done = CliRunner().invoke(cli, [], prog_name="kbench",
                              env={"_KBENCH_COMPLETE": "bash_complete", "COMP_WORDS": "kbench sh", "COMP_CWORD": "1"})
    assert done.output.split() == ["plain,show"]
    fmt = CliRunner().invoke(cli, [], prog_name="kbench",
                             env={"_KBENCH_COMPLETE": "bash_complete", "COMP_WORDS": "kbench show r.json --format c",
                                  "COMP_CWORD": "4"})
    assert fmt.output.split() == ["plain,csv"]


#: projects whose own trackers code may cite by number (an upstream bug is a fact a reader can look up)
UPSTREAM_TRACKERS = ("triton", "kernelbench", "pytorch", "torch", "numpy", "cupy", "litellm", "ray")


def test_code_names_behaviours_not_this_projects_tracker_numbers():
    """A reader of the code has no access to this project's tracker: comments, docstrings and test names say what
    the behaviour is, never which internal issue asked for it. Upstream trackers (``triton issue 11584``) stay."""
    found = []
    for folder in ("kbench", "tests", "plugins", "benchmarks", "scripts", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in re.finditer(r"(\w+)?\s*\(?\bissues? #?\d+", text, re.I):
                if (m.group(1) or "").lower() not in UPSTREAM_TRACKERS:
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not found, "name the behaviour instead of the tracker number:\n" + "\n".join(found)
