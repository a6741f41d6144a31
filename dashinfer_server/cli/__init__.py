"""The `dashinfer` command: serve, chat, convert, launch (one module per subcommand).

Expected failures (a model that is not there, more ranks than NUMA nodes, a server that does not
answer, Ctrl-C) print one line and exit non-zero; a traceback means a bug. Bad flags, as every
configuration error, exit 78 (dashinfer_server.arguments). SIGTERM while a model converts removes
the conversion's temporary files, then ends the process by the signal.
"""
import argparse
import os
import signal
import sys

from dashinfer_client import settings

from . import chat, convert, launch, serve
from ..arguments import UsageParser
from .common import CONFIG_ERROR, CliError, Terminated

SUBCOMMANDS = (serve, chat, convert, launch)


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="dashinfer", description="CPU LLM inference with the DashInfer API: "
                                     "an OpenAI-compatible server, chat, model conversion, rank groups.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,chat,convert,launch}")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        settings.check_environment()
    except settings.SettingError as e:
        print(f"dashinfer: {e}", file=sys.stderr)
        return CONFIG_ERROR
    if argv[:1] == ["launch"]:  # its flags belong to the launcher (and to the ranks)
        return launch.run_argv(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except CliError as e:
        print(f"dashinfer {args.command}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"dashinfer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:  # the conversion's temporaries are removed: now end as SIGTERM ends a process
        print(f"dashinfer {args.command}: terminated", file=sys.stderr)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 128 + signal.SIGTERM
