"""`dashinfer convert SRC OUT`: convert a Hugging Face directory or a GGUF file into the serialized
format ({OUT}/{name}.asgraph / .asparam / .tokenizer), to serve with `dashinfer serve OUT`."""
import os

from .common import CONFIG_ERROR, CliError, add_model_options


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face directory or a GGUF file",
                       description=__doc__.split("\n")[0])
    p.add_argument("src", help="a Hugging Face model directory or a .gguf file")
    p.add_argument("out", help="the directory to write the serialized model into")
    p.add_argument("--name", default=None, help="file name prefix (default: the source's name)")
    add_model_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import dashinfer_client as allspark
    from dashinfer_client.errors import ModelSerializerException
    src = os.path.normpath(args.src)
    if not os.path.exists(src):
        raise CliError(f"{args.src!r} does not exist", CONFIG_ERROR)
    gguf = os.path.isfile(src)
    name = args.name or os.path.splitext(os.path.basename(src))[0]
    cls = allspark.GGUFModel if gguf else allspark.HuggingFaceModel
    quant = None if args.quant is None else {"quant_method": "instant_quant", "weight_format": args.quant}
    try:
        loader = cls(src, name, user_set_data_type=args.dtype or "bfloat16")
        loader.load_model().read_model_config().serialize_to_path(
            None, args.out, enable_quant=quant is not None, weight_only_quant=True,
            customized_quant_config=quant)
        loader.free_model()
    except (ModelSerializerException, OSError, ValueError) as e:
        raise CliError(str(e), CONFIG_ERROR) from None
    print(f"{os.path.join(args.out, name)}.asgraph / .asparam / .tokenizer")
    return 0
