import sys

from dashinfer_server.cli import main

sys.exit(main())
