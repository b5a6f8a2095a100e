"""The package's layering, read from its source with ``ast`` (imports inside functions included):

  tools (fuser/tools/, and python -m fuser)  ->  torch integration  ->  core  ->  fuser._C

Imports run only downward (each module is placed in a layer below; a new module must be placed), the
import graph has no cycle, no module uses another module's private (``_name``) names, and ``import
fuser`` does not load the tools."""
import ast
import os
import pathlib
import subprocess
import sys

import fuser

PACKAGE = pathlib.Path(fuser.__file__).resolve().parent

#: Layer of every module of the package, lowest first; a module may import its own layer and those below.
LAYERS = {
    "core": {"fuser._C", "fuser._env", "fuser.interop", "fuser.jit", "fuser.ops", "fuser.planner",
             "fuser.reference", "fuser.route", "fuser.runtime", "fuser.store", "fuser.svg", "fuser.target",
             "fuser.fp8"},
    "torch integration": {"fuser", "fuser.backend", "fuser.custom_op", "fuser.ffn_spec", "fuser.module",
                          "fuser.optimize", "fuser.recognize", "fuser.structure"},
    "tools": {"fuser.__main__", "fuser.tools"},   # and every module under fuser/tools/
}
ORDER = ("core", "torch integration", "tools")


def modules(root=PACKAGE):
    """name -> path of every Python module of the package under `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(("fuser",) + parts)
        out[name.removesuffix(".__init__")] = path
    return out


def layer(name):
    if name.startswith("fuser.tools."):
        return "tools"
    return next((k for k, names in LAYERS.items() if name in names), None)


def _is_module(name, known):
    return name in known or name == "fuser._C"


class Imports(ast.NodeVisitor):
    """The fuser modules one module imports, and the private names it takes from them."""

    def __init__(self, name, is_package, known):
        self.name, self.known = name, known
        self.package = name if is_package else name.rpartition(".")[0]
        self.edges = set()
        self.private = []      # (line, text)
        self.bound = {}        # local name -> module it stands for

    def _absolute(self, node):
        if not node.level:
            return node.module or ""
        base = self.package.split(".")
        base = base[:len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] != "fuser":
                continue
            self.edges.add(alias.name)
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                self.bound["fuser"] = "fuser"

    def visit_ImportFrom(self, node):
        source = self._absolute(node)
        if source.split(".")[0] != "fuser":
            return
        for alias in node.names:
            target = f"{source}.{alias.name}"
            if _is_module(target, self.known):
                self.edges.add(target)
                self.bound[alias.asname or alias.name] = target
                continue
            self.edges.add(source)
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                self.private.append((node.lineno, f"from {source} import {alias.name}"))

    def visit_Attribute(self, node):
        chain, inner = [], node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in self.bound:
            module = self.bound[inner.id]
            for attr in reversed(chain):
                if _is_module(f"{module}.{attr}", self.known):
                    module = f"{module}.{attr}"
                    continue
                if attr.startswith("_") and not attr.startswith("__") and module != self.name:
                    self.private.append((node.lineno, f"{module}.{attr}"))
                break
        self.generic_visit(node)


def scan(root=PACKAGE):
    """(import graph: module -> fuser modules it imports, private names used across modules)."""
    found = modules(root)
    known = set(found)
    graph, private = {}, []
    for name, path in found.items():
        v = Imports(name, path.name == "__init__.py", known)
        v.visit(ast.parse(path.read_text(), str(path)))
        graph[name] = v.edges - {name}
        private += [f"{path.relative_to(root.parent)}:{line}: {text}" for line, text in v.private]
    return graph, private


def cycles(graph):
    """Every import cycle, as a list of modules (depth-first search over the graph)."""
    out, state, stack = [], {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                out.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return out


def test_every_module_has_a_layer():
    assert [n for n in modules() if layer(n) is None] == []


def test_imports_run_only_downward():
    graph, _ = scan()
    upward = [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in graph.items() for b in targets
              if layer(b) is not None and ORDER.index(layer(b)) > ORDER.index(layer(a))]
    assert upward == []


def test_no_import_cycles():
    graph, _ = scan()
    assert cycles(graph) == []


def test_no_private_names_across_modules():
    _, private = scan()
    assert private == []


def test_the_check_sees_cycles_and_private_names(tmp_path):
    """The scan itself: an injected cycle (hidden in a function), a private import and a private attribute
    are all reported."""
    pkg = tmp_path / "fuser"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from fuser import a\n")
    (pkg / "a.py").write_text("from fuser import b\n_secret = 1\n")
    (pkg / "b.py").write_text("def f():\n    from fuser.a import _secret\n    import fuser.a\n    return fuser.a._secret\n")
    graph, private = scan(pkg)
    assert ["fuser.a", "fuser.b", "fuser.a"] in cycles(graph)
    assert [p.split(": ", 1)[1] for p in private] == ["from fuser.a import _secret", "fuser.a._secret"]


def test_import_fuser_does_not_load_the_tools():
    code = ("import sys, fuser; fuser.ffn, fuser.FusedFFN, fuser.optimize, fuser.plan; "
            "print(sorted(m for m in sys.modules if m.startswith('fuser.tools')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    r = subprocess.run([sys.executable, "-c", "import sys, fuser; fuser.warmup; print('fuser.tools.warm' in sys.modules)"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert r.stdout.strip() == "True", r.stderr          # the tools' public names load them on first use
