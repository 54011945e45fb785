"""Operators ONNX defines as functions: a node whose operator has no builder in
:mod:`geon.frontends.onnx.ops` but a function in its schema (``Attention``,
``RotaryEmbedding``, ``SwiGLU``, ``LinearAttention``, the windows ...) is imported as the
nodes of that function, its values renamed apart and its attribute references bound to
the node's attributes."""

from geon.frontends.onnx.loading import InvalidOnnxModel, UnsupportedOnnxOp, onnx_module
from geon.frontends.onnx.structures import is_structure


#: How deep function bodies are expanded inside function bodies.
MAX_EXPANSION = 4


def function_body(node, domain, version, values):
    """The ``FunctionProto`` by which the ONNX schema of ``node``'s operator defines it at
    opset ``version`` (the latest function version not after it), or ``None``. An
    operator without a builder in ``OPS`` but with such a definition (``Attention``,
    ``RotaryEmbedding``, ``SwiGLU``, the windows ...) is imported as its body's nodes."""
    onnx = onnx_module()
    if not isinstance(node.op_type, str) or not isinstance(domain, str):
        return None   # (protobuf hands invalid UTF-8 over as bytes: no such schema)
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except (onnx.defs.SchemaError, TypeError, ValueError):
        return None
    plain = [v for v in schema.function_opset_versions if v <= version]
    contextual = [v for v in schema.context_dependent_function_opset_versions
                  if v <= version]
    if not plain and not contextual:
        return None
    full = onnx.NodeProto()
    full.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, a in schema.attributes.items():  # the defaults the body may refer to
        if name not in given and a.default_value.name:
            full.attribute.append(a.default_value)
    try:
        if plain and (not contextual or max(plain) >= max(contextual)):
            data = schema.get_function_with_opset_version(max(plain))
        else:
            types = []
            for name in node.input:
                t = onnx.TypeProto()
                if name:
                    v = values[name]
                    if is_structure(v):
                        return None
                    t = onnx.helper.make_tensor_type_proto(
                        onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
                types.append(t.SerializeToString())
            data = schema.get_context_dependent_function_with_opset_version(
                max(contextual), full.SerializeToString(), types)
    except Exception:  # noqa: BLE001 - onnx refuses this node's types: no expansion
        return None
    fn = onnx.FunctionProto()
    fn.ParseFromString(data)
    return fn if fn.node else None


def import_function(node, fn, values, opsets, state, depth, where, import_node):
    """Import ``node`` as the nodes of its operator's function ``fn``: the formal inputs
    and outputs are the node's own, the values inside get names of their own, and
    attribute references take the node's attributes (or the schema's defaults);
    ``import_node`` (the importer's) imports each of them."""
    onnx = onnx_module()
    prefix = f"{node.name or node.op_type}#{node.op_type}/{len(values)}/"
    rename = {f: a for f, a in zip(fn.input, node.input)}
    rename.update({f: "" for f in list(fn.input)[len(node.input):]})  # absent inputs
    rename.update({f: a for f, a in zip(fn.output, node.output) if a})
    attrs = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}
    domain = node.domain if node.domain != "ai.onnx" else ""
    schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)  # (it has one)
    for name, a in schema.attributes.items():
        if a.default_value.name:
            defaults.setdefault(name, a.default_value)
    inner_opsets = dict(opsets)
    for o in fn.opset_import:
        inner_opsets[o.domain if o.domain != "ai.onnx" else ""] = int(o.version)
    for n in fn.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = f"{node.name or node.op_type}/{n.name or n.op_type}"
        m.input[:] = [rename.get(x, prefix + x) if x else "" for x in n.input]
        m.output[:] = [rename.get(x, prefix + x) if x else "" for x in n.output]
        _bind_attributes(m, attrs, defaults, lambda x: rename.get(x, prefix + x), set())
        for x in m.input:
            if x and x not in values:
                raise InvalidOnnxModel(f"{where}: its ONNX function uses {x!r} before "
                                       f"making it")
        for x in m.output:
            if x.startswith(prefix) and x in values:
                raise InvalidOnnxModel(f"{where}: the model already has a value named "
                                       f"{x!r}, a name its ONNX function's expansion uses")
        try:
            import_node(m, values, inner_opsets, state, depth + 1)
        except (UnsupportedOnnxOp, InvalidOnnxModel) as e:
            err = type(e)(f"{where}, computed as its ONNX function: {e}")
            if hasattr(e, "value_name"):
                err.value_name = e.value_name
            raise err from None


def _bind_attributes(m, attrs, defaults, outer, local):
    """Node ``m`` of a function's expansion (in place): its attribute references take
    the calling node's attributes ``attrs`` (or ``defaults``); in its subgraphs (a
    Scan's body), the names not made there (``local``: those of the subgraphs around)
    are the function's values, renamed by ``outer``, and so are their attributes'."""
    onnx = onnx_module()
    given = []
    for a in m.attribute:  # (copies: the field is cleared next)
        given.append(onnx.AttributeProto())
        given[-1].CopyFrom(a)
    del m.attribute[:]
    for a in given:
        if a.ref_attr_name:
            src = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if src is None:
                continue
            b = onnx.AttributeProto()
            b.CopyFrom(src)
            b.name = a.name
            m.attribute.append(b)
            continue
        m.attribute.append(a)
        for g in ([m.attribute[-1].g] if a.type == onnx.AttributeProto.GRAPH else
                  m.attribute[-1].graphs if a.type == onnx.AttributeProto.GRAPHS else []):
            made = local | {v.name for v in g.input} | {t.name for t in g.initializer} \
                | {t.values.name for t in g.sparse_initializer} \
                | {x for n in g.node for x in n.output if x}
            for o in g.output:
                if o.name not in made:
                    raise UnsupportedOnnxOp(f"{m.name}: a subgraph output that is a value "
                                            f"of the enclosing function ({o.name!r})")
            for n in g.node:
                n.input[:] = [x if not x or x in made else outer(x) for x in n.input]
                _bind_attributes(n, attrs, defaults, outer, made)
