"""DashInfer's queries (get_as_engine_stat, get_model_info, ...), for both engines, over the one
primitive _introspect. A query refused (bad argument, unknown model, no server) returns DashInfer's
empty value (an empty str, 0, an AsEngineStat of zeros) and is recorded like any refused call:
last_error, the log, and EngineAPI.call_with_status for its AsStatus. A mixin of EngineAPI."""
from .introspection import AsEngineStat, AsFileInfo
from .refusals import PARAM_ERROR, SUCCESS, Refused, checked_model_name, text_or_empty
from .types import AsStatus


class QueryAPI:
    def get_as_engine_stat(self, model_name: str) -> AsEngineStat:
        """The model's KV pool, queues, token counts and throughput (AsEngineStat's docstring)."""
        stat = self._query("get_as_engine_stat", model_name)
        return AsEngineStat.from_dict(stat) if stat is not None else AsEngineStat(text_or_empty(model_name))

    def get_free_frame(self, model_name: str) -> int:
        """KV spans a new request can take: get_as_engine_stat's free_span (DashInfer's ClientEngine
        declares this method but its binding lacks the call, so there it raises AttributeError)."""
        return int(self._query("get_free_frame", model_name) or 0)

    def get_op_profiling_info(self, model_name: str) -> str:
        """The model's kernel timings (rank 0) as a table, when it was started with AS_PROFILE=ON in
        the serving process's environment; else "" (and a warning naming the variable), as
        DashInfer. dashinfer_server/op_profile.py says what is timed."""
        return self._query("get_op_profiling_info", model_name) or ""

    def get_model_info(self, model_name: str) -> str:
        """A description of the model: its type (DashInfer's first line, "Model Type : ..."),
        shape, weights, inputs and outputs, and how it is served."""
        return self._query("get_model_info", model_name) or ""

    def get_file_information(self, as_graph_path: str, as_param_path: str) -> AsFileInfo:
        """The versions that wrote a serialized model's two files, and this engine's (AsFileInfo).
        Read where the model is served (a ClientEngine asks its server). Unreadable files:
        ALLSPARK_IO_ERROR; files of another format: ALLSPARK_PARAM_ERROR."""
        def ask():
            for what, path in (("as_graph_path", as_graph_path), ("as_param_path", as_param_path)):
                if not isinstance(path, str):
                    raise Refused(PARAM_ERROR, f"{what} is a str, got {type(path).__name__}")
            return self._introspect("get_file_information", as_graph_path, as_param_path)
        status, info = self._guarded("get_file_information", ask)
        return AsFileInfo.from_dict(info) if status == SUCCESS else AsFileInfo()

    def get_version_full(self) -> str:
        """The serving engine's version, "<version>/(GitSha1:<commit>)" as DashInfer prints it."""
        return self._query("get_version_full") or ""

    def get_rank_id(self) -> int:
        """The tensor-parallel rank answering the calls: 0 (rank 0 serves the API; the other ranks
        only run the steps it hands them)."""
        return self._query("get_rank_id") or 0

    def is_allspark_work_as_service(self) -> bool:
        """True when the models are served by another process (ClientEngine), False in-process."""
        return bool(self._query("is_allspark_work_as_service"))

    def unload_device_mem(self, model_name: str) -> AsStatus:
        """DashInfer moves a model's weights out of GPU memory; its CPU ClientEngine does nothing.
        Here too: ALLSPARK_SUCCESS for an installed model, nothing moves."""
        return self._guarded("unload_device_mem", lambda: self._introspect(
            "unload_device_mem", checked_model_name(model_name)))[0]

    def load_device_mem(self, model_name: str) -> AsStatus:
        """The pair of unload_device_mem: nothing to load back on CPU."""
        return self._guarded("load_device_mem", lambda: self._introspect(
            "load_device_mem", checked_model_name(model_name)))[0]

    def _query(self, what, *args):
        """_introspect(what, *args) with the model name (if any) checked; None when refused."""
        def ask():
            checked = (checked_model_name(args[0]), *args[1:]) if args else ()
            return self._introspect(what, *checked)
        return self._guarded(what, ask)[1]

    def _introspect(self, what: str, *args):
        """The answer to DashInfer query `what` (a public method's name) with checked arguments, as
        JSON-able data (AsEngineStat.to_dict() for get_as_engine_stat); refuses with Refused."""
        raise NotImplementedError
