"""attnzoo: learnable sparse-attention Transformers for the Hugging Face ecosystem.

`import attnzoo` registers every family with the Auto classes (AutoConfig, AutoModel, AutoModelForMaskedLM,
AutoModelForSequenceClassification, AutoModelForSeq2SeqLM) and the `sparse-summarization` pipeline.
"""

if __name__ != "attnzoo":
    # The folder is called `models/` but installs as `attnzoo`; importing it as `models` from the repository root
    # would load a second copy of every class and register the Auto classes twice.
    raise ImportError(
        f"This package must be imported as `attnzoo`, not `{__name__}`. Install it (`pip install -e .`) and use "
        "`import attnzoo`."
    )

__version__ = "0.1.0"

from . import a2former, dense_transformer, fsat, sbm, smart_bird, sparse_transformer
from .a2former import (
    A2FormerConfig,
    A2FormerForConditionalGeneration,
    A2FormerForMaskedLM,
    A2FormerForSequenceClassification,
    A2FormerModel,
)
from .core import SparseZooConfig, ZooConfig
from .dense_transformer import (
    DenseTransformerConfig,
    DenseTransformerForConditionalGeneration,
    DenseTransformerForMaskedLM,
    DenseTransformerForSequenceClassification,
    DenseTransformerModel,
)
from .fsat import (
    FSATConfig,
    FSATForConditionalGeneration,
    FSATForMaskedLM,
    FSATForSequenceClassification,
    FSATModel,
)
from .pipelines import SparseSummarizationPipeline, summarize
from .registry import FAMILIES, Family, register_family
from .sbm import SBMConfig, SBMForConditionalGeneration, SBMForMaskedLM, SBMForSequenceClassification, SBMModel
from .smart_bird import (
    SmartBirdConfig,
    SmartBirdForConditionalGeneration,
    SmartBirdForMaskedLM,
    SmartBirdForSequenceClassification,
    SmartBirdModel,
)
from .sparse_transformer import (
    SparseTransformerConfig,
    SparseTransformerForConditionalGeneration,
    SparseTransformerForMaskedLM,
    SparseTransformerForSequenceClassification,
    SparseTransformerModel,
)

__all__ = [
    "FAMILIES",
    "A2FormerConfig",
    "A2FormerForConditionalGeneration",
    "A2FormerForMaskedLM",
    "A2FormerForSequenceClassification",
    "A2FormerModel",
    "DenseTransformerConfig",
    "DenseTransformerForConditionalGeneration",
    "DenseTransformerForMaskedLM",
    "DenseTransformerForSequenceClassification",
    "DenseTransformerModel",
    "FSATConfig",
    "FSATForConditionalGeneration",
    "FSATForMaskedLM",
    "FSATForSequenceClassification",
    "FSATModel",
    "Family",
    "SBMConfig",
    "SBMForConditionalGeneration",
    "SBMForMaskedLM",
    "SBMForSequenceClassification",
    "SBMModel",
    "SmartBirdConfig",
    "SmartBirdForConditionalGeneration",
    "SmartBirdForMaskedLM",
    "SmartBirdForSequenceClassification",
    "SmartBirdModel",
    "SparseSummarizationPipeline",
    "SparseTransformerConfig",
    "SparseTransformerForConditionalGeneration",
    "SparseTransformerForMaskedLM",
    "SparseTransformerForSequenceClassification",
    "SparseTransformerModel",
    "SparseZooConfig",
    "ZooConfig",
    "__version__",
    "a2former",
    "dense_transformer",
    "fsat",
    "register_family",
    "sbm",
    "smart_bird",
    "sparse_transformer",
    "summarize",
]
