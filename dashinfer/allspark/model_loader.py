"""dashinfer.allspark.model_loader is dashinfer_client.model_loader itself (one module object under both names)."""
import sys

import dashinfer_client.model_loader

sys.modules[__name__] = dashinfer_client.model_loader
