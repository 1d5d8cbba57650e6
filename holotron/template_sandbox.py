"""A jinja2 sandbox with bounds, for chat templates: code that comes with a checkpoint.

jinja2's ``ImmutableSandboxedEnvironment`` already refuses attribute escapes, includes and mutation of
the context; what it does not bound is work. This environment adds three limits (``TemplateLimits``):

    seconds            wall-clock time of one render; checked at every loop step, call, filter, operator,
                       attribute / item access and output chunk, so a render past it stops there
    max_output_chars   characters of the rendered text; also the largest string or list any one step may
                       build (``'x' * n``, ``+``, ``%`` / ``format`` widths, ``replace``, ``join``, ``indent``,
                       ``center`` ...), checked before the step allocates it
    max_range          the most items one ``range()`` may give (and the ``slice`` filter's count)

``render_with_limits(template, context, limits)`` renders by streaming (``template.generate``) and raises
``LimitExceeded`` (its message names the limit) when a bound is hit; ``TemplateRaised`` carries a
template's own ``raise_exception(...)``. None in a field turns that bound off, for a checkpoint one trusts.
Every ``for`` loop of a template is compiled with a guard on its iterable and every ``~`` concatenation
with a size check (``_Bounds`` rewrites the parsed tree before compilation).
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import math
import re
import time
from dataclasses import dataclass, fields

__all__ = ["TemplateLimits", "DEFAULT_LIMITS", "LimitExceeded", "TemplateRaised", "make_environment",
           "render_with_limits"]


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on rendering one chat template (see the module docstring); None turns one off."""

    seconds: float | None = 2.0
    max_output_chars: int | None = 2_000_000
    max_range: int | None = 10_000

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"TemplateLimits.{f.name} must be a positive number or None, got {v!r}")


DEFAULT_LIMITS = TemplateLimits()  # used when a render is given no limits; assign to change the default

_MAX_INT_BITS = 100_000  # integers a template computes (``*``, ``**``) stay below this many bits
_GUARD, _CONCAT = "holotron_guard_iter", "holotron_concat"  # filters the compiled templates call


class LimitExceeded(Exception):
    """A render went past one of its TemplateLimits; the message says which."""


class TemplateRaised(Exception):
    """raise_exception() called by a template."""


class _Budget:
    __slots__ = ("limits", "deadline")

    def __init__(self, limits: TemplateLimits, timed: bool = True):
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds if timed and limits.seconds is not None else None


# the budget of the render running in this thread / task; outside a render (constant folding at compile
# time, a template rendered directly) the default size bounds apply without a deadline
_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("holotron_template_budget", default=None)


def _budget() -> _Budget:
    b = _BUDGET.get()
    return b if b is not None else _Budget(DEFAULT_LIMITS, timed=False)


def _tick() -> None:
    b = _BUDGET.get()
    if b is not None and b.deadline is not None and time.monotonic() > b.deadline:
        raise LimitExceeded(f"it ran for more than {b.limits.seconds:g} s (TemplateLimits.seconds)")


def _cap(size: int, what: str) -> None:
    limit = _budget().limits.max_output_chars
    if limit is not None and size > limit:
        raise LimitExceeded(f"{what} would be over {limit:,} characters (TemplateLimits.max_output_chars)")


def _text_size(obj, stop: int | None = None) -> int:
    """About len(str(obj)) (exact for a string), counted without building the string; stops past ``stop``."""
    if isinstance(obj, str):
        return len(obj)
    total, stack = 0, [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x) + 4  # quotes and a separator
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 2
            stack.extend(x)
        elif isinstance(x, dict):
            total += 2
            stack.extend(x.keys())
            stack.extend(x.values())
        else:
            total += 24
        if stop is not None and total > stop:
            break
    return total


def _check_size(obj, what: str) -> None:
    limit = _budget().limits.max_output_chars
    if limit is not None:
        _cap(_text_size(obj, limit), what)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_ints(args, kwargs) -> None:
    """A width or count argument bigger than the output bound would allocate past it."""
    limit = _budget().limits.max_output_chars
    if limit is None:
        return
    for v in (*args, *kwargs.values()):
        if _is_int(v) and abs(v) > limit:
            raise LimitExceeded(f"an argument of {v:,} is over {limit:,} (TemplateLimits.max_output_chars)")


_PERCENT_SPEC = re.compile(r"%[#0\- +]*(\d*)(?:\.(\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")


