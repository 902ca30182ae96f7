"""Assertion tests judged outside the program's process, so that a program cannot forge a pass.

A test such as ``assert add(2, 3) == 5`` is split (``split_assertion``) into

* probes: the parts that call into the program (``add(2, 3)``), the longest chain of calls,
  attributes and subscripts starting at a name the program defines;
* checks: the assertion with each probe replaced by a placeholder (``_rlvr_v0 == 5``).

The program runs with the probes appended (``probe_source``): after its own code, each probe is
evaluated and its value written to stdout, encoded as plain data (None, bool, int, float, complex,
str, bytes and lists, tuples, sets, dicts of them; the exact type, no subclass: ``encode_value``).
Anything else (an object with its own ``__eq__``, a generator) is not a value and fails the test.
The expected values never enter the program's process, not even as source text it could read.

A second sandboxed process that never runs program code, the judge (``judge_source``), decodes the
values and evaluates the checks, with the test's own imports. A program can only claim values for
its probes, and a claim passes only if it satisfies the assertion; tracing, frame tricks, markers
read from its own source or exit codes change nothing in the judge.

Supported test source: ``import`` statements and ``assert`` statements. A probe may not use a
variable bound inside the assertion (``all(f(x) == 2 * x for x in range(3))``): such a call would
have to be compared inside the program's process. Those tests, and any other statement, are
refused (``UnsupportedTest``) rather than judged in a forgeable way.
"""

from __future__ import annotations

import ast
import builtins
import sys

__all__ = ["UnsupportedTest", "SplitTest", "split_assertion", "probe_source", "judge_source", "parse_probe_line"]

PLACEHOLDER = "_rlvr_v"
_JUDGE_NAMES = frozenset(dir(builtins)) | frozenset(sys.stdlib_module_names)
_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class UnsupportedTest(ValueError):
    """A test that cannot be judged outside the program's process."""


class SplitTest:
    """One assertion test: its imports, the probes the program evaluates, the checks the judge evaluates."""

    def __init__(self, source: str, imports: list[str], probes: list[str], checks: list[str]) -> None:
        self.source, self.imports, self.probes, self.checks = source, imports, probes, checks


def _bound_names(scope: ast.AST) -> set[str]:
    """Names a lambda or comprehension binds for its body."""
    if isinstance(scope, ast.Lambda):
        a = scope.args
        return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]}
    return {n.id for gen in scope.generators for n in ast.walk(gen.target) if isinstance(n, ast.Name)}


class _Splitter(ast.NodeTransformer):
    """Replaces every program-rooted chain by a placeholder name, collecting the chains."""

    def __init__(self, judge_names: set[str], probes: list[str]) -> None:
        self.judge_names = judge_names
        self.probes = probes
        self.bound: list[set[str]] = []

    def _root(self, node: ast.AST) -> ast.Name | None:
        while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node if isinstance(node, ast.Name) else None

    def _is_program(self, node: ast.AST) -> bool:
        root = self._root(node)
        return root is not None and root.id not in self.judge_names and not any(root.id in b for b in self.bound)

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, _SCOPES):
            self.bound.append(_bound_names(node))
            try:
                return self.generic_visit(node)
            finally:
                self.bound.pop()
        if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript, ast.Name)) and self._is_program(node):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if self.bound and used & set().union(*self.bound):
                raise UnsupportedTest(f"the call {ast.unparse(node)!r} uses a variable bound inside the assertion")
            self.probes.append(ast.unparse(node))
            return ast.copy_location(ast.Name(id=f"{PLACEHOLDER}{len(self.probes) - 1}", ctx=ast.Load()), node)
        return self.generic_visit(node)


