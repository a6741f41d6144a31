"""`dashinfer convert SRC OUT`: convert a Hugging Face directory, a GGUF file or the default model
into the serialized format ({OUT}/{name}.asgraph, .asparam, .tokenizer), to serve with
`dashinfer serve OUT`. --quant quantizes the linear layers in the groups `dashinfer serve --quant`
uses (int8: 64, uint4: 32) unless --group-size says otherwise; without it a checkpoint quantized
as released keeps its width (a 4-bit AWQ release becomes uint4), --quant none gives floats."""
import os

from .common import CONFIG_ERROR, DEFAULT_NAMES, CliError, add_model_options, first_paragraph, terminated_cleanly


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face directory, a GGUF file or the default model",
                       description=first_paragraph(__doc__))
    p.add_argument("src", help=f"a Hugging Face model directory, a .gguf file, or {DEFAULT_NAMES[0]!r} "
                               "(the default model, fetched on first use)")
    p.add_argument("out", help="the directory to write the serialized model into")
    p.add_argument("--name", default=None, help="file name prefix (default: the source's name)")
    add_model_options(p)
    p.add_argument("--group-size", type=int, default=None,
                   help="with --quant: input channels per quantization group, -1 per channel "
                        "(default: int8 64, uint4 32, as dashinfer serve)")
    p.set_defaults(run=run)


def run(args) -> int:
    import dashinfer_client as allspark
    from dashinfer_client.errors import ModelSerializerException
    from dashinfer_client.model.quant import DEFAULT_GROUPS
    from dashinfer_client.model.hf import release_quant
    if args.group_size is not None and args.quant in (None, "none"):
        raise CliError("--group-size needs --quant int8 or --quant uint4", CONFIG_ERROR)
    src, name = _source(args.src)
    name = args.name or name
    fmt = release_quant(src) if args.quant is None and os.path.isdir(src) else args.quant
    quant = None if fmt in (None, "none") else {
        "quant_method": "instant_quant", "weight_format": fmt,
        "group_size": DEFAULT_GROUPS[fmt] if args.group_size is None else args.group_size}
    try:
        loader = (allspark.GGUFModel if os.path.isfile(src) else allspark.HuggingFaceModel)(
            src, name, user_set_data_type=args.dtype or "bfloat16")
        with terminated_cleanly():
            loader.load_model().read_model_config().serialize_to_path(
                None, args.out, enable_quant=quant is not None, weight_only_quant=True,
                customized_quant_config=quant)
        loader.free_model()
        model = allspark.DashInferModel(args.out, loader.safe_model_name)
    except (ModelSerializerException, OSError, ValueError) as e:
        raise CliError(str(e), CONFIG_ERROR) from None
    print(f"{os.path.join(args.out, loader.safe_model_name)}.asgraph / .asparam / .tokenizer: {_holds(model)}")
    return 0


def _source(given):
    """(path, default prefix) of SRC: the default model's GGUF (fetched once) for its names."""
    if given in DEFAULT_NAMES:
        from dashinfer_client import default_model
        from dashinfer_client.errors import ModelSerializerException
        try:
            return default_model.default_model_path(progress=True), default_model.MODEL_NAME
        except ModelSerializerException as e:
            raise CliError(str(e), CONFIG_ERROR) from None
    src = os.path.normpath(given)
    if not os.path.exists(src):
        raise CliError(f"{given!r} does not exist", CONFIG_ERROR)
    return src, os.path.splitext(os.path.basename(src))[0]


def _holds(model) -> str:
    """What the written model holds, read back from its .asgraph."""
    q = model.quantization
    if not q:
        return f"{model.dtype} weights"
    group = "per channel" if q["group_size"] == -1 else f"in groups of {q['group_size']}"
    return f"linear layers {q['weight_format']} {group}, the rest {model.dtype}"
