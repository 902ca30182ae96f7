"""A griffe extension for the API reference (mkdocs.yml): the help each option declares beside it,
`Annotated[T, Option("help", domain)]` (`rlvr_lightning/runtime/option_declarations.py`), read from the source
and added to the `Args:` of its class, as `documented_options` does at import for `--help`."""

from __future__ import annotations

import ast

import griffe


def _option_help(annotation: ast.expr | None) -> str | None:
    """The help of an `Annotated[..., Option("help", ...)]` annotation, else None."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "Annotated"):
        return None
    items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    for item in items[1:]:
        if isinstance(item, ast.Call) and getattr(item.func, "id", None) == "Option" and item.args:
            help_text = item.args[0]
            if isinstance(help_text, ast.Constant) and isinstance(help_text.value, str):
                return help_text.value
    return None


def _declared(node: ast.ClassDef) -> list[tuple[str, str]]:
    """(name, help) of the options `node` declares: its annotated fields, and its `__init__`'s arguments."""
    found = []
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if (text := _option_help(statement.annotation)) is not None:
                found.append((statement.target.id, text))
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            for argument in [*statement.args.args, *statement.args.kwonlyargs]:
                if (text := _option_help(argument.annotation)) is not None:
                    found.append((argument.arg, text))
    return found


class OptionHelp(griffe.Extension):
    def on_class_instance(self, *, node: ast.AST | griffe.ObjectNode, cls: griffe.Class, **kwargs) -> None:
        if not isinstance(node, ast.ClassDef) or not (options := _declared(node)):
            return
        lines = ["Args:", *(f"    {name}: {text}" for name, text in options)]
        text = cls.docstring.value if cls.docstring else ""
        cls.docstring = griffe.Docstring("\n\n".join(part for part in (text, "\n".join(lines)) if part), parent=cls)
