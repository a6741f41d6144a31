"""Command-line parsing shared by every entry point (`dashinfer ...`, the launcher, a rank): a usage
error exits EX_CONFIG, and flag types that refuse out-of-range values while parsing, before any
model loads.

A usage error exits 78, not argparse's 2: the systemd units keep a configuration error from
restarting them with RestartPreventExitStatus=78, and a bad flag is one (docs/deployment.md).
"""
import argparse

from .systemd import EX_CONFIG


class UsageParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors exit EX_CONFIG with argparse's error line alone (a
    journal keeps one line per failure; --help shows the usage), its subcommands' parsers too:
    argparse makes them of the parent's class. --help still exits 0."""

    def error(self, message):
        self.exit(EX_CONFIG, f"{self.prog}: error: {message}\n")


def at_least(minimum, kind=int):
    """A flag type: a `kind` number >= minimum."""
    def parse(text):
        value = _number(text, kind)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {_kind_name(kind)} >= {minimum:g}")
        return value
    parse.__name__ = kind.__name__
    return parse


def port(text) -> int:
    """A flag type: a TCP port, 0 (any free one) to 65535 (socket and gRPC take larger numbers
    modulo 65536, or raise OverflowError)."""
    value = _number(text, int)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 to 65535")
    return value


def grpc_address(text) -> str:
    """A flag type: a gRPC address (unix:PATH or HOST:PORT) whose port, where it names one, is a port."""
    given = text.rsplit(":", 1)[-1]
    if not text.startswith("unix") and ":" in text and given.lstrip("+-").isdigit():
        try:
            port(given)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 to 65535") from None
    return text


def http_url(text) -> str:
    """A flag type: an http:// or https:// URL with a host (and a port, where it names one)."""
    from urllib.parse import urlsplit
    parts = urlsplit(text)
    try:
        parts.port  # raises ValueError when out of range
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected http://HOST:PORT")
    return text


def _number(text, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {_kind_name(kind)}") from None
    if value != value:  # nan
        raise argparse.ArgumentTypeError(f"{text!r}: expected {_kind_name(kind)}")
    return value


def _kind_name(kind) -> str:
    return "an integer" if kind is int else "a number"
