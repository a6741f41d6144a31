"""dashinfer.helper is dashinfer_client.helper itself (one module object under both names)."""
import sys

import dashinfer_client.helper

sys.modules[__name__] = dashinfer_client.helper
