"""Write the command-line flags Megatron-LM's parser accepts (megatron/training/arguments.py), for the test that
checks `lynx export --to megatron` against them: `python scripts/megatron_flags.py MEGATRON_CHECKOUT > FILE`.

Megatron-LM needs Python >= 3.12 and its own dependencies to run its parser; this reads its source instead: every
literal `add_argument('--flag', ...)` of arguments.py, and every field of the config dataclasses it turns into
flags with `ArgumentGroupFactory(Config, exclude=[...])` (`--field-name`, and `--no-field-name` for a bool that
defaults to True), fields of their base classes included.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _classes(root: Path) -> dict[str, ast.ClassDef]:
    found: dict[str, ast.ClassDef] = {}
    for path in sorted((root / "megatron").rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and "config" in node.name.lower():
                found.setdefault(node.name, node)
    return found


def _fields(name: str, classes: dict[str, ast.ClassDef]) -> dict[str, ast.expr | None]:
    cls = classes.get(name)
    if cls is None:
        return {}
    out: dict[str, ast.expr | None] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            out |= _fields(base.id, classes)
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out[stmt.target.id] = stmt.value
    return out


def flags(root: Path) -> set[str]:
    source = (root / "megatron/training/arguments.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    classes = _classes(root)
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
        if isinstance(func, ast.Name) and func.id == "ArgumentGroupFactory" and node.args:
            cls = node.args[0]
            if not isinstance(cls, ast.Name):
                continue
            exclude: set[str] = set()
            for kw in node.keywords:
                if kw.arg == "exclude" and isinstance(kw.value, ast.List):
                    exclude = {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
                elif kw.arg == "exclude" and isinstance(kw.value, ast.Name):
                    exclude = _assigned_list(tree, kw.value.id)
            for field, default in _fields(cls.id, classes).items():
                if field in exclude or field.startswith("_"):
                    continue
                out.add("--" + field.replace("_", "-"))
                if isinstance(default, ast.Constant) and default.value is True:
                    out.add("--no-" + field.replace("_", "-"))
    return out


def _assigned_list(tree: ast.Module, name: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.List):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


if __name__ == "__main__":
    root = Path(sys.argv[1])
    print("\n".join(sorted(flags(root))))
