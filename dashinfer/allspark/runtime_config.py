"""dashinfer.allspark.runtime_config is dashinfer_client.runtime_config itself (one module object under both names)."""
import sys

import dashinfer_client.runtime_config

sys.modules[__name__] = dashinfer_client.runtime_config
