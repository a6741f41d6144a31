"""DashInfer 1.3 Engine/ClientEngine methods this runtime does not serve, refused with
ALLSPARK_INVALID_CALL_ERROR and a reason in last_error, the same on both engines: three have nothing
behind them in DashInfer 1.3 itself (get_model_config, reset_stream and save_model forward to calls
its binding lacks, raising NameError or AttributeError there); dump_build_meta_to_proto fills
DashInfer's protobuf graph, a format not written here. A mixin of EngineAPI, over its _guarded."""
from .refusals import Refused
from .types import AsStatus

INVALID_CALL = AsStatus.ALLSPARK_INVALID_CALL_ERROR


class UnservedAPI:
    def get_model_config(self, model_config=None) -> AsStatus:
        """Refused: DashInfer 1.3 declares it without an implementation. get_model_info(name)
        describes an installed model."""
        return self._unserved("get_model_config", "use get_model_info(model_name) for an installed model's "
                            "description, or the loader's read_model_config()")

    def reset_stream(self, model_name, **kwargs) -> AsStatus:
        """Refused: there are no device streams on CPU, and DashInfer 1.3's binding has none to reset."""
        return self._unserved("reset_stream", "this runtime has no device streams to reset (CPU)")

    def save_model(self, model_name, saved_dir, with_weight=True, is_text_graph=False) -> AsStatus:
        """Refused: an installed model's files are the ones serialize_to_path() wrote."""
        return self._unserved("save_model", "an installed model's files are the ones serialize_to_path() wrote "
                            "(.asgraph/.asparam): copy those")

    def dump_build_meta_to_proto(self, model_proto, weights_path, torch_build_param) -> AsStatus:
        """Refused: it fills DashInfer's protobuf graph, which this runtime does not write."""
        return self._unserved("dump_build_meta_to_proto", "this runtime writes no DashInfer protobuf graph; "
                            "a serialized model's build versions are read with get_file_information()")

    def _unserved(self, what, instead):
        def refuse():
            raise Refused(INVALID_CALL, f"not served by this runtime: {instead}")
        return self._guarded(what, refuse)[0]