def _check_format(fmt: str, values, percent: bool) -> None:
    """``fmt % values`` / ``fmt.format(*values)``: no width past the bound, and no more than the bound in all."""
    limit = _budget().limits.max_output_chars
    if limit is None:
        return
    specs = _PERCENT_SPEC.findall(fmt) if percent else [(s,) for s in _BRACE_SPEC.findall(fmt)]
    for spec in specs:
        for n in re.findall(r"\d+", " ".join(spec)):
            if len(n) > len(str(limit)) or int(n) > limit:
                raise LimitExceeded(f"a format width of {n} is over {limit:,} (TemplateLimits.max_output_chars)")
    widest = max((_text_size(v, limit) for v in values), default=0)
    _cap(len(fmt) + fmt.count("%" if percent else "{") * widest, "a formatted string")


def _check_replace(s, old, new, count=-1) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        n = s.count(old) if old else len(s) + 1
        n = n if not _is_int(count) or count < 0 else min(n, count)
        _cap(len(s) + n * (len(new) - len(old)), "the replaced string")


def _checked_join(sep, items, what: str = "the joined string") -> list:
    items = list(items)
    limit = _budget().limits.max_output_chars
    if limit is not None:
        _cap(_text_size(items, limit) + len(str(sep)) * len(items), what)
    return items


def _check_result(value, what: str) -> None:
    if isinstance(value, (str, list, tuple, dict)):
        _cap(len(value), what)


# ----------------------------------------------------------------------------------------------
# the pieces a template calls: loop guard, concatenation, range, filters
# ----------------------------------------------------------------------------------------------

def _guard_iter(iterable):
    _tick()
    for item in iterable:
        _tick()
        yield item


def _concat(parts) -> str:
    _tick()
    limit = _budget().limits.max_output_chars
    if limit is not None:
        _cap(sum(_text_size(p, limit) for p in parts), "a ~ concatenation")
    return "".join(str(p) for p in parts)


def _range(*args):
    rng = range(*args)
    limit = _budget().limits.max_range
    if limit is not None and len(rng) > limit:
        shown = ", ".join(map(str, args))
        raise LimitExceeded(f"range({shown}) gives {len(rng):,} items, over {limit:,} (TemplateLimits.max_range)")
    return rng


# filters whose output grows with the text of their input
_TEXT_FILTERS = {"string", "tojson", "pprint", "list", "center", "wordwrap", "truncate", "urlize", "e", "escape",
                 "forceescape", "title", "upper", "lower", "capitalize", "trim", "striptags", "xmlattr", "urlencode"}


