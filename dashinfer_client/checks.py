"""Value checks shared by the config builders: each takes (key, value), returns the value in its
normal form (int, float, list of ints, enum member) or raises ValueError naming the key and what
it accepts."""
import math
import numbers
import reprlib

_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxset = 8


def brief(v) -> str:
    """repr(v) cut to a readable size, for messages: a refused value may be megabytes (or have a
    repr that raises), and the message is logged and sent back over gRPC."""
    return _BRIEF.repr(v)


def check_int(key, v, lo=None, hi=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{key} must be an int, got {type(v).__name__} {brief(v)}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{key} must be {allowed}, got {v}")
    return v


def check_float(key, v, ok=lambda x: True, allowed="finite"):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{key} must be a number, got {type(v).__name__} {brief(v)}")
    v = float(v)
    if not math.isfinite(v) or not ok(v):
        raise ValueError(f"{key} must be {allowed}, got {v}")
    return v


def check_bool(key, v):
    if not isinstance(v, bool):
        raise ValueError(f"{key} must be True or False, got {type(v).__name__} {brief(v)}")
    return v


def check_str(key, v):
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {type(v).__name__} {brief(v)}")
    return v


def check_ids(key, v):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{key} must be a list of token ids, got {brief(v)}")
    try:
        items = list(v)
    except Exception as e:  # a caller's object whose iteration fails: its input is bad, not ours
        raise ValueError(f"{key} must be a list of token ids, got {brief(v)} ({type(e).__name__})") from None
    return [check_int(f"{key}[{i}]", x, 0) for i, x in enumerate(items)]


def check_enum(key, enum_cls, v):
    if isinstance(v, enum_cls):
        return v
    if isinstance(v, str):
        by_name = {m.name.lower(): m for m in enum_cls}
        if v.lower() in by_name:
            return by_name[v.lower()]
    elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
        for m in enum_cls:
            if m.value == v:
                return m
    names = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"unknown {key} {brief(v)}; expected one of {names}")


def check_keys(what, d, known):
    if not isinstance(d, dict):
        raise ValueError(f"{what} needs a dict, got {type(d).__name__}")
    unknown = sorted(set(d) - set(known), key=repr)  # keys of any type: repr orders them all
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known keys: {', '.join(known)}")
