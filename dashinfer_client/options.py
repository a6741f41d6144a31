"""DashInfer's option enums that matter only on its GPUs, and MultiMediaInfo: present so code that
names them runs; the runtime config accepts each enum at its default only, and the engine refuses
a request carrying multimedia (every model served here is text-only)."""
from .types import AsStatus, PrintedEnum


class AsMHAPrefill(PrintedEnum):
    """DashInfer's prefill attention kernels; on CPU there is one (AsPrefillDefault)."""
    AsPrefillDefault = 0
    AsPrefillFlashV2 = 10
    AsPrefillXformer = 11


class AsEvictionStrategy(PrintedEnum):
    """DashInfer's choice of request to evict when its GPU KV cache is full. Here the request
    admitted last is preempted and computed again later (scheduler.py), whatever the choice, so
    only the default exists in practice."""
    MaxLength = 0
    Random = 1


class AsSchedulingStrategy(PrintedEnum):
    """DashInfer's scheduling policy. This runtime batches prefill chunks with every decode in the
    same step, which is neither policy exactly; the names exist for code that sets them."""
    ContextPriority = 0
    Balance = 1


class VocabType(PrintedEnum):
    """The tokenizer algorithm DashInfer's JSON mode was told about (vocab_type)."""
    VOCAB_TYPE_WPM = 0  # WordPiece
    VOCAB_TYPE_SPM = 1  # SentencePiece
    VOCAB_TYPE_UGM = 2  # Unigram
    VOCAB_TYPE_BPE = 3  # byte-pair encoding


class MultiMediaInfo:
    """DashInfer's multimedia attachment of a request (images for vision-language models).

    It can be built and filled as in DashInfer, but every model this runtime serves is text-only:
    a generation config carrying one (mm_info) is refused by the engine."""

    def __init__(self):
        self.multimedia_type = 0
        self.contents = {}  # key -> list of tensors (DLPack capsules or arrays), as given

    def set_multimedia_type(self, multimedia_type: int):
        self.multimedia_type = int(multimedia_type)
        return AsStatus.ALLSPARK_SUCCESS

    def add_multimedia_content(self, key: str, tensors):
        self.contents.setdefault(str(key), []).extend(tensors)
        return AsStatus.ALLSPARK_SUCCESS
