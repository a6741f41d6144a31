"""DashInfer's `dashinfer.allspark`, served by dashinfer-py: code written for DashInfer runs with
nothing changed but the installed package.

Every name is dashinfer_client's own object (not a copy), looked up on first use so that importing
this package stays as light as importing dashinfer_client. The submodules (engine, prompt_utils,
_allspark, runtime_config, generation_config, model_loader, quantization, client) are the
dashinfer_client modules of the same names.
"""
import dashinfer_client as _impl

__all__ = list(_impl.__all__)


def __getattr__(name):
    return getattr(_impl, name)


def __dir__():
    return sorted(set(globals()) | set(dir(_impl)))
