"""The model families this package knows: one table, read by every site that asks about one.

A :class:`Family` says, for one architecture, what the GGUF loader, the config reader, the CPU
decoder, the screened greedy head and the test model builder each need to know about it:

* its names: llama.cpp's ``general.architecture``, transformers' ``model_type`` (the text model's,
  e.g. ``gemma3_text``) and the class-name prefix of its modules (``Gemma3`` ->
  ``Gemma3TextModel`` ...);
* how llama.cpp's converter stored its tensors, so the loader can undo it on the blocks or the
  values: the per-head rotary row reorder of the q/k projections (Llama), norm weights stored
  as ``1 + w`` (Gemma's ``(1 + w)`` RMSNorm: transformers' ``Gemma2TensorProcessor`` subtracts
  the one). Fused tensors need no split where transformers' module is fused the same way:
  Phi-3's ``attn_qkv`` is ``qkv_proj`` (rows q, k, v) and its ``ffn_up``
  is ``gate_up_proj`` (rows gate, up), one quantized linear each;
* what runs it: which owned CPU model runs its steps (``owned_model``: ``"llama"`` for the
  Llama-style layer, ``engine.cpu.models.llama``; ``"gemma"`` for Gemma 2/3's,
  ``engine.cpu.models.gemma``), and whether its head is plain ``lm_head(hidden)`` (no logit
  soft-capping, ``plain_head``) -- where no owned model takes a model (another family, a
  rotary scaling it does not compute...) transformers' forward runs with our quantized linears
  over the file's blocks, and the runner says which in ``stats().weights["forward"]``
  (:data:`NATIVE_FORWARD` or :data:`TRANSFORMERS_FORWARD`);
* for the tiny test models, whether the head is tied (``tied_test_head``).

Pure data and lookups; nothing here imports torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

NATIVE_FORWARD = "native"
"""``stats().weights["forward"]`` where our owned CPU model runs the steps."""
TRANSFORMERS_FORWARD = "transformers"
"""``stats().weights["forward"]`` where transformers' forward (over our quantized linears and
paged attention) runs every step."""


@dataclass(frozen=True)
class Family:
    """What the package knows of one model family (module docstring).

    Attributes:
        name: llama.cpp's ``general.architecture`` of the family, our name of it too.
        model_type: transformers' ``model_type`` of the causal LM built from the file.
        class_prefix: Prefix of transformers' module classes (``"Qwen2"``: ``Qwen2Model``).
        text_model_class: transformers' decoder class (default ``<prefix>Model``).
        other_model_types: Further ``model_type`` values of the family (Mistral is a Llama in
            GGUF; transformers renames it from the file's name).
        owned_model: The owned CPU model of its layer (``"llama"``, ``"gemma"``; empty:
            transformers' forward runs it).
        plain_head: The causal LM's logits are ``lm_head(decoder(...))``, nothing else.
        rotary_rows_permuted: llama.cpp reordered its q/k rows per head for its rotary layout.
        norm_offset: GGUF stores each ``*norm.weight`` as transformers' value plus this.
        tied_test_head: The tiny test model of this family ties its head to the embedding.
    """

    name: str
    model_type: str
    class_prefix: str
    text_model_class: str = ""
    other_model_types: tuple[str, ...] = ()
    owned_model: str = ""
    plain_head: bool = True
    rotary_rows_permuted: bool = False
    norm_offset: float = 0.0
    tied_test_head: bool = True

    @property
    def gguf_architecture(self) -> str:
        """llama.cpp's ``general.architecture`` (:attr:`name`)."""
        return self.name

    @property
    def model_types(self) -> frozenset[str]:
        """Every transformers ``model_type`` of the family."""
        return frozenset({self.model_type, *self.other_model_types})

    @property
    def class_prefixes(self) -> frozenset[str]:
        """Prefixes of the family's transformers classes (``{"Llama", "Mistral"}``)."""
        return frozenset({self.class_prefix, *(t.capitalize() for t in self.other_model_types)})

    @property
    def decoder_classes(self) -> frozenset[str]:
        """transformers' decoder class names of the family (``LlamaModel``, ``MistralModel``)."""
        return frozenset({self.text_model_class or f"{p}Model" for p in self.class_prefixes})


FAMILIES: tuple[Family, ...] = (
    Family("qwen2", "qwen2", "Qwen2", owned_model="llama"),
    Family("llama", "llama", "Llama", other_model_types=("mistral",), owned_model="llama",
           rotary_rows_permuted=True, tied_test_head=False),
    Family("qwen3", "qwen3", "Qwen3", owned_model="llama"),
    Family("gemma2", "gemma2", "Gemma2", owned_model="gemma", plain_head=False,
           norm_offset=1.0),
    Family("gemma3", "gemma3_text", "Gemma3", text_model_class="Gemma3TextModel",
           owned_model="gemma", plain_head=False, norm_offset=1.0),
    Family("phi3", "phi3", "Phi3", owned_model="llama", tied_test_head=False),
)
"""Every family."""

_BY_ARCHITECTURE = {family.gguf_architecture: family for family in FAMILIES}
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}

GGUF_ARCHITECTURES = frozenset(_BY_ARCHITECTURE)
"""``general.architecture`` values whose blocks the GGUF loader runs."""


def owned_model_types(owner: str) -> frozenset[str]:
    """``model_type`` values whose steps the owned model ``owner`` (``"llama"``, ``"gemma"``)
    runs."""
    return frozenset(t for f in FAMILIES if f.owned_model == owner for t in f.model_types)


def owned_classes(owner: str, suffix: str = "Model") -> frozenset[str]:
    """transformers' class names ``<prefix><suffix>`` of the families ``owner`` runs:
    ``owned_classes("llama", "RMSNorm")`` is ``{"LlamaRMSNorm", "MistralRMSNorm",
    "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm"}``; the default suffix gives their decoder
    classes (Gemma 3's ``Gemma3TextModel``)."""
    if suffix == "Model":
        return frozenset(c for f in FAMILIES if f.owned_model == owner for c in f.decoder_classes)
    return frozenset(f"{p}{suffix}" for f in FAMILIES if f.owned_model == owner
                     for p in f.class_prefixes)

PLAIN_HEAD_MODEL_TYPES = frozenset(t for f in FAMILIES if f.plain_head for t in f.model_types)
"""``model_type`` values whose causal-LM forward is ``lm_head(decoder(...).last_hidden_state)``."""


def by_architecture(architecture: str) -> Family | None:
    """The family of a GGUF ``general.architecture``, or None."""
    return _BY_ARCHITECTURE.get(architecture)


def by_model_type(model_type: str | None) -> Family | None:
    """The family of a transformers ``model_type``, or None."""
    return _BY_MODEL_TYPE.get(model_type or "")
