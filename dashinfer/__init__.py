"""dashinfer: DashInfer's package name, served by dashinfer-py (see dashinfer.allspark)."""
