"""`python -m dashinfer`: the `dashinfer` command line (dashinfer_server.cli)."""
import sys

from dashinfer_server.cli import main

sys.exit(main())
