"""`dashinfer launch [flags]`: start a gRPC rank group, one rank per NUMA node (the systemd
service's command; `dashinfer launch --help` lists its flags)."""
from .common import first_paragraph


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="start a gRPC rank group (one rank per NUMA node)", add_help=False,
                       description=first_paragraph(__doc__))
    p.set_defaults(run=lambda args: run_argv([]))


def run_argv(argv) -> int:
    from dashinfer_server.launch import main
    return main(argv)
