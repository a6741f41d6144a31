"""Errors raised by the model loaders and the serialized-model reader."""
import contextlib


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


@contextlib.contextmanager
def malformed(where):
    """Reading the fields of a model file: a value of the wrong type or shape (the TypeError,
    ValueError, KeyError... that Python raises when it is used) or JSON nested past the parser's
    depth becomes the loaders' one documented exception, naming the file."""
    try:
        yield
    except ModelSerializerException:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise ModelSerializerException(f"{where} is malformed: {type(e).__name__}: {str(e)[:300]}") from None
