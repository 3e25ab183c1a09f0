"""A masked-LM head for a source that has none (`BertModel`, `RobertaModel`, sentence encoders such as
all-MiniLM-L6-v2): BERT's layout (`dense -> act -> LayerNorm -> decoder + bias`), the decoder tied to the word
embeddings, and a starting point chosen for a pretrained encoder rather than a random one.

transformers would start such a head as it starts any new layer: `dense` drawn from `normal(0, initializer_range)`.
That head scores a random rotation of the encoder's last hidden state against the embeddings. This one starts `dense`
as the identity (zero bias): the head scores the normalised hidden state itself against the word embeddings, the
reading a tied head ends up learning, and every direction of the hidden state reaches the logits unmixed.
`LayerNorm` starts at one / zero and the output bias at zero (no token preferred), as in BERT.
"""

from __future__ import annotations

import torch

from ..core.heads import MaskedLMHead

#: How each parameter of the head starts, by its name inside the head (the report's `new` rows say it).
HEAD_RULES = {
    "dense.weight": "identity (the head reads the hidden state unmixed; masked_lm_head.py)",
    "dense.bias": "zeros",
    "LayerNorm.weight": "ones",
    "LayerNorm.bias": "zeros",
    "bias": "zeros (no token preferred)",
}


@torch.no_grad()
def init_masked_lm_head(head: MaskedLMHead) -> dict[str, str]:
    """
    Start a fresh masked-LM head for a source checkpoint without one (see the module).

    Args:
        head ([`MaskedLMHead`]): the head of a `<Prefix>ForMaskedLM`; its decoder stays tied to the embeddings.

    Returns:
        `dict[str, str]`: the rule of each parameter, by its name inside the head ([`HEAD_RULES`]).
    """
    if head.dense.in_features != head.dense.out_features:
        raise ValueError(f"The head's dense layer is not square ({tuple(head.dense.weight.shape)}).")
    head.dense.weight.copy_(torch.eye(head.dense.out_features, dtype=head.dense.weight.dtype))
    head.dense.bias.zero_()
    head.LayerNorm.weight.fill_(1.0)
    head.LayerNorm.bias.zero_()
    head.bias.zero_()
    return dict(HEAD_RULES)
