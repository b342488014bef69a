"""Generated strict structurers (the codec's path for current-version
payloads) and generated unstructurers (its path for every event it encodes).

For an attrs class this writes a function (as attrs writes ``__init__``) that
takes exactly a dict with the class's required keys, any of its optional
ones and nothing else, whose values have exactly the declared JSON types, and
calls the class's constructor with them, so its validators and hooks run.
On anything else it raises :class:`Declined` (or the constructor raises
``TypeError`` or ``ValueError``) and the codec's cattrs path decides: it
builds the same event or explains what is wrong.

Why not cattrs' own generated structurers, with ``detailed_validation=False``?
They call a hook per field and build a set per object to find extra keys:
typed bulk replay runs 1.2-1.5x slower with them (``benchmarks/stores.py
--structurers``).

And why the constructor? Storing the values through the slot descriptors
instead made typed bulk replay only 1.09-1.11x faster, and needed attrs'
generated ``__init__`` recognised by its code's file name, its frozen
``__setattr__`` by probing, and more: knowledge a new attrs could break.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import UnionType
from typing import Any, Literal, TypeAlias, Union, get_args, get_origin, get_type_hints

import attrs

__all__ = [
    "Declined",
    "Structurer",
    "Unstructurer",
    "structurer",
    "structurers",
    "unstructurer",
]

#: A generated structurer: a payload in, an instance out, or an exception.
Structurer: TypeAlias = Callable[[Any], Any]
#: A generated unstructurer: an instance in, its JSON-able dict out.
Unstructurer: TypeAlias = Callable[[Any], dict[str, Any]]


class Declined(Exception):
    """A structurer does not take this payload; the detailed cattrs path decides."""


def _invalid(tp: Any, var: str, env: dict[str, Any]) -> str:
    """Python source that is true when ``var`` is NOT a valid value of ``tp``.

    Raises:
        TypeError: ``tp`` is not a type these structurers know.
    """
    origin = get_origin(tp)
    if tp is str or getattr(tp, "__supertype__", None) is str:
        return f"type({var}) is not str"
    if tp is int:
        return f"type({var}) is not int"
    if tp is bool:
        return f"type({var}) is not bool"
    if origin is Literal:
        name = f"_allowed_{len(env)}"
        env[name] = frozenset(get_args(tp))
        return f"(type({var}) is not str or {var} not in {name})"
    if origin in (Union, UnionType):
        args = get_args(tp)
        if len(args) == 2 and type(None) in args:
            inner = next(a for a in args if a is not type(None))
            return f"({var} is not None and {_invalid(inner, var, env)})"
    raise TypeError(tp)


def structurer(cls: type[Any]) -> Structurer:
    """Generate the strict structurer of the attrs class ``cls``.

    Nested attrs classes (``Usage``) are structured the same way.

    Raises:
        TypeError: ``cls`` has a field these structurers do not handle (a
            tagged union, a float, a keyword-only or ``init=False`` field...).
    """
    hints = get_type_hints(cls)
    env: dict[str, Any] = {"_Declined": Declined, "_cls": cls, "_MISSING": object()}
    fields = attrs.fields(cls)
    # Fetch every field (a missing required key is a KeyError; nested
    # objects are structured as they are fetched), then one test of every
    # leaf type, then the constructor. ``n`` counts the keys present plus
    # the optional ones absent: it equals the number of fields exactly when
    # the payload has no extra key.
    body = ["n = len(p)"]
    checks, args = [], []
    for k, f in enumerate(fields):
        if not f.init or f.kw_only:
            raise TypeError(f.name)  # not a positional argument of __init__
        var = f"v{k}"
        tp = hints[f.name]
        if get_origin(tp) is tuple:
            raise TypeError(tp)  # a sequence of objects: the cattrs path
        nested = [a for a in (tp, *get_args(tp)) if attrs.has(a)]
        if len(nested) > 1:
            raise TypeError(tp)  # a tagged union: the cattrs path knows the tags
        if nested:
            # A nested object is structured only when it came from the payload.
            sub = f"_sub_{k}"
            env[sub] = structurer(nested[0])
            build = f"{sub}({var})"
            if type(None) in get_args(tp):
                build = f"None if {var} is None else {build}"
        else:
            checks.append(_invalid(tp, var, env))
        args.append(var)
        default = f.default
        if default is attrs.NOTHING:
            body.append(f"{var} = p[{f.name!r}]")
            if nested:
                body.append(f"{var} = {build}")
            continue
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                raise TypeError(f.name)
            env[f"_factory_{k}"] = default.factory
            fill = f"_factory_{k}()"
        else:
            env[f"_default_{k}"] = default
            fill = f"_default_{k}"
        body += [
            f"{var} = p.get({f.name!r}, _MISSING)",
            f"if {var} is _MISSING: {var} = {fill}; n += 1",
        ]
        if nested:
            body.append(f"else: {var} = {build}")
    body.append(f"if n != {len(fields)}: raise _Declined")
    if checks:
        body.append(f"if {' or '.join(checks)}: raise _Declined")
    lines = [
        "def structure(p):",
        "    if type(p) is not dict: raise _Declined",
        "    try:",
        *(f"        {line}" for line in body),
        "    except KeyError:",
        "        raise _Declined from None",
        f"    return _cls({', '.join(args)})",
    ]
    exec("\n".join(lines), env)  # generated from our own class definitions only
    structure: Structurer = env["structure"]
    return structure


def structurers(classes: Mapping[str, type[Any]]) -> dict[str, Structurer]:
    """The structurer of each class (by its tag) that :func:`structurer` handles."""
    out = {}
    for tag, cls in classes.items():
        try:
            out[tag] = structurer(cls)
        except TypeError:
            continue  # the cattrs path structures it
    return out


def _leaf(tp: Any) -> bool:
    """True for the types cattrs unstructures as they are (the value itself)."""
    if tp in (str, int, bool, float, type(None)) or get_origin(tp) is Literal:
        return True
    if getattr(tp, "__supertype__", None) is not None:
        return _leaf(tp.__supertype__)  # a NewType
    if get_origin(tp) in (Union, UnionType):
        return all(_leaf(a) for a in get_args(tp))
    return False


def unstructurer(cls: type[Any], fallback: Callable[[Any], Callable[[Any], Any]]) -> Unstructurer:
    """Generate the unstructurer of the attrs class ``cls``: the dict cattrs'
    generated hook gives (the same keys in the same order, the same values),
    written as one dict display.

    Why: the converter's ``unstructure`` dispatches on the class, then the
    hook calls a hook per optional field, and a tuple field builds a list
    through a generator. Every turn encodes about three events, and each
    allocation on that path also feeds the cyclic collector.

    Leaf values (strings, integers, booleans, literals, ``None`` and unions
    of them) are taken as they are, as cattrs does; nested attrs classes (or
    ``None``) through their own generated unstructurer; tuples of them into
    lists; any other field (the tagged policy union) through
    ``fallback(type)``, the converter's own hook for that type.
    """
    hints = get_type_hints(cls)
    env: dict[str, Any] = {}
    pre: list[str] = []
    items: list[str] = []
    for k, f in enumerate(attrs.fields(cls)):
        tp = hints[f.name]
        get = f"i.{f.name}"
        if _leaf(tp):
            items.append(f"{f.name!r}: {get}")
            continue
        args = get_args(tp)
        origin = get_origin(tp)
        sub = f"_u{k}"
        if attrs.has(tp):
            env[sub] = unstructurer(tp, fallback)
            value = f"{sub}({get})"
        elif (
            origin in (Union, UnionType)
            and len(args) == 2
            and attrs.has(args[0])
            and args[1] is type(None)
        ):
            env[sub] = unstructurer(args[0], fallback)
            pre.append(f"v{k} = {get}")
            value = f"None if v{k} is None else {sub}(v{k})"
        elif origin is tuple and len(args) == 2 and args[1] is Ellipsis and attrs.has(args[0]):
            env[sub] = unstructurer(args[0], fallback)
            pre.append(f"v{k} = {get}")
            value = f"[{sub}(x) for x in v{k}] if v{k} else []"
        else:
            env[sub] = fallback(tp)
            value = f"{sub}({get})"
        items.append(f"{f.name!r}: {value}")
    lines = [
        "def unstructure(i):",
        *(f"    {line}" for line in pre),
        f"    return {{{', '.join(items)}}}",
    ]
    exec("\n".join(lines), env)  # generated from our own class definitions only
    unstructure: Unstructurer = env["unstructure"]
    return unstructure
