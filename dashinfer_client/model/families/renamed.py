"""A checkpoint's tensors under the names a family's layer takes, where its checkpoints store some
under others (Granite 4's shared_mlp, Hunyuan's query_layernorm): each name a pattern matches is
shown as the pattern's replacement, its tensor unchanged; and without those the model does not
read (the multi-token-prediction layers GLM-4.5 and ERNIE 4.5 release beside theirs)."""
import re


class Renamed:
    """tensors (keys, in, shape, fetch) with every name matching a pattern of `renames` ({regex:
    replacement}, re.sub's) shown as its replacement."""

    def __init__(self, tensors, renames):
        self.tensors = tensors
        self.source = {}  # shown name -> stored name
        for name in tensors.keys():
            for pattern, replacement in renames.items():
                if re.fullmatch(pattern, name):
                    self.source[re.sub(pattern, replacement, name)] = name
                    break
        self.stored = set(self.source.values())

    def keys(self):
        return [n for n in self.tensors.keys() if n not in self.stored] + list(self.source)

    def __contains__(self, name):
        return name in self.source or (name in self.tensors and name not in self.stored)

    def shape(self, name):
        return self.tensors.shape(self.source.get(name, name))

    def fetch(self, name, *codes):
        return self.tensors.fetch(self.source.get(name, name), *codes)


class Without:
    """tensors (keys, in, shape, fetch) less every name for which unread(name) is true."""

    def __init__(self, tensors, unread):
        self.tensors, self.unread = tensors, unread

    def keys(self):
        return [n for n in self.tensors.keys() if not self.unread(n)]

    def __contains__(self, name):
        return not self.unread(name) and name in self.tensors

    def shape(self, name):
        return self.tensors.shape(name)

    def fetch(self, name, *codes):
        return self.tensors.fetch(name, *codes)