def _bounded_filter(name: str, f):
    """``f`` with the checks of its kind before it runs and a size check after (jinja's pass_* marks are kept)."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def run(*args, **kwargs):
        _tick()
        value, rest = (args[skip], args[skip + 1:]) if len(args) > skip else (None, ())
        _check_ints(rest, kwargs)
        if name == "replace":
            _check_replace(value, *rest[:3])
        elif name == "join":
            sep = rest[0] if rest else kwargs.get("d", "")
            args = (*args[:skip], _checked_join(sep, value), *rest)
        elif name == "format" and isinstance(value, str):
            _check_format(value, (*rest, *kwargs.values()), percent=True)
        elif name == "indent":
            if not isinstance(value, str):  # jinja's indent does ``s += "\n"``: on a list, in place
                value = str(value)
                args = (*args[:skip], value, *rest)
            width = rest[0] if rest else kwargs.get("width", 4)
            per_line = width if _is_int(width) else len(str(width))
            _cap(len(value) + (value.count("\n") + 1) * per_line, "the indented text")
        elif name == "slice":
            count = rest[0] if rest else kwargs.get("slices", 0)
            limit = _budget().limits.max_range
            if _is_int(count) and limit is not None and count > limit:
                raise LimitExceeded(f"slice({count:,}) is over {limit:,} (TemplateLimits.max_range)")
        elif name in _TEXT_FILTERS:
            width = kwargs.get("indent") if name == "tojson" else None
            _check_size(value, f"the text of a |{name}")
            if _is_int(width) and width > 0:
                limit = _budget().limits.max_output_chars
                _cap(_text_size(value, limit) * (1 + width), f"the text of a |{name}")
        out = f(*args, **kwargs)
        _check_result(out, f"the result of |{name}")
        return out

    return run


# str methods whose result grows past their inputs: checked before they run
def _check_method(obj, args, kwargs) -> tuple:
    target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format / format_map
    receiver, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if not isinstance(receiver, str):
        return args
    if name == "replace":
        _check_replace(receiver, *args[:3])
    elif name == "join" and args:
        args = (_checked_join(receiver, args[0]), *args[1:])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        _cap(len(receiver) + receiver.count("\t") * (size if _is_int(size) else 8), "the expanded string")
    elif name in ("format", "format_map"):
        values = (*args, *kwargs.values()) if name == "format" else tuple(args[0].values()) if args and isinstance(
            args[0], dict) else ()
        _check_format(receiver, values, percent=False)
    return args


def make_environment():
    """The bounded sandbox: loop controls, ``{% generation %}`` blocks, raise_exception, strftime_now and
    a tojson that keeps non-ASCII text."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
    from jinja2.visitor import NodeTransformer

    class _Generation(Extension):
        # {% generation %}...{% endgeneration %} marks assistant text for training masks in some templates;
        # here it renders its body unchanged
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class _Bounds(NodeTransformer):
        """Every loop iterates through the guard; every ``~`` joins through the size check."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, _GUARD, [], [], None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            node = self.generic_visit(node)
            return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT, [], [], None, None,
                                lineno=node.lineno)

    class _Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        # the stock sandbox returns an Undefined that only fails when used; refuse at the first touch
        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is not allowed")

        def _parse(self, source, name, filename):
            tree = _Bounds().visit(super()._parse(source, name, filename))
            tree.set_environment(self)
            return tree

        def getattr(self, obj, attribute):
            _tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _tick()
            return super().getitem(obj, argument)

        def call(self, context, obj, /, *args, **kwargs):
            _tick()
            if obj is not _range:
                _check_ints(args, kwargs)
                args = _check_method(obj, args, kwargs)
            out = super().call(context, obj, *args, **kwargs)
            _check_result(out, "the result of a call")
            return out

        def call_binop(self, context, operator, left, right):
            _tick()
            if operator == "*":
                seq, n = (left, right) if _is_int(right) else (right, left)
                if isinstance(seq, (str, list, tuple)) and _is_int(n):
                    limit = _budget().limits.max_output_chars
                    _cap(_text_size(seq, limit) * max(n, 0), "a repeated string or list")
                elif _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise LimitExceeded(f"a product of more than {_MAX_INT_BITS:,} bits")
            elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
                if right * math.log2(abs(left)) > _MAX_INT_BITS:
                    raise LimitExceeded(f"a power of more than {_MAX_INT_BITS:,} bits")
            elif operator == "+" and isinstance(left, (str, list, tuple)) and type(left) is type(right):
                limit = _budget().limits.max_output_chars
                _cap(_text_size(left, limit) + _text_size(right, limit), "a sum of strings or lists")
            elif operator == "%" and isinstance(left, str):
                values = right if isinstance(right, tuple) else tuple(right.values()) if isinstance(
                    right, dict) else (right,)
                _check_format(left, values, percent=True)
            out = super().call_binop(context, operator, left, right)
            _check_result(out, f"the result of {operator}")
            return out

    def raise_exception(message):
        raise TemplateRaised(str(message))

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    def finalize(value):  # every {{ value }} is checked before it is turned into text
        _check_size(value, "one output value")
        return value

    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation], autoescape=False,
               keep_trailing_newline=False, finalize=finalize)
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.filters[_GUARD], env.filters[_CONCAT] = _guard_iter, _concat
    stock_lipsum = env.globals["lipsum"]

    def lipsum(n=5, html=True, min=20, max=100):  # jinja's placeholder text, bounded: paragraphs x words
        _cap(n * max * 8 if _is_int(n) and _is_int(max) else 0, "the lipsum text")
        return stock_lipsum(n=n, html=html, min=min, max=max)

    env.globals.update(range=_range, lipsum=lipsum, raise_exception=raise_exception, strftime_now=strftime_now)
    return env


def render_with_limits(template, context: dict, limits: TemplateLimits | None = None) -> str:
    """Render a template compiled by ``make_environment``'s environment within ``limits`` (default:
    ``DEFAULT_LIMITS``); LimitExceeded when a bound is hit. The output is streamed and counted."""
    budget = _Budget(limits if limits is not None else DEFAULT_LIMITS)
    token = _BUDGET.set(budget)
    try:
        parts, size, limit = [], 0, budget.limits.max_output_chars
        for chunk in template.generate(**context):
            _tick()
            size += len(chunk)
            if limit is not None and size > limit:
                raise LimitExceeded(f"its output passed {limit:,} characters (TemplateLimits.max_output_chars)")
            parts.append(chunk)
        return "".join(parts)
    finally:
        _BUDGET.reset(token)
