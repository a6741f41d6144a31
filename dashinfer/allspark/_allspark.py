"""dashinfer.allspark._allspark is dashinfer_client._allspark itself (one module object under both names)."""
import sys

import dashinfer_client._allspark

sys.modules[__name__] = dashinfer_client._allspark
