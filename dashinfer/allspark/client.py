"""dashinfer.allspark.client is dashinfer_client.client itself (one module object under both names)."""
import sys

import dashinfer_client.client

sys.modules[__name__] = dashinfer_client.client
