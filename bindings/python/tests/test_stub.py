"""deltacast/_native.pyi against the compiled module: every class, method, property, constant
and parameter of `deltacast._native` is in the stub, and the stub names nothing else.

The compiled side is read with `inspect` (PyO3 gives every function and constructor a text
signature), the stub with `ast`. Parameters are compared by name, kind (positional or
keyword-only) and whether they have a default. Dunder methods the stub declares must exist;
the compiled side's own dunders (slot wrappers PyO3 adds) are not asked of the stub.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import deltacast._native as native

STUB = Path(__file__).resolve().parents[1] / "python" / "deltacast" / "_native.pyi"

# How a parameter may be passed, as a string both sides can give.
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional-only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}


def _stub_params(fn: ast.FunctionDef) -> list[tuple[str, str, bool]]:
    """(name, kind, has a default) of a stub function, without self/cls."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    out = [
        (p.arg, "positional-only" if p in a.posonlyargs else "positional", d)
        for p, d in zip(positional, defaults)
    ]
    if a.vararg:
        out.append((a.vararg.arg, "*args", False))
    out += [(p.arg, "keyword-only", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, "**kwargs", False))
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if out and not is_static and out[0][0] in ("self", "cls"):
        out = out[1:]
    return out


def _native_params(obj) -> list[tuple[str, str, bool]]:
    sig = inspect.signature(obj)
    return [
        (p.name, _KINDS[p.kind], p.default is not inspect.Parameter.empty)
        for p in sig.parameters.values()
        if p.name not in ("self", "cls")
    ]


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


class _StubClass:
    def __init__(self, node: ast.ClassDef):
        self.methods: dict[str, ast.FunctionDef] = {}
        self.properties: set[str] = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                if _is_property(item):
                    self.properties.add(item.name)
                else:
                    self.methods[item.name] = item
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                # Fields of the result classes (PyO3 `get_all`): read-only attributes.
                self.properties.add(item.target.id)


def _stub():
    tree = ast.parse(STUB.read_text())
    classes, functions, constants = {}, {}, set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = _StubClass(node)
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            constants.add(node.target.id)
    return classes, functions, constants


def _native_members(cls):
    """(methods, properties) a compiled class defines itself, without dunders."""
    methods, properties = {}, set()
    for name, value in vars(cls).items():
        if name.startswith("__"):
            continue
        if inspect.isdatadescriptor(value):
            properties.add(name)
        else:
            methods[name] = getattr(cls, name)
    return methods, properties


def _public(module):
    names = [n for n in dir(module) if not n.startswith("_")]
    classes = {n: getattr(module, n) for n in names if inspect.isclass(getattr(module, n))}
    functions = {n: getattr(module, n) for n in names if inspect.isbuiltin(getattr(module, n))}
    constants = set(names) - set(classes) - set(functions)
    return classes, functions, constants


def test_stub_names_every_class_function_and_constant_and_nothing_else():
    stub_classes, stub_functions, stub_constants = _stub()
    classes, functions, constants = _public(native)
    assert set(stub_classes) == set(classes)
    assert set(stub_functions) == set(functions)
    assert stub_constants == constants


def test_stub_functions_take_the_same_parameters():
    _, stub_functions, _ = _stub()
    _, functions, _ = _public(native)
    for name, fn in functions.items():
        assert _stub_params(stub_functions[name]) == _native_params(fn), name


def test_stub_classes_have_the_same_methods_properties_and_parameters():
    stub_classes, _, _ = _stub()
    classes, _, _ = _public(native)
    for name, cls in classes.items():
        stub = stub_classes[name]
        methods, properties = _native_members(cls)
        assert stub.properties == properties, name
        stub_methods = {m for m in stub.methods if not m.startswith("__")}
        assert stub_methods == set(methods), name
        for m, fn in methods.items():
            assert _stub_params(stub.methods[m]) == _native_params(fn), f"{name}.{m}"
        # The constructor (PyO3 `#[new]`: a `__new__` of the class's own, its parameters in
        # the class's text signature); a class Python cannot construct must not offer one.
        if "__new__" in vars(cls):
            assert "__new__" in stub.methods, f"{name}.__new__ missing from the stub"
            assert _stub_params(stub.methods["__new__"]) == _native_params(cls), f"{name}.__new__"
        else:
            assert "__new__" not in stub.methods, f"{name} cannot be constructed"
        for dunder in (m for m in stub.methods if m.startswith("__") and m != "__new__"):
            assert callable(getattr(cls, dunder, None)), f"{name}.{dunder}"


def test_the_stub_parser_sees_what_it_compares():
    """The comparison above is only as good as its readers: they must find real content."""
    stub_classes, stub_functions, _ = _stub()
    receiver = stub_classes["Receiver"]
    assert "apply_as_received" in receiver.properties and "receive" in receiver.methods
    assert ("apply_as_received", "keyword-only", True) in _stub_params(receiver.methods["__new__"])
    assert ("apply_as_received", "keyword-only", True) in _native_params(native.Receiver)
    methods, properties = _native_members(native.Receiver)
    assert "receive" in methods and "apply_as_received" in properties
    assert ("frame", "positional", False) in _native_params(native.Receiver.receive)
    assert _stub_params(stub_functions["frame_header"]) == [("frame", "positional", False)]
