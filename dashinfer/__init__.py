"""`dashinfer`: the command line (`python -m dashinfer` = the `dashinfer` console script).
The runtime itself is dashinfer_client (the API) and dashinfer_server (the engine)."""
