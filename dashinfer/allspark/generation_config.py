"""dashinfer.allspark.generation_config is dashinfer_client.generation_config itself (one module object under both names)."""
import sys

import dashinfer_client.generation_config

sys.modules[__name__] = dashinfer_client.generation_config
