"""Rows of the benchmark: the zoo families (and their variants) and the transformers baselines, and their inputs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .floor import FLOOR_MODEL, null_attention_model
from .settings import HF_BASELINES, REFERENCE_MODEL, ModelSize
from .variants import VARIANTS, Overrides


@dataclass(frozen=True)
class BenchModel:
    """One row of the benchmark: a zoo family (optionally a variant) or a transformers baseline.

    Args:
        name: row label (`"dense_transformer"`, `"null_attention"`, `"sbm:fastrg-2%"`, `"hf:bert-sdpa"`).
        kind: `"family"`, `"floor"` (the dense family with a null attention: `attnzoo.benchmarking.floor`; both run
            the extra lengths) or `"hf"`.
        build: `build(size, length) -> nn.Module` returning a fresh model in eval mode.
        global_first_token: pass Longformer's `global_attention_mask` with global attention on token 0.
        family / variant / overrides: where a zoo row comes from (recorded in the JSON). `overrides` is a dict of
            config fields, or a function `length -> dict` for variants whose settings follow the sequence length
            (recorded as its docstring).
    """

    name: str
    kind: str
    build: Callable[[ModelSize, int], nn.Module]
    global_first_token: bool = False
    family: str | None = None
    variant: str | None = None
    overrides: Overrides = field(default_factory=dict)

    def build_on(self, size: ModelSize, length: int, device: str, dtype: torch.dtype | None = None) -> nn.Module:
        """`build(size, length)` made on `device` (then cast to `dtype`): initialised there rather than on a CPU
        thread, which takes about a second for a base-size model (ModernBERT four), at every (row, length)."""
        with torch.device(device):
            model = self.build(size, length)
        # Also moves what a model made on the host explicitly (`device="cpu"`, `torch.from_numpy`): none does today.
        return model.to(device=device, dtype=dtype)

    def describe(self) -> dict[str, Any]:
        overrides = self.overrides
        if callable(overrides):
            overrides = {"per_length": (overrides.__doc__ or overrides.__name__).strip()}
        return {
            "name": self.name,
            "kind": self.kind,
            "family": self.family,
            "variant": self.variant,
            "overrides": overrides,
        }


def resolve_families(names: list[str] | None, errors: dict[str, str] | None = None) -> list[Any]:
    """Registered families named by `names` (family name, model type or subpackage); `None` = all registered.

    Names not registered yet are imported as `attnzoo.<name>` first, which registers families still in development.
    A name that cannot be resolved raises `ValueError`, or, when `errors` is given, is recorded there and skipped
    (one unfinished family must not cost the whole run).
    """
    import attnzoo

    families = attnzoo.FAMILIES
    if names is None:
        return list(families.values())

    def find(name: str) -> Any | None:
        for family in families.values():
            package = family_package(family)
            if name in (family.name, family.model_type, package, package.removeprefix("attnzoo.")):
                return family
        return None

    resolved = []
    for name in names:
        family = find(name)
        try:
            if family is None:
                try:
                    importlib.import_module(f"attnzoo.{name}")
                except Exception as err:  # noqa: BLE001 - a half-written family may raise anything on import
                    raise ValueError(
                        f"Unknown family {name!r}: not registered and `attnzoo.{name}` cannot be imported "
                        f"({type(err).__name__}: {err})."
                    ) from err
                family = find(name)
            if family is None:
                raise ValueError(f"Importing `attnzoo.{name}` registered no family called {name!r}.")
        except ValueError as err:
            if errors is None:
                raise
            errors[name] = str(err)
            continue
        if family not in resolved:
            resolved.append(family)
    return resolved


def family_package(family: Any) -> str:
    """Dotted name of the package that defines `family` (`"attnzoo.dense_transformer"`)."""
    return family.config_class.__module__.rsplit(".", 1)[0]


def family_variants(family: Any) -> dict[str, Overrides]:
    """The family's benchmark variants ([`~attnzoo.benchmarking.variants.VARIANTS`]: variant name -> config
    overrides, or a function of the sequence length returning them)."""
    return dict(VARIANTS.get(family.name, {}))


def _family_builder(family: Any, overrides: Overrides) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, length: int) -> nn.Module:
        fields = overrides(length) if callable(overrides) else overrides
        config = family.config_class(**{**size.config_kwargs(length), **fields})
        return family.model_class(config).eval()

    return build


def _hf_builder(key: str) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, length: int) -> nn.Module:
        from transformers import (
            BertConfig,
            BertModel,
            BigBirdConfig,
            BigBirdModel,
            LongformerConfig,
            LongformerModel,
        )

        if key == "modernbert":
            return modernbert_model(size, length)

        common = size.config_kwargs(length)
        if key in ("bert-sdpa", "bert-eager"):
            config = BertConfig(**common, attn_implementation=key.removeprefix("bert-"))
            model = BertModel(config, add_pooling_layer=False)
        elif key == "bigbird":
            config = BigBirdConfig(**common, attention_type="block_sparse", block_size=64, num_random_blocks=3)
            model = BigBirdModel(config, add_pooling_layer=False)
        elif key == "longformer":
            model = LongformerModel(LongformerConfig(**common, attention_window=256), add_pooling_layer=False)
        else:
            raise ValueError(f"Unknown HF baseline {key!r}; choose from {HF_BASELINES}.")
        # The pooler is dropped because the zoo's `<Prefix>Model` has none; everything else is the stock model.
        return model.eval()

    return build


def modernbert_model(size: ModelSize, length: int) -> nn.Module:
    """transformers' ModernBERT encoder at `size`, in eval mode: its own layer recipe (pre-norm, rotary positions,
    gated GELU FFN, no biases) and its attention pattern, global attention in every third layer (the first of each
    three) and a 128-token sliding window (64 on each side) in the others.

    Its gated FFN projects to twice `intermediate_size`, so `intermediate_size` is set to two thirds of the common
    FFN width (2048 for 3072): the FFN then has the parameters and FLOPs of the other rows'. Dropout is 0; the
    special token ids are moved into the (possibly small) vocabulary.
    """
    from transformers import ModernBertConfig, ModernBertModel

    config = ModernBertConfig(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        intermediate_size=2 * size.intermediate_size // 3,
        max_position_embeddings=length + 2,
        pad_token_id=0,
        bos_token_id=1,
        cls_token_id=1,
        eos_token_id=2,
        sep_token_id=2,
        attn_implementation="sdpa",
    )
    return ModernBertModel(config).eval()


def benchmark_models(
    families: list[str] | None,
    hf_baselines: list[str],
    errors: dict[str, str] | None = None,
    keep: list[str] | None = None,
) -> list[BenchModel]:
    """Rows of the benchmark: every family (plus its variants), then the HF baselines. The dense family comes first,
    followed by the floor (`null_attention`, the dense family with an attention that returns its values), which
    comes with it.

    `errors`, when given, collects the families that could not be loaded instead of raising. `keep`, when given,
    names the rows to keep; a name that matches no row is an error.
    """
    rows = []
    for family in resolve_families(families, errors):
        rows.append(BenchModel(family.name, "family", _family_builder(family, {}), family=family.name))
        if family.name == REFERENCE_MODEL:
            rows.append(
                BenchModel(FLOOR_MODEL, "floor", null_attention_model, family=family.name, variant=FLOOR_MODEL)
            )
        for variant, overrides in family_variants(family).items():
            rows.append(
                BenchModel(
                    f"{family.name}:{variant}",
                    "family",
                    _family_builder(family, overrides),
                    family=family.name,
                    variant=variant,
                    overrides=overrides if callable(overrides) else dict(overrides),
                )
            )
    for key in hf_baselines:
        rows.append(BenchModel(f"hf:{key}", "hf", _hf_builder(key), global_first_token=key == "longformer"))
    if keep is not None:
        unknown = sorted(set(keep) - {row.name for row in rows})
        if unknown:
            raise ValueError(f"Unknown benchmark rows {unknown}; available: {[row.name for row in rows]}.")
        rows = [row for row in rows if row.name in keep]
    rows.sort(key=lambda row: (row.name != REFERENCE_MODEL, row.name != FLOOR_MODEL))
    return rows


def make_inputs(row: BenchModel, size: ModelSize, batch: int, length: int, device: str, seed: int) -> dict:
    """Identical random token ids (and an all-ones mask) for every model; Longformer also gets its global token."""
    generator = torch.Generator().manual_seed(seed + length)
    # Ids from 5 upwards avoid the special tokens (padding would change what some models compute).
    input_ids = torch.randint(5, size.vocab_size, (batch, length), generator=generator)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if row.global_first_token:
        global_mask = torch.zeros_like(input_ids)
        global_mask[:, 0] = 1
        inputs["global_attention_mask"] = global_mask
    return {name: tensor.to(device) for name, tensor in inputs.items()}
