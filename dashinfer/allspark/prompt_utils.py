"""dashinfer.allspark.prompt_utils is dashinfer_client.prompt_utils itself (one module object under both names)."""
import sys

import dashinfer_client.prompt_utils

sys.modules[__name__] = dashinfer_client.prompt_utils
