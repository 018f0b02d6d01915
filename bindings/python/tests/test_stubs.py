"""The type stubs (`_comms.pyi`, `__init__.pyi`, `py.typed`) describe what the package really
has: every public name and method of the compiled module is stubbed, and nothing stubbed is
missing at run time."""

from __future__ import annotations

import ast
import os
from typing import Optional

import torchcomms
from torchcomms import _comms

PKG = os.path.dirname(torchcomms.__file__)
# Names only the stubs have: type aliases of the stubs themselves.
STUB_ONLY = {"PostHook", "PreHook", "_Device", "_Hints", "_Timeout", "_HooksFr", "_HooksClog", "_Hooks"}
# Set by the package only where torch can use it (torch >= 2.14: Python c10d backends).
if not torchcomms._c10d.PYTHON_BACKENDS:
    STUB_ONLY |= {"_BackendWrapper"}


def _stub(path: str, imports: bool) -> dict[str, Optional[set[str]]]:
    with open(path) as f:
        tree = ast.parse(f.read())
    out: dict[str, Optional[set[str]]] = {}
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            members: set[str] = set()
            for m in n.body:
                if isinstance(m, ast.FunctionDef):
                    members.add(m.name)
                elif isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name):
                    members.add(m.target.id)
            out[n.name] = members
        elif isinstance(n, ast.FunctionDef):
            out[n.name] = None
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = None
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = None
        elif isinstance(n, ast.ImportFrom) and imports:
            for a in n.names:
                out[a.asname or a.name] = None
    return out


def test_py_typed_ships() -> None:
    assert os.path.exists(os.path.join(PKG, "py.typed"))


def test_comms_stub_matches_the_module() -> None:
    stub = _stub(os.path.join(PKG, "_comms.pyi"), imports=False)
    runtime = {k for k in dir(_comms) if not k.startswith("__")} | {"__version__"}
    assert sorted(runtime - set(stub)) == [], "compiled names without a stub"
    assert sorted(set(stub) - runtime - STUB_ONLY) == [], "stubbed names missing at run time"
    problems = []
    for name, members in stub.items():
        if members is None or name in STUB_ONLY:
            continue
        cls = getattr(_comms, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            continue
        own = {m for m in vars(cls) if not m.startswith("_")}
        missing = own - members
        extra = {m for m in members if not m.startswith("_")} - {m for m in dir(cls)}
        if missing or extra:
            problems.append((name, sorted(missing), sorted(extra)))
    assert problems == [], "(class, methods without a stub, stubbed methods missing)"


def test_package_stub_matches_the_package() -> None:
    stub = _stub(os.path.join(PKG, "__init__.pyi"), imports=True)
    for name in torchcomms.__all__ + ["_load_backend", "is_backend_built", "built_backends", "hooks", "objcol"]:
        assert name in stub, name
    for name in stub:
        if name not in ("annotations", "timedelta"):
            assert hasattr(torchcomms, name), name
