"""Run inside a fresh virtual environment holding only the attnzoo wheel and its core dependencies (see
`test_wheel.py`): every family builds, saves, reloads through the Auto classes and runs, and the parts that need an
extra say which one.

Argument: a JSON file `{model_type: tiny config fields}` and a scratch folder.
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel

import attnzoo

configs = json.loads(Path(sys.argv[1]).read_text())
scratch = Path(sys.argv[2])
assert "site-packages" in attnzoo.__file__, f"attnzoo imported from {attnzoo.__file__}, not the installed wheel"
extras = [
    name
    for name in ("datasets", "evaluate", "rouge_score", "nltk", "sklearn", "scipy", "matplotlib")
    if importlib.util.find_spec(name) is not None
]
assert not extras, f"the core install pulled optional packages: {extras}"
assert sorted(attnzoo.FAMILIES) == sorted(configs), (sorted(attnzoo.FAMILIES), sorted(configs))
for model_type, fields in configs.items():
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **fields)).eval()
    ids = torch.randint(5, fields["vocab_size"], (2, 24))
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
    model.save_pretrained(scratch / model_type)
    loaded = AutoModel.from_pretrained(scratch / model_type).eval()
    assert type(loaded) is type(model) and (scratch / model_type / "model.safetensors").is_file()
    with torch.no_grad():
        after = loaded(input_ids=ids).last_hidden_state
    assert after.shape == (2, 24, fields["hidden_size"]) and torch.isfinite(after).all()
    # sampling methods draw their eval graphs from a fixed seed: the reloaded model computes the same function
    torch.testing.assert_close(after, before)
    print(f"{model_type}: built, saved, reloaded, forward {tuple(after.shape)}")
try:
    import attnzoo.training  # noqa: F401
except ImportError as error:
    assert "attnzoo[train]" in str(error), error
    print(f"attnzoo.training without the extra: {error}")
else:
    raise AssertionError("attnzoo.training imported without the train extra")
