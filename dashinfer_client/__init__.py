"""dashinfer-py client side: API types, config builders, model loaders, ClientEngine."""
