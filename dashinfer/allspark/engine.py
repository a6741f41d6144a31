"""dashinfer.allspark.engine is dashinfer_client.engine itself (one module object under both names)."""
import sys

import dashinfer_client.engine

sys.modules[__name__] = dashinfer_client.engine