def split_assertion(source: str) -> SplitTest:
    """Split one assertion test into imports, probes and checks (raises `UnsupportedTest`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise UnsupportedTest(f"the test is not valid Python: {error.msg}") from None
    imports: list[str] = []
    judge_names = set(_JUDGE_NAMES)
    asserts: list[ast.Assert] = []
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(statement))
            judge_names |= {(a.asname or a.name).split(".")[0] for a in statement.names}
        elif isinstance(statement, ast.Assert):
            asserts.append(statement)
        else:
            raise UnsupportedTest(f"only import and assert statements can be judged, got {type(statement).__name__}")
    if not asserts:
        raise UnsupportedTest("the test has no assert statement")
    if any(isinstance(n, ast.Name) and n.id.startswith("_rlvr_") for n in ast.walk(tree)):
        raise UnsupportedTest("names starting with _rlvr_ are reserved for the harness")
    probes: list[str] = []
    splitter = _Splitter(judge_names, probes)
    checks = [ast.unparse(splitter.visit(statement.test)) for statement in asserts]
    return SplitTest(source, imports, probes, checks)


# ----------------------------------------------------------------------------- the program's side

# Appended to the program (runs in its process: it may tamper with this code, which only changes
# the values it claims). Types are checked exactly; ints and floats travel as hex (exact, no size limit).
_ENCODE = """
def _rlvr_encode(x, depth=0):
    if depth > 100:
        raise ValueError("nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return {"i": hex(x)}
    if t is float:
        return {"f": x.hex()}
    if t is complex:
        return {"c": [x.real.hex(), x.imag.hex()]}
    if t is bytes:
        return {"b": x.hex()}
    if t in (list, tuple, set, frozenset):
        kind = {list: "l", tuple: "t", set: "s", frozenset: "z"}[t]
        return {kind: [_rlvr_encode(e, depth + 1) for e in x]}
    if t is dict:
        return {"d": [[_rlvr_encode(k, depth + 1), _rlvr_encode(v, depth + 1)] for k, v in x.items()]}
    raise TypeError("not a plain value: " + t.__name__)
"""


def probe_source(program: str, test: SplitTest, nonce: str) -> str:
    """The program, then its probes evaluated one by one; the last stdout line ``nonce + JSON`` holds the outcomes."""
    lines = [program, "", _ENCODE, "_rlvr_out = []"]
    for statement in test.imports:
        lines.append(f"try:\n    {statement}\nexcept BaseException:\n    pass")
    for probe in test.probes:
        lines.append(
            "try:\n"
            f"    _rlvr_out.append(['ok', _rlvr_encode({probe})])\n"
            "except BaseException as _rlvr_e:\n"
            "    _rlvr_out.append(['raised', type(_rlvr_e).__name__ + ': ' + str(_rlvr_e)[:200]])"
        )
    lines.append(f"__import__('sys').stdout.write('\\n{nonce}' + __import__('json').dumps(_rlvr_out) + '\\n')")
    return "\n".join(lines) + "\n"


def parse_probe_line(stdout: str, nonce: str) -> str | None:
    """The JSON text of the outcomes (not parsed here: only the judge reads it), or None."""
    at = stdout.rfind("\n" + nonce)
    if at < 0:
        return None
    line = stdout[at + 1 + len(nonce) :]
    return line.split("\n", 1)[0]


# ----------------------------------------------------------------------------- the judge's side

_JUDGE = '''
import json, sys

def _decode(x):
    if x is None or type(x) in (bool, str):
        return x
    (kind, v), = x.items()
    if kind == "i":
        return int(v, 16)
    if kind == "f":
        return float.fromhex(v)
    if kind == "c":
        return complex(float.fromhex(v[0]), float.fromhex(v[1]))
    if kind == "b":
        return bytes.fromhex(v)
    if kind == "d":
        return {_decode(k): _decode(e) for k, e in v}
    return {"l": list, "t": tuple, "s": set, "z": frozenset}[kind](_decode(e) for e in v)

def _judge(imports, checks, outcomes):
    """(passed, reason) of one test."""
    try:
        outcomes = json.loads(outcomes)
        values = {}
        for i, (status, value) in enumerate(outcomes):
            if status != "ok":
                return False, "probe %d raised %s" % (i, value)
            values["_rlvr_v%d" % i] = _decode(value)
    except BaseException as e:
        return False, "unreadable values (%s: %s)" % (type(e).__name__, str(e)[:200])
    scope = dict(values)
    try:
        for statement in imports:
            exec(statement, scope)
        for check in checks:
            for name in compile(check, "<test>", "eval").co_names:  # a module the assertion names without importing it
                if name not in scope and name in sys.stdlib_module_names:
                    scope[name] = __import__(name)
            if not eval(check, scope):
                return False, "AssertionError"
    except BaseException as e:
        return False, "%s: %s" % (type(e).__name__, str(e)[:200])
    return True, None

tests = json.loads(sys.stdin.read())
verdicts = [_judge(*test) for test in tests]
sys.stdout.write("\\n" + json.dumps(verdicts) + "\\n")
'''


def judge_source() -> str:
    """The judge program.

    It reads ``[[imports, checks, outcomes JSON], ...]`` on stdin and prints ``[[passed, reason], ...]``."""
    return _JUDGE
