"""dashinfer.allspark.quantization is dashinfer_client.quantization itself (one module object under both names)."""
import sys

import dashinfer_client.quantization

sys.modules[__name__] = dashinfer_client.quantization
