"""DashInfer's `allspark.client` module name."""
from .client_engine import ClientEngine

__all__ = ["ClientEngine"]
