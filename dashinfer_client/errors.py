"""Errors raised by the model loaders and the serialized-model reader."""


class ModelSerializerException(Exception):
    """A model could not be read, converted or loaded; the message names the file/tensor/key at fault.

    DashInfer's class of the same name carries (message, code, model_name); the same arguments are
    accepted here, but str() is the message itself, so the reason is never hidden behind a code.
    """

    def __init__(self, message, code=1, model_name=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.model_name = model_name

    def __str__(self):
        return self.message if self.model_name is None else f"{self.model_name}: {self.message}"
